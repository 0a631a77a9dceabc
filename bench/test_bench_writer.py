"""Benchmarks: the produce hot path from ring to file, against os.write of the same bytes.

Run: ``.venv/bin/python -m pytest bench/test_bench_writer.py --benchmark-enable --benchmark-only -s``

``test_drain_round_vs_os_write``: one process, no producer competing for the CPU.  Frames are published
into a real shared-memory ring (untimed), then a real ``PartitionWriter`` (real log, state page, doorbell)
drains them with ``drain_round`` until the ring is empty (timed): peek, ``check_batch`` (magic, length,
CRC), idempotence, ``Log.append_batches`` (stamps, then ``os.writev`` straight from ring memory), publish
the offsets, ack, release.  The limit, measured in the same run, interleaved: ``os.write`` of each frame's
body, from the same ring memory, to a new file in the same directory.  Every timed step starts after
``os.sync()`` on a new file (a new log directory for the writer), and both are deleted after their step,
so neither side writes into pages the other just freed more often than the other.

Frames: idempotent batches, ``WRITER_BENCH_MIB`` MiB per round (default 64), in three shapes: 1 MiB batches of
10 KiB records (the producer's default ``batch.size``), 64 KiB batches of 1 KiB records, 16 KiB batches of
100-byte records (Kafka's default ``batch.size``: per-frame costs show).  ``WRITER_BENCH_ROUNDS`` rounds
(default 7).

``test_10_kib_records_end_to_end_vs_page_cache``: a real ``appliance serve`` (its writer process appending),
one ``Producer``, 10 KiB records, acks=1, from the first record to the last ack.  The payload
(``E2E_BENCH_PAYLOAD``): ``pool`` (the default) is ``appliance bench produce``'s -- its 8 MiB pool of distinct
10 KiB JSON records, cycled, sent by its own loop (``bench.produce.produce_into``: ``send`` per record, or
``send_many`` of ~1 MiB slices), so this bench and the ``make bench`` matrix measure the same thing;
``distinct`` is ``E2E_BENCH_RECORDS`` distinct random records (``send_many`` of one 2-D array, ``send`` of
each record's ``bytes`` in a plain loop), read from memory once: not cache resident, so the probe writing
them costs more CPU per byte than for the pool (and the producer's copy more too): the two payloads give
different limits, and only ``pool`` is the matrix's.  The page-cache probe
(``bench.limits.PageCacheProbe`` with the round's rows as its source: buffered ``os.write`` of the same
bytes, ~1 MiB at a time, to a new file in the data directory, after ``os.sync()``) runs right before AND right
after every round, each probe and the round starting right after ``bench.limits.recycle_pages`` of their
volume (all three write into pages the host backs), so a swing of the page cache during the round shows up;
the round is held against the faster of its two probes (``ratio_to_faster_probe``, conservative) and their
mean.
``appliance bench produce`` (the ``make bench`` matrix) measures the same way with the same class.  On a
shared 2-core machine the wall-clock ratio also measures whoever else runs; the CPU cost ratios do not:
``cpu_ratio_probe_to_writer`` is the probe's CPU time per byte (the kernel's buffered write of those bytes)
over the writer process's (everything it does per byte: peek, CRC, idempotence, stamp, writev, acks), 1.0
being a writer that costs no more than the write; ``cpu_bound_ratio`` divides by the costlier of writer and
producer: the ratio the round would reach with a core for each.
``E2E_BENCH_RECORDS`` records per round (default 30,000, ~300 MiB), ``E2E_BENCH_ROUNDS`` rounds (default 5).

Each test prints a ``RESULT`` line and stores its figures in ``extra_info``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from appliance.client.producer import Producer
from appliance.server.writer import PartitionWriter, WriterSpec
from bench.limits import PageCacheProbe, recycle_pages
from bench.produce import ProduceSettings, payload_pool, produce_into
from bench.stats import process_cpu_ns
from bench.test_bench_produce import Server
from ipc.ring import RingNames, RingProducer, create_ring, warm_up
from ipc.shm import ShmNames, reclaim
from ipc.state_page import StatePage
from ipc.wakeup import Doorbell
from storage.batch_builder import build_batch
from storage.log_config import LogConfig

VOLUME_MIB = int(os.environ.get("WRITER_BENCH_MIB", "64"))
ROUNDS = int(os.environ.get("WRITER_BENCH_ROUNDS", "7"))
RING_BYTES = 128 << 20
E2E_RECORDS = int(os.environ.get("E2E_BENCH_RECORDS", "30000"))
E2E_ROUNDS = int(os.environ.get("E2E_BENCH_ROUNDS", "5"))
E2E_PAYLOAD = os.environ.get("E2E_BENCH_PAYLOAD", "pool")  # pool | distinct
RECORD_BYTES = 10 * 1024
SHAPES = {  # name: (record value bytes, records per batch)
    "1MiB-of-10KiB": (10 * 1024, 102),
    "64KiB-of-1KiB": (1024, 63),
    "16KiB-of-100B": (100, 150),
}


class Partition:
    """A partition's shared memory and one producer ring, for writers opened one after another."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = ShmNames(secrets.token_hex(8))
        self.page_name = self.names.state_page("bench", 0)
        StatePage.create(self.page_name).close()
        Doorbell.create(self.names.doorbell("bench", 0)).close()
        self.ring = RingNames.for_producer(self.names, "bench", 0, 1)
        create_ring(self.ring, capacity_bytes=RING_BYTES, ack_slots=16384)
        self.producer = RingProducer.attach(self.ring, max_block_ms=10_000, track_acks=False)
        self.rounds = 0

    def writer(self) -> PartitionWriter:
        self.rounds += 1
        spec = WriterSpec(topic="bench", partition=0, directory=str(self.root / f"bench-{self.rounds}"),
                          log_config=LogConfig(), leader_epoch=0, state_page=self.page_name,
                          doorbell=self.names.doorbell("bench", 0))  # fmt: skip
        writer = PartitionWriter.open(spec)
        writer.attach_ring(self.ring)
        return writer

    def close(self) -> None:
        self.producer.close()
        reclaim(self.names.instance)


