"""Recovery of a partition log after an unclean stop: which segments to check, and what to do with damage.

Rules (applied by :func:`load_segments`, called by ``Log.open``):

1. After a clean close nothing is scanned: every segment is loaded and its indexes sanity-checked (an index
   that fails is rebuilt from its ``.log`` file).  The close is trusted only if the directory is as the
   clean close recorded it (``storage.clean_shutdown``: the active segment's size and last batch);
   otherwise the stop counts as unclean (rule 2) and a warning says what differs.
2. Otherwise the segments below the *recovery point* (the offset below which everything was fsynced, from
   ``recovery-point-offset-checkpoint``) are trusted the same way, and every segment from the one holding the
   recovery point to the last is scanned: each batch's structure, offsets and CRC-32C are checked
   (``storage.batch_scan``) and both indexes are rebuilt from what is valid.  A trusted segment that does not
   load (its batch headers do not end where the file does, or its index rebuild meets an invalid batch) is
   scanned the same way.
3. An invalid batch after which nothing valid follows up to the end of the log (``storage.log_damage``) is
   a torn or garbage tail: the file is cut at that batch (the valid prefix is kept) and a warning names the
   file, the position, the offsets and the reason.  In a closed segment it is cut only if its valid prefix
   ends exactly where the next segment begins (the bytes hold no offset); else rule 4.
4. An invalid batch with a valid batch after it, in the same file or in a later segment, is corruption:
   records after it were acknowledged, so nothing is cut.  :class:`~storage.errors.LogCorruptionError`
   (carrying a ``storage.log_damage.LogDamage``) names the file, the position, the offsets, the reason and
   where valid batches resume, and the log does not open.  A person decides (``appliance repair``,
   ``storage.log_repair``, cuts the log there; or restore the partition from a replica).
5. Segments must not overlap: a segment whose data runs into the next segment's base offset raises
   :class:`~storage.errors.CorruptRecordError` and the log does not open.

The leader epochs found in scanned batches are returned so the log can re-assign them to its leader-epoch
cache (which may have missed them if the stop came before the checkpoint was written).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from storage.batch_scan import SegmentScan, scan_segment
from storage.errors import CorruptRecordError, LogCorruptionError
from storage.log_config import LogConfig
from storage.log_damage import LogDamage, find_resumption
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
        for i in range(len(base_offsets)):
            if i < first_unflushed:
                trusted = _load_trusted(directory, config, base_offsets, i)
                if trusted is not None:
                    result.segments.append(trusted)
                    continue
            segment = _recover_segment(directory, config, base_offsets, i, check_crc, result)
            result.segments.append(segment)
            result.scanned.append(segment)
    except BaseException:
        for segment in result.segments:
            segment.close()
        raise
    return result


def _load_trusted(directory: str, config: LogConfig, base_offsets: Sequence[int],
                  i: int) -> LogSegment | None:
    """A trusted segment (rules 1 and 2), or None if it does not load: then it is scanned."""
    last = len(base_offsets) - 1
    next_base = base_offsets[i + 1] if i < last else None
    try:
        return LogSegment.load(directory, base_offsets[i], config, active=i == last,
                               next_offset_limit=next_base)
    except CorruptRecordError as exc:
        _log.warning("%s; checking the segment batch by batch, as after a crash", exc)
        return None


def _recover_segment(directory: str, config: LogConfig, base_offsets: Sequence[int], i: int,
                     check_crc: bool, result: RecoveryResult) -> LogSegment:
    base = base_offsets[i]
    next_base = base_offsets[i + 1] if i + 1 < len(base_offsets) else None
    path = segment_path(directory, base, LOG_SUFFIX)
    scan = scan_segment(path, base, index_interval_bytes=config.index_interval_bytes, check_crc=check_crc)
    size = os.stat(path).st_size
    result.scanned_bytes += size
    if scan.error is not None:
        no_gap = next_base is None or scan.next_offset == next_base  # the bytes after it hold no offset
        resumes = find_resumption(directory, base_offsets, i, scan.error, later_segments=not no_gap)
        damage = LogDamage.from_scan(path, base, scan.error, scan.next_offset, resumes)
        if resumes is not None:
            raise LogCorruptionError(f"{damage.describe()}; the log is not opened (rule 4)", damage)
        if next_base is not None and not no_gap:
            raise LogCorruptionError(
                f"{damage.describe()}; but the segment is closed and segment {next_base} follows: cutting "
                f"it would leave offsets {scan.next_offset}..{next_base - 1} missing; the log is not opened",
                damage)
        result.truncated = _cut(path, size, scan, damage)
    if next_base is not None and scan.next_offset > next_base:
        raise CorruptRecordError(
            f"{path}: its batches run to offset {scan.next_offset - 1}, into the next segment which starts "
            f"at offset {next_base}"
        )
    result.epoch_starts.extend(scan.epoch_starts)
    return LogSegment.from_scan(directory, base, config, scan, active=next_base is None)


def _cut(path: str, size: int, scan: SegmentScan, damage: LogDamage) -> TruncatedTail:
    """Rule 3: cut the file at the invalid batch, with a warning naming the file, position and offsets."""
    dropped = size - scan.valid_bytes
    _log.warning("%s: truncating the log tail at position %d (%d bytes dropped; the segment now ends at "
                 "offset %d): %s", path, scan.valid_bytes, dropped, scan.next_offset - 1, damage.describe())
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, scan.valid_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    return TruncatedTail(path, scan.valid_bytes, damage.reason, dropped)
