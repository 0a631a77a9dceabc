"""Benchmarks: the local produce path end to end, against a real ``appliance serve`` (writers appending).

Run: ``.venv/bin/python -m pytest bench/test_bench_produce.py --benchmark-enable -q -s``

Each benchmark stores in ``extra_info``:

* ``records_per_s`` and ``mb_per_s`` (payload bytes: keys and values) end to end: from the first ``send`` to
  the last ack (``flush``), the writer appending to its log through the page cache;
* ``producer_cpu_ns_per_record``: the producing process's CPU time (all its threads) per record, and
  ``producer_bound_records_per_s`` = 1e9 / that: what the producer alone could do with a free core;
* ``writer_cpu_ns_per_record``: the partition writer's CPU time per record (from /proc);
* ``page_cache_mb_per_s`` (bulk 100 B run): buffered ``os.write`` of 1 MiB chunks to a file in the same
  directory, the same volume, measured in the same run just before each round.  The 10 KiB runs use
  ``appliance bench produce``'s method (``bench.limits.PageCacheProbe`` with the round's rows as
  its source, ``recycle=True``): a probe of the round's own bytes right before AND right after each round
  (each probe and the round starting right after ``perf_limits.recycle_pages``), the round held
  against the faster (``ratio_to_faster_probe``), both samples and their CPU per byte kept, and
  ``cpu_bound_ratio`` (the cheaper probe's CPU per byte over the costlier of producer and writer).
  Every probe and every timed round starts after ``os.sync()``, with no dirty pages, so both see the same
  page-cache state (without it a probe run right after a round is throttled by that round's writeback);
* ``load_average_1min`` at the end of the rounds (others' work on this 2-core machine moves wall-clock
  figures; the CPU figures per record move much less).

Each test prints one ``RESULT`` line: the figure its target names, the target, and the CPU costs.  Shorter
runs while iterating: ``PRODUCE_BENCH_SEND_RECORDS`` (default 2,000,000), ``PRODUCE_BENCH_LARGE_RECORDS``
(default 60,000).

Targets: one producer, one partition, 100-byte records, acks=1, no compression: >= 2,000,000
records/s through ``send()``, >= 5,000,000 through ``send_many()``; 10 KiB records at >= 0.7 of page-cache
write bandwidth.  The machine these run on has 2 cores shared by producer, writer and supervisor (and by
anything else running): the ``producer_bound`` figures say what the client code itself costs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.client.producer import Producer
from bench.limits import PageCacheProbe, recycle_pages
from bench.stats import process_cpu_ns
from ipc.control import ControlClient

REPO = Path(__file__).resolve().parent.parent
TOPICS = {"one": 1, "eight": 8, "large": 1, "large-many": 1}
SEND_RECORDS = int(os.environ.get("PRODUCE_BENCH_SEND_RECORDS", "2000000"))
SEND_MANY_RECORDS = 5_000_000
VALUE_BYTES = 100
LARGE_BYTES = 10 * 1024
LARGE_RECORDS = int(os.environ.get("PRODUCE_BENCH_LARGE_RECORDS", "60000"))  # ~600 MiB per run
PRODUCERS = 4
PER_PRODUCER_RECORDS = 400_000


class Server:
    """``appliance serve`` in a temporary directory, in its own process group."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="la-bench-", dir="/tmp"))
        self.data = self.root / "data"
        args = [sys.executable, "-m", "appliance.cli", "serve", "--override", f"log.dirs={self.data}",
                "--override", "listeners=PLAINTEXT://127.0.0.1:0"]
        for topic, partitions in TOPICS.items():
            args += ["--override", f"topics.{topic}.partitions={partitions}"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.log = open(self.root / "serve.log", "wb")
        self.process = subprocess.Popen(args, cwd=self.root, env=env, stdout=self.log, stderr=self.log,
                                        start_new_session=True)  # fmt: skip
        self.socket_path = str(self.data / ".appliance.sock")
        deadline = time.monotonic() + 60
        while True:
            try:
                ControlClient.connect(self.socket_path).close()
                break
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError((self.root / "serve.log").read_text()) from None
                time.sleep(0.05)

    def writer_pids(self, topic: str) -> list[int]:
        with ControlClient.connect(self.socket_path) as client:
            return [p.writer_pid for p in client.metadata([topic]).topics[topic].partitions]

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    serve = Server()
    try:
        yield serve
    finally:
        serve.close()


def _measure(benchmark: Any, run: Callable[[], None], records: int, payload_bytes: int,
             writer_pids: list[int], rounds: int = 3, before: Callable[[], object] | None = None,
             after: Callable[[], object] | None = None) -> dict[str, Any]:
    """Time ``run`` (``rounds`` times under --benchmark-enable; ``before`` and ``after`` run untimed right
    before and right after each); report rates and CPU costs (medians) and each round's seconds."""
    samples: list[tuple[float, float, float]] = []

    def timed() -> None:
        if before is not None:
            before()
        os.sync()  # every round starts with no dirty pages (the last round's log, a probe's file)
        writers = process_cpu_ns(writer_pids)
        cpu = time.process_time_ns()
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        writer_cpu = process_cpu_ns(writer_pids) - writers
        samples.append((wall, time.process_time_ns() - cpu, writer_cpu))
        if after is not None:
            after()

    enabled = not getattr(benchmark, "disabled", False)
    benchmark.pedantic(timed, rounds=rounds if enabled else 1, iterations=1, warmup_rounds=0)
    wall = sorted(s[0] for s in samples)[len(samples) // 2]  # medians
    producer_cpu = sorted(s[1] for s in samples)[len(samples) // 2]
    writer_cpu = sorted(s[2] for s in samples)[len(samples) // 2]
    info = {
        "records_per_s": round(records / wall),
        "mb_per_s": round(payload_bytes / wall / 1e6, 1),
        "producer_cpu_ns_per_record": round(producer_cpu / records, 1),
        "producer_bound_records_per_s": round(records * 1e9 / max(producer_cpu, 1)),
        "writer_cpu_ns_per_record": round(writer_cpu / records, 1),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    benchmark.extra_info.update(info)
    print(f"\n{benchmark.name}: {info}")
    return {**info, "round_seconds": [s[0] for s in samples],
            "round_producer_cpu_ns": [s[1] for s in samples], "round_writer_cpu_ns": [s[2] for s in samples]}


def _result(what: str, figure: str, target: str, info: dict[str, Any]) -> None:
    print(f"\nRESULT {what}: {figure} (target {target}); producer CPU "
          f"{info['producer_cpu_ns_per_record']} ns per record (alone: "
          f"{info['producer_bound_records_per_s']:,} records/s), writer CPU "
          f"{info['writer_cpu_ns_per_record']} ns per record, load average {info['load_average_1min']}",
          file=sys.stderr)


# -- one producer, one partition, 100-byte records, acks=1 ---------------------------------------------------


def test_send_100_byte_records_one_partition(benchmark: Any, server: Server) -> None:
    """The per-record path: Producer.send() in a loop, acks=1, no compression, then flush()."""
    producer = Producer({"appliance.control.socket": server.socket_path, "acks": "1"})
    value = b"x" * VALUE_BYTES
    send = producer.send
    for _ in range(50_000):  # attach the ring, load the kernels
        send("one", value)
    producer.flush()
    count = SEND_RECORDS if not getattr(benchmark, "disabled", False) else 100_000

    def run() -> None:
        for _ in range(count):
            send("one", value)
        producer.flush()

    try:
        info = _measure(benchmark, run, count, count * VALUE_BYTES, server.writer_pids("one"))
    finally:
        producer.close()
    _result("send() 100 B, 1 producer, 1 partition, acks=1", f"{info['records_per_s']:,} records/s",
            ">= 2,000,000 records/s", info)


def test_send_many_100_byte_records_one_partition(benchmark: Any, server: Server) -> None:
    """The bulk path: one send_many() of a 2-D uint8 array (one 100-byte record per row), then flush()."""
    producer = Producer({"appliance.control.socket": server.socket_path, "acks": "1"})
    count = SEND_MANY_RECORDS if not getattr(benchmark, "disabled", False) else 200_000
    rows = np.frombuffer(np.random.default_rng(2).bytes(count * VALUE_BYTES), np.uint8).reshape(count, -1)
    producer.send_many("one", rows[:50_000]).get(60)

    probe = PageCacheProbe(server.data, count * (VALUE_BYTES + 9))  # a record is 109 bytes in the log

    def run() -> None:
        producer.send_many("one", rows)
        producer.flush()

    try:
        info = _measure(benchmark, run, count, count * VALUE_BYTES, server.writer_pids("one"),
                        before=probe.measure)
    finally:
        producer.close()
        probe.remove()
    limit = probe.mb_per_s
    log_mb_per_s = info["records_per_s"] * (VALUE_BYTES + 9) / 1e6
    benchmark.extra_info["page_cache_mb_per_s"] = round(limit, 1)
    benchmark.extra_info["log_mb_per_s"] = round(log_mb_per_s, 1)
    benchmark.extra_info["page_cache_bound_records_per_s"] = round(limit * 1e6 / (VALUE_BYTES + 9))
    print(f"page cache {limit:.0f} MB/s: at most {limit * 1e6 / (VALUE_BYTES + 9):,.0f} records/s of 109 "
          f"bytes; the log took {log_mb_per_s:.0f} MB/s")
    _result("send_many() 100 B, 1 producer, 1 partition, acks=1", f"{info['records_per_s']:,} records/s",
            ">= 5,000,000 records/s", info)


# -- four producers, eight partitions ------------------------------------------------------------------------

_PRODUCER_PROCESS = textwrap.dedent(
    """
    import sys, time
    from appliance.client.producer import Producer
    socket_path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    producer = Producer({"appliance.control.socket": socket_path, "acks": "1"})
    value = b"y" * size
    send = producer.send
    for _ in range(20_000):
        send("eight", value)
    producer.flush()
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    cpu = time.process_time_ns(); start = time.perf_counter()
    for _ in range(count):
        send("eight", value)
    producer.flush()
    print(time.perf_counter() - start, time.process_time_ns() - cpu, flush=True)
    producer.close()
    """
)


def test_send_four_producers_eight_partitions(benchmark: Any, server: Server) -> None:
    """Four producer processes, each send()ing 100-byte records (sticky partitioning over 8 partitions)."""
    count = PER_PRODUCER_RECORDS if not getattr(benchmark, "disabled", False) else 20_000
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = server.writer_pids("eight")
    results: list[dict[str, float]] = []

    def run() -> None:
        procs = [subprocess.Popen([sys.executable, "-c", _PRODUCER_PROCESS, server.socket_path, str(count),
                                   str(VALUE_BYTES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                 for _ in range(PRODUCERS)]  # fmt: skip
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        os.sync()
        writer_cpu = process_cpu_ns(writers)
        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=600)[0].split() for proc in procs]
        wall = time.perf_counter() - start
        total = count * PRODUCERS
        producer_cpu = sum(int(out[1]) for out in outputs)
        results.append({
            "records_per_s": round(total / wall),
            "mb_per_s": round(total * VALUE_BYTES / wall / 1e6, 1),
            "producer_cpu_ns_per_record": round(producer_cpu / total, 1),
            "writer_cpu_ns_per_record": round((process_cpu_ns(writers) - writer_cpu) / total, 1),
        })

    enabled = not getattr(benchmark, "disabled", False)
    benchmark.pedantic(run, rounds=3 if enabled else 1, iterations=1)
    best = sorted(results, key=lambda r: r["records_per_s"])[len(results) // 2]
    benchmark.extra_info.update(best)
    print(f"\n{benchmark.name}: {best}")


# -- 10 KiB records: against the page cache ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["send", "send_many"])
def test_10_kib_records_against_page_cache_bandwidth(benchmark: Any, server: Server, path: str) -> None:
    """10 KiB records, one partition: MB/s end to end as a share of buffered-write bandwidth, probed right
    before and right after each round (``appliance bench produce``'s method, ``bench.limits``): the
    round's own bytes, the same volume, a new file in the same directory; each round held against the faster
    of its two probes."""
    topic = "large" if path == "send" else "large-many"
    producer = Producer({"appliance.control.socket": server.socket_path, "acks": "1"})
    count = LARGE_RECORDS if not getattr(benchmark, "disabled", False) else 5_000
    rows = np.frombuffer(np.random.default_rng(3).bytes(count * LARGE_BYTES), np.uint8).reshape(count, -1)
    values = [bytes(row) for row in rows] if path == "send" else []
    producer.send_many(topic, rows[:500]).get(60)
    probe = PageCacheProbe(server.data, count * LARGE_BYTES, rows, recycle=True)

    def run() -> None:
        if path == "send":
            send = producer.send
            for value in values:
                send(topic, value)
        else:
            producer.send_many(topic, rows)
        producer.flush()

    def probe_then_sync() -> None:
        probe.measure()
        os.sync()  # the round starts as the probe did, with no dirty pages
        recycle_pages(count * LARGE_BYTES)  # and right after recycle_pages, as each probe

    def probe_after() -> None:
        probe.measure()

    try:
        info = _measure(benchmark, run, count, count * LARGE_BYTES, server.writer_pids(topic),
                        before=probe_then_sync, after=probe_after)
    finally:
        producer.close()
        probe.remove()
    volume = count * LARGE_BYTES
    pairs = [probe.samples[i : i + 2] for i in range(0, len(probe.samples), 2)]
    cpus = [probe.cpu_ns_per_byte[i : i + 2] for i in range(0, len(probe.cpu_ns_per_byte), 2)]
    walls = info["round_seconds"]
    ratios = sorted(volume / wall / max(pair) for wall, pair in zip(walls, pairs, strict=True))
    cpu_bound = sorted(min(cpu) * volume / max(p, w) for cpu, p, w in zip(
        cpus, info["round_producer_cpu_ns"], info["round_writer_cpu_ns"], strict=True))
    ratio = ratios[len(ratios) // 2]
    extra = {"page_cache_samples_mb_per_s": [[round(x / 1e6) for x in pair] for pair in pairs],
             "page_cache_probe_cpu_ns_per_byte": [[round(x, 3) for x in cpu] for cpu in cpus],
             "ratio_to_faster_probe": round(ratio, 3),
             "ratios_to_faster_probe": [round(r, 3) for r in ratios],
             "cpu_bound_ratio": round(cpu_bound[len(cpu_bound) // 2], 3)}
    benchmark.extra_info.update(extra)
    print(f"page cache probes {extra['page_cache_samples_mb_per_s']} MB/s, ratio to the faster {ratio:.3f}")
    _result(f"{path}() 10 KiB, 1 producer, 1 partition, acks=1",
            f"{info['mb_per_s']} MB/s = {ratio:.3f} of page-cache write (the faster probe of each round; "
            f"samples {extra['page_cache_samples_mb_per_s']} MB/s; CPU-bound ratio "
            f"{extra['cpu_bound_ratio']})",
            ">= 0.7 of page-cache write", info)
