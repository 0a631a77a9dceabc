"""Which closed segments retention deletes: a pure function of the segments' sizes and timestamps.

Kafka's three rules, each deleting a prefix of the log (oldest segments first) and never the active (last)
segment:

1. time: ``retention.ms`` >= 0 and the segment's largest timestamp is more than ``retention.ms`` before now
   (a segment without timestamps uses its file's modification time);
2. size: ``retention.bytes`` >= 0 and the log without this segment (and the ones before it) would still
   hold at least ``retention.bytes``;
3. log start: the segment lies wholly below the log start offset (the next segment starts at or below it).

and, when the caller passes the high watermark, only segments wholly below it (a follower may still need
the rest).  The log applies the plan (``Log.delete_retained_segments``): it advances the log start offset
to the first kept segment, persists it, then unlinks the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["RetentionCandidate", "segments_to_delete"]


class RetentionCandidate(NamedTuple):
    base_offset: int
    next_offset: int  # offset after its last batch
    size_bytes: int
    largest_timestamp_ms: int


def segments_to_delete(
    segments: Sequence[RetentionCandidate],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    log_start_offset: int,
    high_watermark: int | None = None,
) -> int:
    """How many leading segments to delete (the last segment is the active one and never counts)."""
    closed = len(segments) - 1
    if closed <= 0:
        return 0
    by_time = 0
    if retention_ms >= 0:
        while by_time < closed and now_ms - segments[by_time].largest_timestamp_ms > retention_ms:
            by_time += 1
    by_size = 0
    if retention_bytes >= 0:
        remaining = sum(s.size_bytes for s in segments)
        while by_size < closed and remaining - segments[by_size].size_bytes >= retention_bytes:
            remaining -= segments[by_size].size_bytes
            by_size += 1
    by_start = 0
    while by_start < closed and segments[by_start + 1].base_offset <= log_start_offset:
        by_start += 1
    count = max(by_time, by_size, by_start)
    if high_watermark is not None:
        below = 0
        while below < count and segments[below].next_offset <= high_watermark:
            below += 1
        count = below
    return count
