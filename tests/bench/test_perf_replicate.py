"""bench.replicate's leader log: ``batch_sizes`` reads a segment's batches, ``fill_full_batches``
fills a topic with full ``batch.size`` batches (the catch-up bench's log; see the module's docstring)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.harness import Appliance
from bench.produce import ProduceSettings
from bench.replicate import _segment_paths, batch_sizes, fill_full_batches
from storage.batch_builder import build_batch
from storage.log import Log


def _segment(tmp_path: Path, counts: list[int]) -> tuple[str, list[int]]:
    log = Log.open(str(tmp_path / "t-0"), topic_partition=("t", 0))
    sizes = []
    try:
        for count in counts:
            batch = build_batch([b"v" * 50] * count)
            sizes.append(len(batch))
            log.append(bytearray(batch), leader_epoch=0)
    finally:
        log.close()
    return str(next((tmp_path / "t-0").glob("*.log"))), sizes


def test_batch_sizes_are_the_appended_batches(tmp_path: Path) -> None:
    path, sizes = _segment(tmp_path, [1, 7, 300, 2])
    assert batch_sizes([path]) == sizes
    assert batch_sizes([path, path]) == sizes + sizes


def test_batch_sizes_stop_at_a_torn_tail_or_zeros(tmp_path: Path) -> None:
    path, sizes = _segment(tmp_path, [3, 5, 8])
    whole = sum(sizes)
    with open(path, "r+b") as f:
        f.truncate(whole)
    for cut in (whole - 1, whole - sizes[-1] + 5, sizes[0] + 1, 3, 0):
        with open(path, "r+b") as f:
            f.truncate(cut)
        kept = 0
        expected = []
        for size in sizes:
            if kept + size <= cut:
                expected.append(size)
                kept += size
        assert batch_sizes([path]) == expected, cut
    path, sizes = _segment(tmp_path / "again", [3, 5])
    with open(path, "r+b") as f:  # preallocated zeros after the last batch
        f.truncate(sum(sizes) + 4096)
    assert batch_sizes([path]) == sizes


def test_fill_full_batches_makes_every_batch_but_the_last_full(tmp_path: Path) -> None:
    batch_bytes = 64 * 1024
    with Appliance.start(tmp_path / "data", overrides=["listeners=PLAINTEXT://127.0.0.1:0"]) as app:
        app.create_topic("full", 1)
        settings = ProduceSettings(records=5_000, record_size=1024, batch_size=batch_bytes)
        fill_full_batches(app, settings, "full")
        assert app.end_offsets("full") == [5_000]
        sizes = batch_sizes(_segment_paths(app, "full"))
    assert sum(sizes) == sum(os.path.getsize(p) for p in (tmp_path / "data" / "full-0").glob("*.log"))
    assert len(set(sizes[:-1])) == 1, sizes  # one size: each as many records as a batch holds
    assert batch_bytes - 1100 < sizes[0] <= batch_bytes  # no room left for another 1 KiB record
    assert sizes[-1] <= sizes[0]
