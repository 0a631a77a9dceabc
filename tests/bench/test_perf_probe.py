"""The page-cache probe a produce run is held against (``bench.limits``): it writes the run's own
bytes, in the run's order, for the run's volume; two probes bracket a run and the faster is the limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.limits import (
    CHUNK_BYTES,
    PageCacheProbe,
    limits_with_probe,
    probe_volume_bytes,
    recycle_pages,
)
from bench.produce import probe_report


def _rows(count: int, width: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(5).bytes(count * width), np.uint8).reshape(count, width)


def test_probe_writes_the_runs_rows_cycled_in_order(tmp_path: Path) -> None:
    rows = _rows(7, 10_240)  # a pool of 7 records, cycled as the producer cycles it
    records = 23
    probe = PageCacheProbe(tmp_path, records * 10_240, rows)
    assert probe.volume_bytes == records * 10_240
    assert probe.source == "run payload"
    assert probe.measure(sync=False) > 0
    written = probe.paths[0].read_bytes()
    expected = b"".join(rows[i % 7].tobytes() for i in range(records))
    assert written == expected
    probe.remove()
    assert not probe.paths[0].exists()


def test_probe_chunks_are_whole_rows_of_about_a_mib(tmp_path: Path) -> None:
    rows = _rows(300, 10_240)
    probe = PageCacheProbe(tmp_path, 250 * 10_240, rows)
    assert all(len(chunk) % 10_240 == 0 and len(chunk) <= CHUNK_BYTES for chunk in probe.chunks)
    assert sum(len(chunk) for chunk in probe.chunks) == 250 * 10_240


def test_probe_without_source_writes_one_buffer_over_and_over(tmp_path: Path) -> None:
    probe = PageCacheProbe(tmp_path, 3 * CHUNK_BYTES + 5)
    assert probe.volume_bytes == 3 * CHUNK_BYTES and probe.source == "one 1 MiB buffer"
    probe.measure(sync=False)
    data = probe.paths[0].read_bytes()
    assert data[:CHUNK_BYTES] == data[CHUNK_BYTES : 2 * CHUNK_BYTES]
    probe.remove()


@pytest.mark.parametrize("bad", [np.zeros((0, 10), np.uint8), np.zeros(10, np.uint8),
                                 np.zeros((2, 2), np.int32), np.zeros((4, 6), np.uint8)[:, ::2]])
def test_probe_refuses_a_source_that_is_not_rows_of_bytes(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="PageCacheProbe source"):
        PageCacheProbe(tmp_path, 1 << 20, bad)


def test_two_probes_around_a_run_the_faster_is_the_limit(tmp_path: Path) -> None:
    rows = _rows(64, 4096)
    probe = PageCacheProbe(tmp_path, 2 << 20, rows)
    before = probe.measure(sync=False)
    after = probe.measure(sync=False)
    assert len(probe.paths) == 2 and all(p.stat().st_size == 2 << 20 for p in probe.paths)
    limits = limits_with_probe(probe, 2 << 20)
    try:
        assert limits.page_cache_write_bytes_per_s == max(before, after)
        assert limits.page_cache_samples_bytes_per_s == [before, after]
        assert len(limits.page_cache_probe_cpu_ns_per_byte) == 2
        out = limits.as_json()
        assert out["page_cache_probe_source"] == "run payload"
        assert len(out["page_cache_write_samples_mb_per_s"]) == 2
        report = probe_report(limits, before / 2, producer_cpu_ns=4 << 20, writer_cpu_ns=2 << 20,
                              payload_bytes=2 << 20)
        assert report["ratio_to_before"] == pytest.approx(0.5, abs=1e-4)
        assert report["ratio_to_faster"] == pytest.approx(before / 2 / max(before, after), abs=1e-4)
        assert report["ratio_to_mean"] == pytest.approx(before / (before + after), abs=1e-4)
        cheaper = min(limits.page_cache_probe_cpu_ns_per_byte)
        assert report["cpu_bound_ratio"] == pytest.approx(cheaper / 2.0, abs=1e-4)  # producer: 2 ns/B
    finally:
        limits.remove_probe_files()
    assert not any(p.exists() for p in probe.paths)


def test_probe_volume_is_the_runs_within_bounds() -> None:
    assert probe_volume_bytes(640_000_000) == 640_000_000
    assert probe_volume_bytes(1000) == 16 << 20
    assert probe_volume_bytes(10 << 30, page_cache_cap_bytes=4 << 30) == 4 << 30


def test_a_recycling_probe_writes_the_same_bytes(tmp_path: Path) -> None:
    rows = _rows(5, 4096)
    probe = PageCacheProbe(tmp_path, 12 * 4096, rows, recycle=True)
    probe.measure(sync=False)
    assert probe.paths[0].read_bytes() == b"".join(rows[i % 5].tobytes() for i in range(12))
    probe.remove()
    recycle_pages(1 << 20)  # touches and frees memory; nothing to see but that it returns
