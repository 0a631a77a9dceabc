"""The broker's loop while the supervisor is slow to answer a control call.

A real ``appliance serve`` with the supervisor's slow-reply test seams (``appliance.server.faults``): the
reply to the first ring attach (``attach.slow``) and to the creation of ``__consumer_offsets``
(``create.slow_reply``; ``create.slow`` keeps the topic's partitions, whose start is the creation's second
answer, from starting before) is held in the supervisor's loop.  The request that needs it waits (or is
answered with Kafka's retriable error); a client on another connection must be served meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient, answers, produce

from ipc.kafka import ApiKey, ApiVersionsRequest, ErrorCode, FindCoordinatorRequest
from storage.batch_builder import build_batch

HELD_MS = 4000  # below the broker's control-call timeout (5 s): the attach succeeds, late
HELD = "test fault point attach.slow: the reply to"
REPLIED = "test fault point: replying to attach"
CREATE_HELD = "test fault point create.slow_reply: the reply to create_topic"
CREATE_REPLIED = "test fault point: replying to create_topic"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    tmp = Path(tmp_path_factory.mktemp("stall"))
    yield from served_appliance(tmp, {"slow": 1}, '"offsets.topic.num.partitions" = 2\n'
                               f'"appliance.test.faults" = ["attach.slow:{HELD_MS}", '
                               f'"create.slow_reply:{HELD_MS}", "create.slow:{HELD_MS + 1000}"]')


def _client(appliance: Appliance) -> WireClient:
    host, port = appliance.bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)), timeout_s=30)


def _wait_for(appliance: Appliance, text: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in appliance.log_text():
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{appliance.log_text()}"
        time.sleep(0.02)


@pytest.mark.xfail(strict=True, reason="the broker's ring attach is a blocking control call: its loop waits "
                   "for the supervisor's reply (CONTROL_TIMEOUT_S at most) and serves no other connection")
def test_other_connections_are_served_while_a_ring_attach_waits(appliance: Appliance) -> None:
    producer, other = _client(appliance), _client(appliance)
    try:
        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))  # connected and served
        producer.send(ApiKey.PRODUCE, 8, produce(1, ("slow", 0, build_batch([b"first"]))))
        _wait_for(appliance, HELD)  # the broker asked for the ring; the supervisor holds the answer

        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        served_before_reply = REPLIED not in appliance.log_text()

        _, response = producer.recv(ApiKey.PRODUCE, 8)
        assert answers(response)[("slow", 0)] == (ErrorCode.NONE, 0)  # held, then appended
        assert served_before_reply, "ApiVersions on another connection waited for the supervisor's reply"
    finally:
        producer.close()
        other.close()


def test_other_connections_are_served_while_the_offsets_topic_is_created(appliance: Appliance) -> None:
    member, other = _client(appliance), _client(appliance)
    try:
        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        member.send(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key="stall", key_type=0))
        _wait_for(appliance, CREATE_HELD)  # the group's first request had the broker create the topic

        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        served_before_reply = CREATE_REPLIED not in appliance.log_text()
        _, found = member.recv(ApiKey.FIND_COORDINATOR, 2)
        assert found.error_code in (ErrorCode.NONE, ErrorCode.COORDINATOR_NOT_AVAILABLE)  # retriable
        deadline = time.monotonic() + 30
        while found.error_code != ErrorCode.NONE:  # as a client retries: the coordinator once recorded
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
            found = member.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key="stall", key_type=0))
        assert served_before_reply, "ApiVersions on another connection waited for the supervisor's reply"
        _wait_for(appliance, "created topic __consumer_offsets")  # its partitions started
    finally:
        member.close()
        other.close()
