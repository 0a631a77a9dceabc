"""Fetch while a clean swaps segments: never a byte of a half-swapped directory, no error, no disconnect.

A child process owns the partition's log (the writer's part): it appends keyed batches over many small
segments, then cleans with a SIGKILL armed at a fault point of the swap (``storage.clean_faults``), which
leaves the directory half swapped, as a crash would, for as long as the test needs.  The broker (forked,
with a fixed topic list and a state page the test publishes) serves a wire client and a confluent-kafka
consumer meanwhile: they get answers without records and without errors, on the same connection, and after
``Log.open`` has finished or undone the swap they read the whole log as it then is.  DescribeLogDirs'
size counts the log as it is at each step: the same mid-swap as after recovery.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from support.wire import WireClient, start_broker

from appliance.broker.log_dirs import partition_size_bytes
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import config_from_mapping
from ipc.kafka import ApiKey, ErrorCode, FetchPartition, FetchRequest, FetchTopic
from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.batch_reader import iter_batches, iter_records
from storage.clean_faults import CLEAN_FAULTS
from storage.cleaner import clean_log
from storage.log import Log
from storage.log_config import LogConfig

TOPIC = "swapping"
CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=256)
BATCHES = 120
ROOT = Path(__file__).resolve().parents[3]


def _child(directory: str, kill_at: str) -> None:
    """Write the log, say how far it goes, wait for a line, then clean with a SIGKILL at ``kill_at``."""
    with Log.open(directory, CONFIG, topic_partition=(TOPIC, 0)) as log:
        for j in range(BATCHES):
            # one key of its own (every cleaned segment keeps records), two that later batches supersede
            keys = [b"u%d" % j, *(b"k%d" % ((j * 7 + r) % 20) for r in range(2))]
            log.append(build_batch([b"v%d-%d" % (j, r) for r in range(3)], keys), leader_epoch=0)
        log.roll()
        log.flush()
        print(log.log_end_offset, flush=True)
        sys.stdin.readline()
        CLEAN_FAULTS.arm(kill_at, "kill")
        clean_log(log, upper_bound=log.log_end_offset)
    print("clean finished without reaching the fault point", flush=True)


def _records(data: bytes, from_offset: int = 0) -> tuple[list[tuple[int, bytes | None]], int]:
    """The records at or after ``from_offset`` in fetched bytes, and the offset after their last batch (a
    clean leaves gaps: a batch may end past its last record)."""
    records: list[tuple[int, bytes | None]] = []
    next_offset = from_offset
    for position, header in iter_batches(data):
        records += [(r.offset, r.key) for r in iter_records(data, position) if r.offset >= from_offset]
        next_offset = header.last_offset + 1
    return records, next_offset


def _fetch(wire: WireClient, offset: int = 0) -> Any:
    request = FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=50 << 20, isolation_level=0,
                           topics=[FetchTopic(TOPIC, [FetchPartition(0, fetch_offset=offset,
                                                                     partition_max_bytes=50 << 20)])])
    response = wire.call(ApiKey.FETCH, 11, request)
    return response.responses[0].partitions[0]


def _read_all(wire: WireClient, end: int) -> list[tuple[int, bytes | None]]:
    records: list[tuple[int, bytes | None]] = []
    offset = 0
    while offset < end:
        part = _fetch(wire, offset)
        assert part.error_code == ErrorCode.NONE
        found, next_offset = _records(bytes(part.records or b""), offset)
        if next_offset == offset:
            break
        records += found
        offset = next_offset
    return records


@pytest.fixture
def half_swapped(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The child's log, a state page publishing its end, and a broker serving it (the swap not begun yet)."""
    log_dir = tmp_path / "data"
    directory = log_dir / f"{TOPIC}-0"
    log_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (ROOT, ROOT / "tests")))
    child = subprocess.Popen([sys.executable, __file__, str(directory), request.param], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, cwd=ROOT)
    assert child.stdout is not None and child.stdin is not None
    end = int(child.stdout.readline())
    config = config_from_mapping({"log.dirs": [str(log_dir)], "listeners": "PLAINTEXT://127.0.0.1:0"})
    name = ShmNames.for_data_dir(str(log_dir)).state_page(TOPIC, 0)
    unlink_shared_memory(name)
    page = StatePage.create(name)
    page.set_leader_epoch(0, 0)
    page.log_end_offset = page.high_watermark = end
    broker, addresses = start_broker(config, {TOPIC: TopicMeta(TOPIC, 1)}, str(tmp_path / "b.log"))
    wire: WireClient | None = None
    try:
        host, port = addresses["PLAINTEXT"]
        wire = WireClient((host, port))
        yield {"child": child, "end": end, "directory": directory, "bootstrap": f"{host}:{port}",
               "wire": wire, "broker_log": tmp_path / "b.log"}
    finally:
        if wire is not None:
            wire.close()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stdin.close()
        broker.terminate()
        broker.join(10)
        page.close()
        page.unlink()


def _swap_until_killed(state: dict[str, Any]) -> None:
    child = state["child"]
    child.stdin.write(b"go\n")
    child.stdin.flush()
    assert child.wait(timeout=60) == -signal.SIGKILL, child.stdout.read()
    assert [n for n in os.listdir(state["directory"]) if n.endswith((".deleted", ".swap"))]


@pytest.mark.parametrize("half_swapped", ["clean.deleted", "clean.swap"], indirect=True)
def test_a_fetch_during_a_half_done_swap_is_empty_then_whole(half_swapped: dict[str, Any]) -> None:
    wire, end = half_swapped["wire"], half_swapped["end"]
    before = _read_all(wire, end)
    assert [offset for offset, _ in before] == list(range(end))
    _swap_until_killed(half_swapped)
    for _ in range(3):  # empty, no error, and the connection stays usable
        part = _fetch(wire)
        assert (part.error_code, part.high_watermark) == (ErrorCode.NONE, end)
        assert bytes(part.records or b"") == b"", Path(half_swapped["broker_log"]).read_text()
    with Log.open(half_swapped["directory"], CONFIG) as log:  # the writer's restart finishes or undoes it
        expected = [(r.offset, r.key) for batch in log.batches() for r in iter_records(batch)]
    assert _read_all(wire, end) == expected
    assert {key for _, key in expected} == {key for _, key in before}


@pytest.mark.parametrize("half_swapped", ["clean.swap"], indirect=True)
def test_a_consumer_sees_no_error_during_a_swap_and_every_key_after(half_swapped: dict[str, Any]) -> None:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": half_swapped["bootstrap"], "group.id": "swap",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        _swap_until_killed(half_swapped)
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            assert message is None, message.error() if message is not None else None
        with Log.open(half_swapped["directory"], CONFIG) as log:
            expected = [(r.offset, r.key) for batch in log.batches() for r in iter_records(batch)]
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(got) < len(expected) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.offset(), message.key()))
        assert got == expected
    finally:
        consumer.close()


@pytest.mark.parametrize("half_swapped", ["clean.deleted", "clean.indexes", "clean.swap", "clean.unlinked"],
                         indirect=True)
def test_the_log_dir_size_mid_swap_is_the_size_after_recovery(half_swapped: dict[str, Any]) -> None:
    _swap_until_killed(half_swapped)
    mid_swap = partition_size_bytes(str(half_swapped["directory"]))
    Log.open(half_swapped["directory"], CONFIG).close()
    assert mid_swap == partition_size_bytes(str(half_swapped["directory"]))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
