"""Recovery of a partition log after an unclean stop: which segments to check, and what to do with damage.

Rules (applied by :func:`load_segments`, called by ``Log.open``):

1. After a clean close (the log wrote ``.clean-shutdown``) nothing is scanned: every segment is loaded, its
   indexes sanity-checked, and an index that fails is rebuilt from its ``.log`` file.
2. Otherwise the segments below the *recovery point* (the offset below which everything was fsynced, from
   ``recovery-point-offset-checkpoint``) are trusted the same way, and every segment from the one holding the
   recovery point to the last is scanned: each batch's structure, offsets and CRC-32C are checked
   (``storage.batch_scan``) and both indexes are rebuilt from what is valid.
3. An invalid batch in the *last* segment is a torn or corrupt tail: the file is cut at that batch (the valid
   prefix is kept, nothing after it) and a warning names the file, the position and the reason.
4. An invalid batch in any *other* segment is never skipped nor cut silently: later segments hold data after
   it.  :class:`~storage.errors.CorruptRecordError` names the file, the position, the offsets and the broken
   rule, and the log does not open.  (Restore the partition from a replica, or cut the log there by hand.)
5. Segments must not overlap: a segment whose data runs into the next segment's base offset is rule 4.

The leader epochs found in scanned batches are returned so the log can re-assign them to its leader-epoch
cache (which may have missed them if the stop came before the checkpoint was written).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from storage.batch_scan import describe, scan_segment
from storage.errors import CorruptRecordError
from storage.log_config import LogConfig
from storage.segment import LOG_SUFFIX, LogSegment, segment_path

__all__ = ["RecoveryResult", "TruncatedTail", "load_segments"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TruncatedTail:
    """What rule 3 cut: the file, where, why and how many bytes."""

    path: str
    position: int
    reason: str
    bytes_dropped: int


@dataclass(slots=True)
class RecoveryResult:
    segments: list[LogSegment]
    scanned: list[LogSegment] = field(default_factory=list)  # segments checked batch by batch (rule 2)
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)
    truncated: TruncatedTail | None = None
    scanned_bytes: int = 0


def load_segments(
    directory: str,
    config: LogConfig,
    base_offsets: Sequence[int],
    *,
    clean: bool,
    recovery_point: int,
    check_crc: bool = True,
) -> RecoveryResult:
    """Open the segments with these base offsets (sorted, non-empty), recovering as the rules say.

    The last segment is returned active (open for appends).  On an error every segment opened so far is
    closed again before the exception propagates.
    """
    result = RecoveryResult(segments=[])
    last = len(base_offsets) - 1
    first_unflushed = last + 1
    if not clean:
        first_unflushed = 0
        for i, base in enumerate(base_offsets):
            if base <= recovery_point:
                first_unflushed = i
    try:
        for i, base in enumerate(base_offsets):
            next_base = base_offsets[i + 1] if i < last else None
            if i < first_unflushed:
                result.segments.append(
                    LogSegment.load(directory, base, config, active=i == last, next_offset_limit=next_base)
                )
                continue
            segment = _recover_segment(directory, config, base, next_base, check_crc, result)
            result.segments.append(segment)
            result.scanned.append(segment)
    except BaseException:
        for segment in result.segments:
            segment.close()
        raise
    return result


def _recover_segment(directory: str, config: LogConfig, base: int, next_base: int | None, check_crc: bool,
                     result: RecoveryResult) -> LogSegment:
    path = segment_path(directory, base, LOG_SUFFIX)
    scan = scan_segment(path, base, index_interval_bytes=config.index_interval_bytes, check_crc=check_crc)
    size = os.stat(path).st_size
    result.scanned_bytes += size
    if scan.error is not None:
        if next_base is not None:
            raise CorruptRecordError(
                f"{describe(path, scan.error)}; this is a closed segment (segment {next_base} follows), so "
                "it is not truncated: restore the partition from a replica or remove the damaged segments"
            )
        dropped = size - scan.valid_bytes
        _log.warning("%s: truncating the log tail at position %d (%d bytes dropped): %s",
                     path, scan.valid_bytes, dropped, describe(path, scan.error))
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, scan.valid_bytes)
        finally:
            os.close(fd)
        result.truncated = TruncatedTail(path, scan.valid_bytes, scan.error.reason, dropped)
    if next_base is not None and scan.next_offset > next_base:
        raise CorruptRecordError(
            f"{path}: its batches run to offset {scan.next_offset - 1}, into the next segment which starts "
            f"at offset {next_base}"
        )
    result.epoch_starts.extend(scan.epoch_starts)
    return LogSegment.from_scan(directory, base, config, scan, active=next_base is None)
