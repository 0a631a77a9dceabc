"""ListOffsets over a log's segments: the offset a timestamp, or one of Kafka's special timestamps, names.

``EARLIEST_TIMESTAMP`` (-2) and ``LATEST_TIMESTAMP`` (-1) name the log start and end offsets (timestamp -1);
``MAX_TIMESTAMP`` (-3) the first record holding the largest timestamp; any other value the first record (at
or after the log start offset) whose timestamp is >= it (``storage.timestamp_search``).  ``Log`` answers
with :func:`offset_for_timestamp` over its own segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from storage.segment import LogSegment, OffsetAndTimestamp
from storage.timestamp_search import MAX_TIMESTAMP, record_at_or_after, record_of_max_timestamp

__all__ = ["EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "offset_for_timestamp"]

EARLIEST_TIMESTAMP: Final = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP: Final = -1  # ListOffsets: the log end offset


def offset_for_timestamp(segments: Sequence[LogSegment], timestamp_ms: int, *, log_start_offset: int,
                         log_end_offset: int) -> OffsetAndTimestamp | None:
    """The offset and timestamp ``timestamp_ms`` names in ``segments`` (the module docstring), or None."""
    if timestamp_ms == EARLIEST_TIMESTAMP:
        return OffsetAndTimestamp(log_start_offset, -1)
    if timestamp_ms == LATEST_TIMESTAMP:
        return OffsetAndTimestamp(log_end_offset, -1)
    if timestamp_ms == MAX_TIMESTAMP:
        return record_of_max_timestamp(segments, log_start_offset=log_start_offset, verify=False)
    return record_at_or_after(segments, timestamp_ms, log_start_offset=log_start_offset, verify=False)
