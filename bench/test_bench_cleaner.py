"""Benchmark of log compaction: one full cleaning pass over a dirty log, against reading and writing the same
bytes in the same run.

Run: ``.venv/bin/python -m pytest bench/test_bench_cleaner.py --benchmark-enable --benchmark-only -s``.
The log: ``CLEANER_BENCH_MIB`` (default 64) of uncompressed batches of 128 records, 100-byte values, keys
drawn from ``CLEANER_BENCH_KEYS`` (default 50,000) distinct 16-byte keys, in 16 MiB segments.  Each round
copies the log (page cache warm), then times ``clean_log`` over all of it (the offset map, the rewrite, the
fsyncs and swaps); the baseline reads every segment file and writes it to a new file, with and without an
``fsync`` of the copy (the clean fsyncs what it writes).  One ``RESULT`` line gives MB/s of dirty log cleaned
and the ratios (the issue's target: >= 0.5 of reading plus writing).
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

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from storage.batch_builder import build_batch
from storage.cleaner import clean_log
from storage.log import Log
from storage.log_config import LogConfig

MIB = int(os.environ.get("CLEANER_BENCH_MIB", "64"))
KEYS = int(os.environ.get("CLEANER_BENCH_KEYS", "50000"))
ROUNDS = int(os.environ.get("CLEANER_BENCH_ROUNDS", "3"))
CONFIG = LogConfig(segment_bytes=16 << 20)


@pytest.fixture
def bench_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cleaner-bench-", dir=os.environ.get("LOG_BENCH_DIR")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dirty_log(directory: Path) -> int:
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


def _read_write(source: Path, target: Path, *, fsync: bool) -> float:
    target.mkdir()
    start = time.perf_counter()
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
    return time.perf_counter() - start


def test_cleaner_throughput_vs_read_write(benchmark: BenchmarkFixture, bench_dir: Path) -> None:
    original = bench_dir / "orig-0"
    dirty_bytes = _dirty_log(original)
    clean_s: list[float] = []
    plain_s: list[float] = []
    synced_s: list[float] = []
    rounds = iter(range(1_000_000))

    def fresh() -> tuple[tuple[Log], dict[str, object]]:
        n = next(rounds)
        copy = bench_dir / f"copy{n}-0"
        shutil.copytree(original, copy)
        plain_s.append(_read_write(original, bench_dir / f"plain{n}", fsync=False))
        synced_s.append(_read_write(original, bench_dir / f"synced{n}", fsync=True))
        return (Log.open(str(copy), CONFIG),), {}

    def clean(log: Log) -> None:
        start = time.perf_counter()
        result = clean_log(log, upper_bound=log.log_end_offset, now_ms=2_000)
        clean_s.append(time.perf_counter() - start)
        assert result.done
        log.close()

    benchmark.pedantic(clean, setup=fresh, rounds=ROUNDS, iterations=1)
    clean_time = statistics.median(clean_s)
    info = {
        "dirty_mib": dirty_bytes / (1 << 20),
        "clean_mb_s": dirty_bytes / clean_time / 1e6,
        "read_write_mb_s": dirty_bytes / statistics.median(plain_s) / 1e6,
        "read_write_fsync_mb_s": dirty_bytes / statistics.median(synced_s) / 1e6,
        "ratio_to_read_write": statistics.median(plain_s) / clean_time,
        "ratio_to_read_write_fsync": statistics.median(synced_s) / clean_time,
    }
    benchmark.extra_info.update(info)
    print("\nRESULT cleaner: " + ", ".join(f"{k}={v:.2f}" for k, v in info.items()), file=sys.stderr)
