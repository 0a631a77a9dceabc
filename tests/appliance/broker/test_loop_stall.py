"""The broker's loop while the supervisor is slow to answer a control call.

A real ``appliance serve`` with the supervisor's slow-reply test seams (``appliance.server.faults``): the
replies to the first three ring attaches (``attach.slow``, one delay each, in the order of the tests) and to
the creation of ``__consumer_offsets``
(``create.slow_reply``; ``create.slow`` keeps the topic's partitions, whose start is the creation's second
answer, from starting before) is held in the supervisor's loop.  The request that needs it waits (or is
answered with Kafka's retriable error); a client on another connection must be served meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient, answers, produce

from ipc.kafka import ApiKey, ApiVersionsRequest, ErrorCode, FindCoordinatorRequest
from ipc.shm import ShmNames
from storage.batch_builder import build_batch

HELD_MS = 4000  # the creation of __consumer_offsets: answered late
ATTACH_HELD_MS = 2500  # the first attach: well below the broker's control timeout (5 s), so it succeeds, late
ORDERED_HELD_MS = 1500  # the second attach (test_requests_on_one_connection_are_answered_in_order)
LATE_HELD_MS = 3000  # the third: beyond its Produce's timeout (1 s), within the control timeout
HELD = "test fault point attach.slow: the reply to"
REPLIED = "test fault point: replying to attach"
CREATE_HELD = "test fault point create.slow_reply: the reply to create_topic"
CREATE_REPLIED = "test fault point: replying to create_topic"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    tmp = Path(tmp_path_factory.mktemp("stall"))
    yield from served_appliance(tmp, {"slow": 1, "ordered": 1, "latering": 1},
                                '"offsets.topic.num.partitions" = 2\n'
                                f'"appliance.test.faults" = ["attach.slow:{ATTACH_HELD_MS}", '
                                f'"attach.slow:{ORDERED_HELD_MS}", "attach.slow:{LATE_HELD_MS}", '
                                f'"create.slow_reply:{HELD_MS}", "create.slow:{HELD_MS + 1000}"]')


def _client(appliance: Appliance) -> WireClient:
    host, port = appliance.bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)), timeout_s=30)


def _wait_for(appliance: Appliance, text: str, timeout_s: float = 20, count: int = 1) -> None:
    deadline = time.monotonic() + timeout_s
    while appliance.log_text().count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{appliance.log_text()}"
        time.sleep(0.02)


def test_other_connections_are_served_while_a_ring_attach_waits(appliance: Appliance) -> None:
    producer, other = _client(appliance), _client(appliance)
    try:
        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))  # connected and served
        producer.send(ApiKey.PRODUCE, 8, produce(1, ("slow", 0, build_batch([b"first"]))))
        _wait_for(appliance, HELD)  # the broker asked for the ring; the supervisor holds the answer

        other.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        served_before_reply = REPLIED not in appliance.log_text()

        _, response = producer.recv(ApiKey.PRODUCE, 8)
        assert answers(response)[("slow", 0)] == (ErrorCode.NONE, 0), appliance.log_text()  # held, appended
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


def test_requests_on_one_connection_are_answered_in_order(appliance: Appliance) -> None:
    client = _client(appliance)
    try:
        first = client.send(ApiKey.PRODUCE, 8, produce(1, ("ordered", 0, build_batch([b"a"]))))
        _wait_for(appliance, HELD, count=2)  # its ring is being attached; the supervisor holds the answer
        versions = client.send(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        second = client.send(ApiKey.PRODUCE, 8, produce(1, ("ordered", 0, build_batch([b"b"]))))

        first_id, first_answer = client.recv(ApiKey.PRODUCE, 8)
        versions_id, _ = client.recv(ApiKey.API_VERSIONS, 3)
        second_id, second_answer = client.recv(ApiKey.PRODUCE, 8)
        assert (first_id, versions_id, second_id) == (first, versions, second)  # in request order
        assert answers(first_answer)[("ordered", 0)] == (ErrorCode.NONE, 0)
        assert answers(second_answer)[("ordered", 0)] == (ErrorCode.NONE, 1)  # appended after the first
    finally:
        client.close()


def _rings_of(appliance: Appliance, topic: str, partition: int) -> list[str]:
    """The shared-memory objects of the rings into ``topic``-``partition`` (/dev/shm)."""
    prefix = ShmNames.for_data_dir(appliance.data_dir).prefix.lstrip("/") + f"ring-{topic}-{partition}-"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def test_a_ring_attached_after_its_produce_timed_out_is_detached(appliance: Appliance) -> None:
    producer = _client(appliance)
    try:
        late = dataclasses.replace(produce(1, ("latering", 0, build_batch([b"late"]))), timeout_ms=1000)
        producer.send(ApiKey.PRODUCE, 8, late)
        _wait_for(appliance, HELD, count=3)
        assert _rings_of(appliance, "latering", 0), "the supervisor attached the ring at once"
        _, response = producer.recv(ApiKey.PRODUCE, 8)  # before the supervisor's answer: timed out
        assert answers(response)[("latering", 0)] == (ErrorCode.REQUEST_TIMED_OUT, -1)

        _wait_for(appliance, REPLIED, count=3)  # the late answer came: the broker lets the ring go
        deadline = time.monotonic() + 10
        while _rings_of(appliance, "latering", 0):
            assert time.monotonic() < deadline, f"ring left attached: {_rings_of(appliance, 'latering', 0)}"
            time.sleep(0.05)

        retried = producer.call(ApiKey.PRODUCE, 8, produce(1, ("latering", 0, build_batch([b"again"]))))
        assert answers(retried)[("latering", 0)] == (ErrorCode.NONE, 0)  # the timed-out one was not appended
    finally:
        producer.close()
