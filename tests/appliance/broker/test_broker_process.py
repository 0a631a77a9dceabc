"""The broker as a process of a running appliance: killed and restarted by the supervisor without losing
anything, and following topics deleted and created again through another path (the control socket)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from support.kafka_appliance import Appliance, start_appliance, stop_appliance
from support.wire import WireClient, answers, produce, values_in

from appliance.broker.handlers import PERIODIC_REFRESH_MS
from ipc.control import ControlClient
from ipc.kafka import ApiKey, ApiVersionsRequest, ErrorCode, MetadataRequest, MetadataRequestTopic
from storage.batch_builder import build_batch


@pytest.fixture
def appliance(tmp_path: os.PathLike[str]) -> Iterator[Appliance]:
    from pathlib import Path

    running = start_appliance(Path(tmp_path), {"life": 1})
    try:
        yield running
    finally:
        stop_appliance(running)


def broker_pid(appliance: Appliance) -> int:
    """The pid of the supervisor's child titled "appliance: broker"."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().rstrip(b"\0").decode(errors="replace")
        except OSError:
            continue
        if parent == appliance.process.pid and title == "appliance: broker":
            return int(pid)
    raise AssertionError("no broker child")


def connect(appliance: Appliance, timeout_s: float = 20) -> WireClient:
    """A client, once the broker accepts connections again."""
    host, port = appliance.bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = WireClient((host, int(port)))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            client.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        except OSError:  # accepted into the backlog of a listener that was going away: reset, try again
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        return client


def test_a_killed_broker_is_restarted_and_loses_nothing_acknowledged(appliance: Appliance) -> None:
    wire = connect(appliance)
    acked = []
    for i in range(20):
        response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("life", 0, build_batch([b"before-%d" % i]))))
        assert answers(response)[("life", 0)] == (0, i)
        acked.append(b"before-%d" % i)
    first = broker_pid(appliance)
    os.kill(first, signal.SIGKILL)
    assert wire.is_closed_by_peer(5)
    wire.close()
    wire = connect(appliance)
    assert broker_pid(appliance) != first
    response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("life", 0, build_batch([b"after"]))))
    assert answers(response)[("life", 0)] == (0, 20)
    assert values_in(wire, "life", 0) == [*acked, b"after"]
    wire.close()
    assert "broker" in appliance.log_text()


def test_the_broker_follows_topics_deleted_and_created_elsewhere(appliance: Appliance) -> None:
    wire = connect(appliance)
    assert answers(wire.call(ApiKey.PRODUCE, 8, produce(1, ("life", 0, build_batch([b"old"])))))[
        ("life", 0)
    ] == (0, 0)
    with ControlClient.connect(appliance.data_dir / ".appliance.sock") as control:
        control.delete_topic("life")
        deadline = time.monotonic() + 5
        while True:  # the broker learns of it within its periodic refresh
            response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("life", 0, build_batch([b"lost"]))))
            if answers(response)[("life", 0)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                break
            assert time.monotonic() < deadline, answers(response)
            time.sleep(0.1)
        control.create_topic("life", 1)
    deadline = time.monotonic() + 5
    while True:
        response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("life", 0, build_batch([b"new"]))))
        if answers(response)[("life", 0)][0] == ErrorCode.NONE:
            break
        assert time.monotonic() < deadline, answers(response)
        time.sleep(0.1)
    assert answers(response)[("life", 0)] == (0, 0)  # a new log, through a new ring
    assert values_in(wire, "life", 0) == [b"new"]
    wire.close()


@pytest.mark.parametrize("asked", ["by name", "every topic"])
def test_metadata_lists_a_topic_created_elsewhere_when_the_periodic_refresh_is_due(
    appliance: Appliance, asked: str
) -> None:
    """The turn that reads a Metadata request sends the periodic refresh first (it is due: no request for
    longer than its period); the Metadata must not take the table for fresh while that answer is on its
    way: the table is as old as the list it holds was when asked, and a topic created a moment before
    through another path is in the answer (kcat, ``appliance topics list`` after ``--data-dir`` create)."""
    wire = connect(appliance)
    wire.call(ApiKey.METADATA, 4, MetadataRequest(topics=None))  # the table is fresh now
    name = f"elsewhere-{asked.replace(' ', '-')}"
    with ControlClient.connect(appliance.data_dir / ".appliance.sock") as control:
        control.create_topic(name, 2)
    time.sleep(PERIODIC_REFRESH_MS / 1000 + 0.3)  # no request meanwhile: the periodic refresh is due
    topics = None if asked == "every topic" else [MetadataRequestTopic(name)]
    response = wire.call(ApiKey.METADATA, 4, MetadataRequest(topics=topics, allow_auto_topic_creation=False))
    listed = {t.name: (t.error_code, len(t.partitions)) for t in response.topics}
    assert listed.get(name) == (ErrorCode.NONE, 2), listed
    wire.close()
