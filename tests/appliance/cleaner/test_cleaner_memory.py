"""The cleaner process's memory stays within ``log.cleaner.dedupe.buffer.size``: its anonymous resident
memory (``RssAnon`` in ``/proc/PID/status``: the heap and numpy's arrays, not the page cache of the segment
files it maps), sampled while it cleans a topic in several passes because the keys do not fit the buffer
at once, grows over its idle value by at most the buffer plus :data:`ALLOWANCE_BYTES`.

The allowance is the pass's fixed buffers (``storage.cleaner``: the output buffered up to 4 MiB before a
write and its numba twin, the batch positions kept from the map pass up to 4 MiB, the record marks of
16,384 records) and the interpreter's own slack; the idle value is read after a first pass, when numba's
compiled kernels are loaded."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from support.harness import Appliance, _title
from support.kafka_appliance import free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

MIB: Final = 1 << 20
BUFFER_BYTES: Final = 2 * MIB  # log.cleaner.dedupe.buffer.size: about 46,000 keys a pass
ALLOWANCE_BYTES: Final = 16 * MIB
TOPIC = "compacted"
KEYS_PER_HALF: Final = 40_000  # the first half of the records has these keys, the second half others
RECORDS_PER_HALF: Final = 80_000


def _rss_anon_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


class PeakSampler:
    """The largest ``RssAnon`` of a process, read every 2 ms on a thread until :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = _rss_anon_bytes(pid)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(0.002):
            self.peak = max(self.peak, _rss_anon_bytes(self.pid))

    def stop(self) -> int:
        self._stopped.set()
        self._thread.join()
        return self.peak


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[Appliance, str]]:
    port = free_port()
    server = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", "log.cleaner.backoff.ms=100",
                       f"log.cleaner.dedupe.buffer.size={BUFFER_BYTES}")  # fmt: skip
    try:
        server.start()
        yield server, f"127.0.0.1:{port}"
        assert server.stop() == 0, server.log()
    finally:
        server.close()


def _produce(bootstrap: str, records: range) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "batch.size": 64 * 1024, "acks": 1})
    for i in records:
        key = b"k%06d" % (i % KEYS_PER_HALF + (KEYS_PER_HALF if i >= RECORDS_PER_HALF else 0))
        value = b"v%08d-" % i + b"x" * 90
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value)
                break
            except BufferError:  # librdkafka's queue is full: the broker is behind (a loaded machine)
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def _cleans(server: Appliance) -> list[str]:
    return [line for line in server.log().splitlines() if f"cleaner: {TOPIC}-0 cleaned offsets" in line]


def _wait(condition: object, what: str, server: Appliance, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s} s; log:\n{server.log()}"
        time.sleep(0.1)


def test_anonymous_memory_of_a_split_clean_stays_within_the_dedupe_buffer(
        app: tuple[Appliance, str]) -> None:  # fmt: skip
    server, bootstrap = app
    cleaners: list[int] = []

    def cleaner_started() -> bool:  # the supervisor starts its cleaner child after it reports ready
        cleaners[:] = [pid for pid in server.children() if _title(pid) == "appliance: cleaner"]
        return bool(cleaners)

    _wait(cleaner_started, "the cleaner process", server, timeout_s=30)
    cleaner = cleaners[0]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": str(MIB), "min.cleanable.dirty.ratio": "0.01"})])[
        TOPIC].result(30)
    _produce(bootstrap, range(20_000))  # a first clean: the cleaner's kernels loaded, its idle value after
    _wait(lambda: _cleans(server), "a first clean", server)
    time.sleep(0.5)
    idle = _rss_anon_bytes(cleaner)
    os.kill(cleaner, signal.SIGSTOP)  # all of it dirty before the next pass: more keys than the buffer holds
    try:
        _produce(bootstrap, range(20_000, 2 * RECORDS_PER_HALF))
    finally:
        os.kill(cleaner, signal.SIGCONT)
    sampler = PeakSampler(cleaner)
    try:
        _wait(lambda: any("(more next pass)" in line for line in _cleans(server)[1:])
              and "(more next pass)" not in _cleans(server)[-1], "a clean split in passes", server)
    finally:
        peak = sampler.stop()
    assert _title(cleaner) == "appliance: cleaner"  # the same process throughout: not restarted
    growth = peak - idle
    assert growth <= BUFFER_BYTES + ALLOWANCE_BYTES, (
        f"the cleaner's anonymous memory grew by {growth / MIB:.1f} MiB (idle {idle / MIB:.1f} MiB, peak "
        f"{peak / MIB:.1f} MiB) during passes with log.cleaner.dedupe.buffer.size {BUFFER_BYTES / MIB:.0f} "
        f"MiB; allowed {(BUFFER_BYTES + ALLOWANCE_BYTES) / MIB:.0f} MiB")
