"""The cleaner's choice of log (dirty ratio, cleanable bound, overdue) and its I/O throttle, on views built
by hand and a fake clock."""

from __future__ import annotations

from pathlib import Path

from appliance.cleaner.choice import Dirt, cleanable_bound, measure, pick
from appliance.cleaner.log_view import LogView
from appliance.cleaner.throttle import NO_LIMIT_BYTES_PER_S, Throttle
from appliance.config.settings import LONG_MAX
from storage.log_config import LogConfig
from storage.log_dir import CLEANER_OFFSET_CHECKPOINT_FILE, write_partition_checkpoint
from storage.segment_list import SegmentInfo

NOW_MS = 1_000_000


def _view(tmp_path: Path, bases: list[int], sizes: list[int], *, high_watermark: int, ages_ms: list[int],
          first_dirty: int | None = None) -> LogView:
    infos = [SegmentInfo(base, str(tmp_path / f"{base:020d}.log"), size,
                         bases[i + 1] if i + 1 < len(bases) else base + 10, NOW_MS - age, i == len(bases) - 1)
             for i, (base, size, age) in enumerate(zip(bases, sizes, ages_ms, strict=True))]  # fmt: skip
    if first_dirty is not None:
        write_partition_checkpoint(str(tmp_path), CLEANER_OFFSET_CHECKPOINT_FILE, ("t", 0), first_dirty)
    return LogView(str(tmp_path), LogConfig(), ("t", 0), bases[0], infos[-1].next_offset, high_watermark,
                   infos, lambda *_: None)


def test_the_dirty_ratio_counts_closed_segments_from_the_first_dirty_offset(tmp_path: Path) -> None:
    view = _view(tmp_path, [0, 100, 200, 300], [1000, 1000, 3000, 500], high_watermark=310,
                 ages_ms=[0, 0, 0, 0], first_dirty=100)
    dirt = measure(view, min_compaction_lag_ms=0, max_compaction_lag_ms=LONG_MAX, now_ms=NOW_MS)
    assert (dirt.first_dirty_offset, dirt.upper_bound) == (100, 300)  # the active segment is never cleanable
    assert (dirt.clean_bytes, dirt.dirty_bytes) == (1000, 4000)
    assert dirt.ratio == 0.8 and not dirt.overdue


def test_the_bound_stops_at_the_high_watermark_and_the_min_compaction_lag(tmp_path: Path) -> None:
    view = _view(tmp_path, [0, 100, 200, 300], [1000] * 4, high_watermark=150, ages_ms=[9000, 9000, 10, 0])
    assert cleanable_bound(view, 0, NOW_MS) == 150
    view.high_watermark = 310
    assert cleanable_bound(view, 0, NOW_MS) == 300
    assert cleanable_bound(view, 5000, NOW_MS) == 200  # segment 200 was appended to 10 ms ago
    dirt = measure(view, min_compaction_lag_ms=5000, max_compaction_lag_ms=LONG_MAX, now_ms=NOW_MS)
    assert dirt.dirty_bytes == 2000


def test_overdue_by_max_compaction_lag(tmp_path: Path) -> None:
    view = _view(tmp_path, [0, 100, 200], [10, 1000, 5], high_watermark=210, ages_ms=[60_000, 60_000, 0],
                 first_dirty=100)
    assert measure(view, min_compaction_lag_ms=0, max_compaction_lag_ms=30_000, now_ms=NOW_MS).overdue
    assert not measure(view, min_compaction_lag_ms=0, max_compaction_lag_ms=90_000, now_ms=NOW_MS).overdue


def test_pick_takes_an_overdue_log_first_then_the_dirtiest_above_its_ratio() -> None:
    def dirt(ratio: float, dirty: int, overdue: bool = False) -> Dirt:
        return Dirt(0, 0, dirty, 0, ratio, overdue)

    assert pick([(dirt(0.4, 10), 0.5), (dirt(0.3, 10), 0.5)]) is None
    assert pick([(dirt(0.6, 10), 0.5), (dirt(0.9, 10), 0.5), (dirt(0.7, 10), 0.5)]) == 1
    assert pick([(dirt(0.3, 10), 0.2), (dirt(0.9, 10), 0.95)]) == 0  # each against its own ratio
    assert pick([(dirt(0.9, 10), 0.5), (dirt(0.1, 5, overdue=True), 0.5)]) == 1
    assert pick([(dirt(0.0, 0), 0.0)]) is None  # nothing dirty: nothing to clean, even at ratio 0


def test_the_throttle_sleeps_off_what_exceeds_the_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttle = Throttle(1000.0, clock=lambda: now[0], sleep=sleep)
    throttle(100)  # under the check period's share: no sleep
    assert slept == []
    throttle(900)  # 1000 bytes at t=0: one second owed
    assert slept == [1.0]
    now[0] += 5.0
    throttle(1000)  # slower than the rate already: no sleep
    assert slept == [1.0]
    unlimited = Throttle(NO_LIMIT_BYTES_PER_S * 10, clock=lambda: 0.0, sleep=sleep)
    unlimited(10**12)
    assert slept == [1.0]