@pytest.fixture
def partition() -> Iterator[Partition]:
    root = Path(tempfile.mkdtemp(prefix="writer-bench-", dir=os.environ.get("LOG_BENCH_DIR")))
    p = Partition(root)
    try:
        yield p
    finally:
        p.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_drain_round_vs_os_write(benchmark: BenchmarkFixture, partition: Partition, shape: str) -> None:
    warm_up()
    value_bytes, per_batch = SHAPES[shape]
    values = [secrets.token_bytes(value_bytes)] * per_batch
    batch_bytes = len(build_batch(values, producer_id=9, producer_epoch=0, base_sequence=0))
    frames_per_round = max(1, (VOLUME_MIB << 20) // batch_bytes)
    sequence = [0]
    bodies: list[memoryview] = []

    def publish() -> None:
        """Build and publish one round of frames (untimed); remember where their bodies are."""
        bodies.clear()
        data = memoryview(partition.producer.data)  # type: ignore[attr-defined]
        for _ in range(frames_per_round):
            batch = build_batch(values, producer_id=9, producer_epoch=0, base_sequence=sequence[0])
            sequence[0] += per_batch
            index = partition.producer.reserve(len(batch))
            data[index : index + len(batch)] = batch
            partition.producer.commit(len(batch))
            bodies.append(data[index : index + len(batch)])

    def drain() -> tuple[float, float]:
        writer = partition.writer()
        publish()
        os.sync()
        cpu = time.process_time()
        start = time.perf_counter()
        while writer.drain_round():
            pass
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert writer.stats.appended_batches == frames_per_round and writer.stats.rejected == 0
        directory = writer.spec.directory
        writer.close(clean=False)
        shutil.rmtree(directory)
        return wall, cpu

    def write() -> tuple[float, float]:
        path = partition.root / "plain.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.sync()
        cpu = time.process_time()
        start = time.perf_counter()
        for body in bodies:
            os.write(fd, body)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        os.close(fd)
        path.unlink()
        return wall, cpu

    drain()  # warm up: kernels, page tables
    samples: dict[str, list[tuple[float, float]]] = {"drain": [], "write": []}
    for r in range(ROUNDS):
        order = ("drain", "write") if r % 2 == 0 else ("write", "drain")
        for name in order:  # write() sends the bodies the last drain() appended, from the same ring memory
            samples[name].append(drain() if name == "drain" else write())
    benchmark.pedantic(drain, rounds=1, iterations=1)
    volume = frames_per_round * batch_bytes
    drain_wall = statistics.median(s[0] for s in samples["drain"])
    write_wall = statistics.median(s[0] for s in samples["write"])
    info = {
        "frames_per_round": frames_per_round,
        "batch_bytes": batch_bytes,
        "drain_GBps": volume / drain_wall / 1e9,
        "os_write_GBps": volume / write_wall / 1e9,
        "ratio_drain_to_os_write": write_wall / drain_wall,
        "ratio_drain_to_os_write_paired": statistics.median(
            w[0] / d[0] for w, d in zip(samples["write"], samples["drain"], strict=True)),
        "drain_cpu_ns_per_byte": statistics.median(s[1] for s in samples["drain"]) / volume * 1e9,
        "os_write_cpu_ns_per_byte": statistics.median(s[1] for s in samples["write"]) / volume * 1e9,
        "drain_us_per_frame": drain_wall / frames_per_round * 1e6,
        "os_write_us_per_frame": write_wall / frames_per_round * 1e6,
    }
    benchmark.extra_info.update(info)
    print(f"\nRESULT writer drain {shape} x{frames_per_round}: "
          + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()),
          file=sys.stderr)  # fmt: skip


