"""Opening a partition directory for its writer: what a stop of any kind left, made consistent.

:func:`load_log` is the writer's whole start-up, in this order:

1. finish or undo a clean's swap that a crash interrupted (``storage.clean_swap``), read ``.clean-shutdown``
   (a clean close: ``storage.clean_shutdown``) and delete what a crash left behind
   (``storage.log_dir.remove_stray_files``); the close is trusted if the directory is as it recorded;
2. read the leader-epoch cache and the recovery-point and log-start-offset checkpoints;
3. delete segments wholly below the log start offset (a crash between moving the log start offset and
   deleting the files leaves them);
4. load the segments, recovering those from the recovery point on after an unclean stop
   (``storage.recovery``: its rules), or create the first, empty segment at the log start offset;
5. re-assign the leader epochs found in recovered batches, then cut the epoch cache to the log's offsets;
6. write both checkpoints (every segment loaded is on disk, so the recovery point is the log end), then
   remove ``.clean-shutdown``: from here on the directory is being written.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from storage.atomic_file import fsync_directory
from storage.checkpoints import LeaderEpochCache
from storage.clean_shutdown import CleanStop, read_clean_stop
from storage.clean_swap import finish_interrupted_swap
from storage.log_config import LogConfig
from storage.log_dir import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    delete_segment_files,
    list_segment_base_offsets,
    read_partition_checkpoint,
    remove_stray_files,
    write_partition_checkpoint,
)
from storage.recovery import load_segments
from storage.segment import LogSegment

__all__ = ["LoadedLog", "load_log"]

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedLog:
    """A log's state after :func:`load_log`: its segments (the last one active), offsets and epochs."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    epochs: LeaderEpochCache


def load_log(directory: str, config: LogConfig, topic_partition: tuple[str, int], *,
             check_crc: bool) -> LoadedLog:
    """Steps 1-6 above, for the writer holding the directory's lock.  ``check_crc=False`` walks the
    recovered segments' structure without checking their CRCs."""
    tp = topic_partition
    clean_marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
    finish_interrupted_swap(directory)
    marker = read_clean_stop(clean_marker)
    remove_stray_files(directory)
    epochs = LeaderEpochCache.load(os.path.join(directory, LEADER_EPOCH_CHECKPOINT_FILE))
    recovery_point = read_partition_checkpoint(directory, RECOVERY_POINT_CHECKPOINT_FILE, tp) or 0
    log_start_offset = read_partition_checkpoint(directory, LOG_START_OFFSET_CHECKPOINT_FILE, tp) or 0
    bases = list_segment_base_offsets(directory)
    clean = _trust_clean_stop(directory, marker, bases)
    while len(bases) > 1 and bases[1] <= log_start_offset:
        delete_segment_files(directory, bases.pop(0))
    if not bases:
        segments = [LogSegment.create(directory, log_start_offset, config)]
    else:
        result = load_segments(directory, config, bases, clean=clean, recovery_point=recovery_point,
                               check_crc=check_crc)
        segments = result.segments
        for epoch, start in result.epoch_starts:
            if epoch > epochs.latest_epoch:
                epochs.assign(epoch, start)
        for segment in result.scanned:
            segment.flush()
    log_start_offset = max(log_start_offset, segments[0].base_offset)
    log_end_offset = segments[-1].next_offset
    epochs.truncate_from_end(log_end_offset)
    epochs.truncate_from_start(log_start_offset)
    write_partition_checkpoint(directory, RECOVERY_POINT_CHECKPOINT_FILE, tp, log_end_offset)
    write_partition_checkpoint(directory, LOG_START_OFFSET_CHECKPOINT_FILE, tp, log_start_offset)
    if marker is not None:
        os.unlink(clean_marker)
        fsync_directory(directory)
    return LoadedLog(segments, log_start_offset, log_end_offset, epochs)


def _trust_clean_stop(directory: str, marker: CleanStop | str | None, bases: list[int]) -> bool:
    """Step 1's check: True if the marker is there and the directory is as the clean stop recorded it."""
    if marker is None:
        return False
    problem = marker if isinstance(marker, str) else marker.check(directory, bases)
    if problem is None:
        return True
    _log.warning("%s: not as the clean stop left it: %s; recovering it as after a crash", directory, problem)
    return False
