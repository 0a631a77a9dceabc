"""The directory of one partition log: what each file in it is, the writer's lock on it, and the partition's
line in its offset checkpoints.

A partition ``<topic>-<partition>`` lives in one directory::

    my-topic-0/
        00000000000000000000.log          record batches, as producers built them (storage.segment)
        00000000000000000000.index        sparse offset index          (storage.offset_index)
        00000000000000000000.timeindex    sparse time index            (storage.time_index)
        00000000000001048576.log ...      later segments; the last one is the *active* segment
        leader-epoch-checkpoint           epoch -> start offset         (storage.checkpoints)
        recovery-point-offset-checkpoint  everything below this offset is fsynced
        log-start-offset-checkpoint       the first offset a reader may ask for
        cleaner-offset-checkpoint         the first offset no clean has seen (storage.cleaner)
        00000000000001048576.snapshot     idempotent-producer state at that offset (storage.producer_snapshot)
        .lock                             flock()ed by the one writer; holds its pid
        .clean-shutdown                   only while the log is closed cleanly (storage.clean_shutdown)
        .offline                          why the appliance did not open a damaged log (appliance repair)

Files ending in ``.cleaned``, ``.swap`` and ``.deleted`` belong to a clean's swap that a crash interrupted
(``storage.clean_swap``, which finishes or undoes it first).  Files ending in ``.tmp`` are replacements a
crash left half written (``storage.atomic_file``), and index files without their ``.log`` are left from a
segment deletion a crash interrupted: the writer deletes both when it opens the log
(:func:`remove_stray_files`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Final

from storage.atomic_file import TMP_SUFFIX, write_atomically
from storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from storage.errors import CorruptRecordError, LogLockedError
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_name, segment_path

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "FORK_GENERATION",
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "LOCK_FILE",
    "LOG_START_OFFSET_CHECKPOINT_FILE",
    "OFFLINE_FILE",
    "RECOVERY_POINT_CHECKPOINT_FILE",
    "delete_segment_files",
    "list_segment_base_offsets",
    "lock_log_directory",
    "mtime_settled",
    "parse_topic_partition",
    "read_offline_note",
    "read_partition_checkpoint",
    "remove_stray_files",
    "segment_base_offsets",
    "unlock_log_directory",
    "write_offline_note",
    "write_partition_checkpoint",
]

LOCK_FILE: Final = ".lock"
CLEAN_SHUTDOWN_FILE: Final = ".clean-shutdown"
OFFLINE_FILE: Final = ".offline"
LEADER_EPOCH_CHECKPOINT_FILE: Final = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT_FILE: Final = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE: Final = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT_FILE: Final = "cleaner-offset-checkpoint"


# twice the longest tick of the kernel's coarse clock, which mtimes are taken from (HZ=100: 10 ms)
MTIME_TICK_NS: Final = 20_000_000


def mtime_settled(mtime_ns: int, seen_ns: int) -> bool:
    """True when any change made at or after ``seen_ns`` (``time.time_ns()``) gives a file or directory an
    mtime other than ``mtime_ns``: its tick was over by then.  Within the tick, a second change leaves the
    mtime as the first set it, so an unchanged mtime proves nothing."""
    return seen_ns - mtime_ns > MTIME_TICK_NS


def parse_topic_partition(directory: str) -> tuple[str, int] | None:
    """``("my-topic", 3)`` for a directory named ``my-topic-3``, else None."""
    topic, sep, partition = os.path.basename(os.path.normpath(directory)).rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


def list_segment_base_offsets(directory: str) -> list[int]:
    """Base offsets of the ``.log`` files in ``directory``, sorted."""
    return segment_base_offsets(os.listdir(directory))


def segment_base_offsets(names: list[str]) -> list[int]:
    """Base offsets of the ``.log`` files among ``names`` (a directory listing), sorted."""
    bases = []
    for name in names:
        base = parse_segment_name(name, LOG_SUFFIX)
        if base is not None:
            bases.append(base)
    return sorted(bases)


def lock_log_directory(directory: str, name: str) -> int:
    """Take the writer's exclusive ``flock`` on ``directory/.lock`` and write this pid into it; returns the
    descriptor that holds the lock.  :class:`LogLockedError` (naming the holder's pid) if another has it."""
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").partition("\n")[0].strip() or "unknown"
        os.close(fd)
        raise LogLockedError(
            f"partition {name}: log directory {directory} is already open for writing by process {holder} "
            f"(flock on {path}); a log has exactly one writer"
        ) from None
    pid = f"{os.getpid()}\n".encode()
    os.pwrite(fd, pid, 0)
    os.ftruncate(fd, len(pid))  # after the write: a file truncated to 0 is flushed by ext4 on close
    return fd


def unlock_log_directory(fd: int) -> None:
    """Release the lock :func:`lock_log_directory` took and close its descriptor."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


FORK_GENERATION = [0]  # bumped in every forked child: a Log opened before a fork refuses to append after it


def _forked() -> None:
    FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_forked)


def delete_segment_files(directory: str, base_offset: int) -> None:
    """Unlink a segment's ``.log``, ``.index`` and ``.timeindex`` (those that exist)."""
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment_path(directory, base_offset, suffix))


def remove_stray_files(directory: str) -> None:
    """Delete what a crash left: ``*.tmp`` files and index files whose ``.log`` is gone."""
    names = os.listdir(directory)
    logs = {parse_segment_name(n, LOG_SUFFIX) for n in names} - {None}
    for name in names:
        orphan = any(
            parse_segment_name(name, suffix) is not None and parse_segment_name(name, suffix) not in logs
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
        )
        if name.endswith(TMP_SUFFIX) or orphan:
            os.unlink(os.path.join(directory, name))


def read_partition_checkpoint(directory: str, name: str, topic_partition: tuple[str, int]) -> int | None:
    """The partition's offset in the checkpoint file ``name`` of its directory (a file whose one line has
    another key counts as this partition's); None when there is no file or it lists nothing."""
    path = os.path.join(directory, name)
    entries = read_offset_checkpoint(path)
    if not entries:
        return None
    key = _checkpoint_key(topic_partition)
    if key in entries:
        return entries[key]
    if len(entries) == 1:
        return next(iter(entries.values()))
    raise CorruptRecordError(f"checkpoint file {path}: no entry for {key[0]} {key[1]}")


def write_partition_checkpoint(directory: str, name: str, topic_partition: tuple[str, int],
                               offset: int) -> None:
    """Replace the checkpoint file ``name`` of the directory with the partition's one line."""
    write_offset_checkpoint(os.path.join(directory, name), {_checkpoint_key(topic_partition): offset})


def _checkpoint_key(topic_partition: tuple[str, int]) -> tuple[str, int]:
    topic, partition = topic_partition
    return "_".join(topic.split()) or "_", partition


def write_offline_note(directory: str, reason: str | None) -> None:
    """Write (``reason``) or remove (None) the ``.offline`` note: why the log was not opened.  Readers of
    the directory (local consumers) refuse an offline partition with that reason."""
    path = os.path.join(directory, OFFLINE_FILE)
    if reason is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    write_atomically(path, reason.encode() + b"\n")


def read_offline_note(directory: str) -> str | None:
    """The reason in the ``.offline`` note, or None when the partition is not marked offline."""
    try:
        with open(os.path.join(directory, OFFLINE_FILE), "rb") as f:
            return f.read().decode(errors="replace").strip() or "its log is damaged"
    except (FileNotFoundError, NotADirectoryError):
        return None