@pytest.mark.parametrize("api", ["send_many", "send"])
def test_10_kib_records_end_to_end_vs_page_cache(benchmark: BenchmarkFixture, api: str) -> None:
    server = Server()
    producer = Producer({"appliance.control.socket": server.socket_path, "acks": "1"})
    topic = "large-many" if api == "send_many" else "large"
    try:
        if E2E_PAYLOAD == "pool":  # appliance bench produce's payload: 8 MiB of distinct JSON records, cycled
            rows = payload_pool(ProduceSettings(records=E2E_RECORDS, record_size=RECORD_BYTES))
        else:  # E2E_RECORDS distinct random records, one 2-D array (read once: not cache resident)
            rows = np.frombuffer(np.random.default_rng(3).bytes(E2E_RECORDS * RECORD_BYTES), np.uint8)
            rows = rows.reshape(E2E_RECORDS, RECORD_BYTES)
        values = [bytes(row) for row in rows] if api == "send" and E2E_PAYLOAD != "pool" else []
        producer.send_many(topic, rows[:500]).get(60)  # attach the ring, load the kernels
        producer.flush()
        writer_pid = server.writer_pids(topic)[0]
        volume = E2E_RECORDS * RECORD_BYTES
        probe = PageCacheProbe(server.data, volume, rows, recycle=True)
        rounds: list[dict[str, float]] = []

        def one_round() -> None:
            before = probe.measure() / 1e6
            before_cpu = probe.cpu_ns_per_byte[-1]
            os.sync()
            recycle_pages(volume)  # as before each probe: the round writes into pages the host backs
            writer_cpu = process_cpu_ns([writer_pid])
            cpu = time.process_time_ns()
            start = time.perf_counter()
            if E2E_PAYLOAD == "pool":
                produce_into(producer, topic, rows, E2E_RECORDS, api=api)  # the matrix's loop, flush included
            elif api == "send":
                send = producer.send
                for value in values:
                    send(topic, value)
            else:
                producer.send_many(topic, rows)
            producer.flush()
            wall = time.perf_counter() - start
            producer_cpu = time.process_time_ns() - cpu
            writer_cpu = process_cpu_ns([writer_pid]) - writer_cpu
            after = probe.measure() / 1e6
            after_cpu = probe.cpu_ns_per_byte[-1]
            rate = volume / wall / 1e6
            probe_cpu = min(before_cpu, after_cpu)
            rounds.append({"mb_per_s": rate, "probe_before": before, "probe_after": after,
                           "ratio_to_faster_probe": rate / max(before, after),
                           "ratio_to_mean_probe": rate / ((before + after) / 2),
                           "writer_cpu_ns_per_byte": writer_cpu / volume,
                           "producer_cpu_ns_per_byte": producer_cpu / volume,
                           "probe_cpu_ns_per_byte": probe_cpu,
                           "cpu_ratio_probe_to_writer": probe_cpu / (writer_cpu / volume),
                           "cpu_bound_ratio": probe_cpu / max(writer_cpu / volume, producer_cpu / volume),
                           "load_average_1min": os.getloadavg()[0]})  # fmt: skip

        benchmark.pedantic(one_round, rounds=E2E_ROUNDS, iterations=1, warmup_rounds=0)
        probe.remove()
    finally:
        producer.close()
        server.close()
    info: dict[str, object] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    info["rounds"] = [{k: round(v, 3) for k, v in r.items()} for r in rounds]
    info["records_per_round"] = E2E_RECORDS
    info["payload"] = E2E_PAYLOAD
    benchmark.extra_info.update(info)
    print(f"\nRESULT 10 KiB records end to end, {api}() (medians; target ratio >= 0.7): "
          + ", ".join(f"{k}={v}" for k, v in info.items() if k != "rounds"), file=sys.stderr)
    for r in rounds:
        print("  round: " + ", ".join(f"{k}={v:.3f}" for k, v in r.items()), file=sys.stderr)
