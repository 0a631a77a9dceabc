"""Benchmark of log compaction: one full cleaning pass over a dirty log, against reading and writing the same
bytes in the same run.

Run: ``.venv/bin/python -m pytest bench/test_bench_cleaner.py --benchmark-enable --benchmark-only -s``.
The log: ``CLEANER_BENCH_MIB`` (default 64) of uncompressed batches of 128 records, 100-byte values, keys
drawn from ``CLEANER_BENCH_KEYS`` (default 50,000) distinct 16-byte keys, in 16 MiB segments.  Each of
``CLEANER_BENCH_ROUNDS`` (default 5) rounds copies the log and syncs, times the reference over that copy,
syncs again, then times ``clean_log`` over all of it (the offset map, the rewrite, the fsyncs and swaps).
The reference reads every segment file of the copy and writes its bytes to a new file, with and without an
``fsync`` of each (the clean fsyncs what it writes): the same files, the same bytes, read from the page cache
as the clean reads them, with no dirty pages of the copy left to write back.  A pass before the rounds loads
numba's compiled kernels.  One ``RESULT`` line gives each round's ratio (reference wall time / clean wall
time), MB/s of dirty log cleaned, the median ratios (the issue's target: >= 0.5 of reading plus writing),
the same ratio in CPU time (user + system of this process: less moved by other work on the machine, though
the reference's writeback and the clean's fsyncs are not in it) and the load average.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from storage.batch_builder import build_batch
from storage.cleaner import clean_log
from storage.log import Log
from storage.log_config import LogConfig

MIB = int(os.environ.get("CLEANER_BENCH_MIB", "64"))
KEYS = int(os.environ.get("CLEANER_BENCH_KEYS", "50000"))
ROUNDS = int(os.environ.get("CLEANER_BENCH_ROUNDS", "5"))
CONFIG = LogConfig(segment_bytes=16 << 20)


@pytest.fixture
def bench_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cleaner-bench-", dir=os.environ.get("LOG_BENCH_DIR")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def dirty_log(directory: Path) -> int:
    """Fill the log; returns the bytes of its closed segments."""
    rng = random.Random(1)
    keys = [f"key-{i:012d}".encode() for i in range(KEYS)]
    value = b"v" * 100
    with Log.open(str(directory), CONFIG) as log:
        while log.size_bytes < MIB << 20:
            batch_keys = [keys[rng.randrange(KEYS)] for _ in range(128)]
            log.append(build_batch([value] * 128, batch_keys, timestamp_ms=1_000), leader_epoch=0)
        log.roll()
        return sum(s.size_bytes for s in log.segments if not s.is_active)


class Timing(NamedTuple):
    """Wall-clock and CPU seconds (``time.process_time``: user and system) of one timed step."""

    wall_s: float
    cpu_s: float


def _read_write(source: Path, target: Path, *, fsync: bool) -> Timing:
    """Read every ``.log`` file of ``source`` and write its bytes to a new file in ``target`` (each fsynced
    with ``fsync``); ``target`` is removed after."""
    target.mkdir()
    start, cpu = time.perf_counter(), time.process_time()
    for path in sorted(source.glob("*.log")):
        data = path.read_bytes()
        fd = os.open(target / path.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    timing = Timing(time.perf_counter() - start, time.process_time() - cpu)
    shutil.rmtree(target)
    return timing


def test_cleaner_throughput_vs_read_write(benchmark: BenchmarkFixture, bench_dir: Path) -> None:
    original = bench_dir / "orig-0"
    dirty_bytes = dirty_log(original)
    clean_s: list[Timing] = []
    plain_s: list[Timing] = []
    synced_s: list[Timing] = []
    rounds = iter(range(1_000_000))

    def fresh() -> tuple[tuple[Log], dict[str, object]]:
        """A copy of the dirty log to clean, and the reference timed over the same copy just before: the
        same files and bytes, their pages cached and clean (synced), no other dirty pages in flight."""
        n = next(rounds)
        copy = bench_dir / f"copy{n}-0"
        shutil.copytree(original, copy)
        shutil.rmtree(bench_dir / f"copy{n - 1}-0", ignore_errors=True)
        os.sync()
        plain_s.append(_read_write(copy, bench_dir / f"plain{n}", fsync=False))
        os.sync()
        synced_s.append(_read_write(copy, bench_dir / f"synced{n}", fsync=True))
        os.sync()
        return (Log.open(str(copy), CONFIG),), {}

    def clean(log: Log) -> None:
        start, cpu = time.perf_counter(), time.process_time()
        result = clean_log(log, upper_bound=log.log_end_offset, now_ms=2_000)
        clean_s.append(Timing(time.perf_counter() - start, time.process_time() - cpu))
        assert result.done
        log.close()

    clean(fresh()[0][0])  # a pass before the counted rounds: numba's compiled kernels loaded
    del clean_s[0], plain_s[0], synced_s[0]
    benchmark.pedantic(clean, setup=fresh, rounds=ROUNDS, iterations=1)

    def ratio(reference: list[Timing], *, cpu: bool = False) -> list[float]:
        return [(r.cpu_s / c.cpu_s) if cpu else (r.wall_s / c.wall_s)
                for r, c in zip(reference, clean_s, strict=True)]

    def median_wall(timings: list[Timing]) -> float:
        return statistics.median(t.wall_s for t in timings)

    info = {
        "dirty_mib": dirty_bytes / (1 << 20),
        "clean_mb_s": dirty_bytes / median_wall(clean_s) / 1e6,
        "read_write_mb_s": dirty_bytes / median_wall(plain_s) / 1e6,
        "read_write_fsync_mb_s": dirty_bytes / median_wall(synced_s) / 1e6,
        "ratio_to_read_write": statistics.median(ratio(plain_s)),
        "ratio_to_read_write_fsync": statistics.median(ratio(synced_s)),
        "cpu_ratio_to_read_write": statistics.median(ratio(plain_s, cpu=True)),
        "clean_cpu_s": statistics.median(t.cpu_s for t in clean_s),
        "load_1min": os.getloadavg()[0],
    }
    benchmark.extra_info.update(info)
    rounds_text = ", ".join(f"{r:.2f}" for r in ratio(plain_s))
    print(f"\nRESULT cleaner: ratios per round {rounds_text}; "
          + ", ".join(f"{k}={v:.2f}" for k, v in info.items()), file=sys.stderr)
