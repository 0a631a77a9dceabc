"""Which log the cleaner cleans next, and up to where: Kafka's ``LogCleanerManager`` choice.

For each compacted partition (``cleanup.policy`` holding ``compact``) the cleaner lists a
:class:`~appliance.cleaner.log_view.LogView` and computes:

* the **cleanable bound** (:func:`cleanable_bound`): the smallest of the high watermark, the active
  segment's base offset and, with ``min.compaction.lag.ms`` above 0, the base offset of the first segment
  whose newest record is younger than that lag;
* the **dirty ratio** (:func:`measure`): the bytes of the closed segments from the first dirty offset
  (``cleaner-offset-checkpoint``) up to the bound, over those bytes plus the bytes of the segments
  already cleaned below it;
* **overdue**: ``max.compaction.lag.ms`` is set and the first dirty segment's newest record is older than it.

:func:`pick` takes an overdue log first (the most dirty bytes), else the highest dirty ratio at or above
its ``min.cleanable.dirty.ratio``; none: the cleaner sleeps ``log.cleaner.backoff.ms``.  :func:`dirtiest`
does both over a round's partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, TypeVar

from appliance.cleaner.log_view import LogView
from appliance.config.server_config import TopicConfig
from appliance.config.settings import LONG_MAX
from storage.cleaner import first_dirty_offset

__all__ = ["Dirt", "cleanable_bound", "dirtiest", "measure", "pick"]

T = TypeVar("T")


class Dirt(NamedTuple):
    """How much of a log a clean would cover."""

    first_dirty_offset: int
    upper_bound: int
    dirty_bytes: int
    clean_bytes: int
    ratio: float
    overdue: bool


def cleanable_bound(view: LogView, min_compaction_lag_ms: int, now_ms: int) -> int:
    """The offset a clean stays below (see the module docstring)."""
    bound = min(view.high_watermark, view.segments[-1].base_offset)
    if min_compaction_lag_ms > 0:
        for info in view.segments[:-1]:
            if info.max_timestamp > now_ms - min_compaction_lag_ms:
                return min(bound, info.base_offset)
    return bound


def measure(view: LogView, *, min_compaction_lag_ms: int, max_compaction_lag_ms: int, now_ms: int) -> Dirt:
    """The log's dirty bytes, clean bytes, ratio and whether it is overdue."""
    start = first_dirty_offset(view)
    bound = cleanable_bound(view, min_compaction_lag_ms, now_ms)
    clean = dirty = 0
    first_dirty_ms: int | None = None
    for info in view.segments[:-1]:
        if info.next_offset <= start:
            clean += info.size_bytes
        elif info.next_offset <= bound:
            dirty += info.size_bytes
            if first_dirty_ms is None:
                first_dirty_ms = info.max_timestamp
    ratio = dirty / (clean + dirty) if dirty else 0.0
    overdue = (dirty > 0 and max_compaction_lag_ms < LONG_MAX and first_dirty_ms is not None
               and first_dirty_ms <= now_ms - max_compaction_lag_ms)  # fmt: skip
    return Dirt(start, bound, dirty, clean, ratio, overdue)


def pick(candidates: Sequence[tuple[Dirt, float]]) -> int | None:
    """The index of the log to clean among ``(dirt, min.cleanable.dirty.ratio)`` pairs, or None."""
    overdue = [(d.dirty_bytes, i) for i, (d, _) in enumerate(candidates) if d.overdue]
    if overdue:
        return max(overdue)[1]
    ready = [(d.ratio, i) for i, (d, least) in enumerate(candidates) if d.dirty_bytes and d.ratio >= least]
    return max(ready)[1] if ready else None


def dirtiest(candidates: Iterable[tuple[T, LogView, TopicConfig]],
             now_ms: int) -> tuple[T, LogView, Dirt] | None:
    """Measure every ``(partition, its view, its topic's settings)`` and pick the one to clean (with its
    view and dirt), or None."""
    measured = [(item, view, measure(view, min_compaction_lag_ms=settings.min_compaction_lag_ms,
                                     max_compaction_lag_ms=settings.max_compaction_lag_ms, now_ms=now_ms),
                 settings.min_cleanable_dirty_ratio)
                for item, view, settings in candidates]  # fmt: skip
    chosen = pick([(dirt, least) for _, _, dirt, least in measured])
    if chosen is None:
        return None
    item, view, dirt, _ = measured[chosen]
    return item, view, dirt
