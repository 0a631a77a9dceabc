"""The cleaner as a process of ``appliance serve``: a compacted topic produced to with confluent-kafka
gets its closed segments rewritten (each key's latest value at its original offset, tombstones gone after
``delete.retention.ms``; the cleaner at ``appliance.cleaner.nice``, its I/O best-effort at the lowest level),
the cleaner sleeping
``log.cleaner.backoff.ms`` (ten minutes here) wakes when the topic's settings are altered, and
``log.cleaner.enable=false`` runs no cleaner and keeps every record."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harness import Appliance, _title
from support.kafka_appliance import free_port

from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

TOPIC = "compacted"
KEYS = 40
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "0"}
Latest = dict[bytes, tuple[int, bytes | None]]  # key -> (offset, value) of its last record
_SYS_IOPRIO_GET = 252  # x86-64 Linux
_IOPRIO_CLASS_BEST_EFFORT = 2
_IOPRIO_LOWEST_LEVEL = 7


def _io_priority(pid: int) -> tuple[int, int]:
    """The I/O scheduling class and level of process ``pid`` (``ioprio_get``; what ``ionice -p`` prints)."""
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(_SYS_IOPRIO_GET, 1, pid)  # IOPRIO_WHO_PROCESS
    assert value >= 0, os.strerror(ctypes.get_errno())
    return int(value) >> 13, int(value) & 0xFF


class Running:
    """An appliance on a fixed port; its Kafka bootstrap address."""

    def __init__(self, cwd: Path | None, *overrides: str) -> None:
        self.port = free_port()
        self.app = Appliance(cwd, f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                             "log.cleaner.backoff.ms=600000", *overrides)  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def create(self, name: str, configs: dict[str, str]) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)

    def alter(self, name: str, configs: dict[str, str]) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
        resource = ConfigResource("topic", name, incremental_configs=entries)
        admin.incremental_alter_configs([resource])[resource].result(30)

    def produce(self, rounds: range, *, tombstones: range = range(0)) -> Latest:
        """Every key of ``rounds`` rounds (then the ``tombstones`` keys deleted); key -> (offset, value) of
        its last record as acknowledged."""
        latest: Latest = {}
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                             "batch.size": 1500, "enable.idempotence": True})

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            latest[msg.key()] = (msg.offset(), msg.value())

        for r in rounds:
            for k in range(KEYS):
                value = b"v%04d-" % r + b"x" * 90
                producer.produce(TOPIC, key=b"k%03d" % k, value=value, on_delivery=delivered)
            producer.poll(0)
        for k in tombstones:
            producer.produce(TOPIC, key=b"k%03d" % k, value=None, on_delivery=delivered)
        assert producer.flush(30) == 0
        return latest

    def records(self, topic: str = TOPIC) -> list[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every record from the start, as a Kafka consumer reads them."""
        consumer = confluent_kafka.Consumer({"bootstrap.servers": self.bootstrap,
                                             "group.id": f"g{time.monotonic_ns()}",
                                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
            _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10)
            out: list[tuple[int, bytes | None, bytes | None]] = []
            deadline = time.monotonic() + 30
            while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    out.append((msg.offset(), msg.key(), msg.value()))
            return out
        finally:
            consumer.close()


def _segments(app: Appliance, topic: str) -> list[str]:
    return sorted(p.name for p in (app.data / f"{topic}-0").glob("*.log"))


def _wait(condition: Any, what: str, app: Appliance, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s} s; log:\n{app.log()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    server = Running(None)
    server.app.start()
    try:
        yield server
        assert server.app.stop() == 0, server.app.log()
        assert "Traceback" not in server.app.log(), server.app.log()
    finally:
        server.app.close()


def _check_latest(records: list[tuple[int, bytes | None, bytes | None]],
                  oracle: Latest) -> None:
    """Reading from the start gives each key's latest value at its original offset."""
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        assert key is not None
        last[key] = (offset, value)
    live = {k: v for k, v in oracle.items() if v[1] is not None}
    assert {k: v for k, v in last.items() if v[1] is not None} == live


def test_a_compacted_topic_is_cleaned_by_the_cleaner_process(running: Running) -> None:
    app = running.app
    # a child forked a moment ago may still carry the supervisor's title: wait for the cleaner's, then for
    # the default appliance.cleaner.nice (CPU and reads and writes after the writers' and the broker's), which
    # the child sets as it starts, just after its title
    _wait(lambda: "appliance: cleaner" in [_title(pid) for pid in app.children()], "the cleaner process", app,
          10.0)
    cleaner = next(pid for pid in app.children() if _title(pid) == "appliance: cleaner")
    _wait(lambda: (os.getpriority(os.PRIO_PROCESS, cleaner), _io_priority(cleaner))
          == (10, (_IOPRIO_CLASS_BEST_EFFORT, _IOPRIO_LOWEST_LEVEL)), "the cleaner's priorities", app, 10.0)
    running.create(TOPIC, COMPACT)  # the cleaner wakes for it, finds nothing to clean and sleeps 10 min
    oracle = running.produce(range(30), tombstones=range(5))
    produced = max(offset for offset, _ in oracle.values()) + 1
    time.sleep(1.0)
    assert "cleaned offsets" not in app.log()
    running.alter(TOPIC, {"min.cleanable.dirty.ratio": "0.02"})  # wakes it
    _wait(lambda: "cleaner: compacted-0 cleaned offsets" in app.log(), "a clean", app)
    _wait(lambda: len(running.records()) < produced / 2, "records dropped", app)
    records = running.records()
    _check_latest(records, oracle)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets))  # kept in order, never renumbered: gaps appear
    # the tombstones were kept by the first clean (their horizon: now + delete.retention.ms 0); more data,
    # another clean, and they are gone
    oracle.update(running.produce(range(30, 60)))
    running.alter(TOPIC, {"min.cleanable.dirty.ratio": "0.01"})
    _wait(lambda: app.log().count("cleaner: compacted-0 cleaned offsets") >= 2, "a second clean", app)

    def tombstones_gone() -> bool:
        keys = {key for _, key, value in running.records() if value is None}
        return not keys & {b"k%03d" % k for k in range(5)}

    _wait(tombstones_gone, "tombstones dropped", app)
    _check_latest(running.records(), oracle)
    with LogReader(str(app.data / f"{TOPIC}-0")) as reader:  # the files themselves: whole, valid batches
        assert sum(1 for _ in reader.batches()) > 0


def test_with_the_cleaner_disabled_nothing_is_cleaned(tmp_path: Path) -> None:
    server = Running(tmp_path, "log.cleaner.enable=false")
    server.app.start()
    try:
        assert "appliance: cleaner" not in [_title(pid) for pid in server.app.children()]
        server.create(TOPIC, COMPACT)
        oracle = server.produce(range(20))
        produced = max(offset for offset, _ in oracle.values()) + 1
        time.sleep(1.5)  # several backoffs of a cleaner, were one running
        records = server.records()
        assert [r[0] for r in records] == list(range(produced))
        assert "cleaned offsets" not in server.app.log()
        assert server.app.stop() == 0
    finally:
        server.app.close()
