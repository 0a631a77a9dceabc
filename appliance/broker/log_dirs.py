"""Bytes on disk per partition, and the broker's answer to DescribeLogDirs (Kafka API 35, v0-1).

Theory of operation
-------------------
Kafka reports a partition's size as the size of its log: the sum of its segments' ``.log`` files, indexes
and checkpoints not counted.  :func:`partition_size_bytes` measures that from the directory listing (one
``stat`` per segment, no file opened), so it is right while the writer appends: a reader may see a batch
the writer is still writing counted in the size, never a size that shrinks except by retention and
compaction.

A clean swaps segments with renames (``storage.clean_swap``); Kafka's segment map changes in one step, so
its size is the old segments' until the swap commits and the new one's after.  The listing says which:
before the commit (no ``<base>.log.swap``) the replaced segments, renamed ``.log.deleted``, are still the
log and are counted; from the commit on the ``.log.swap`` file is, and the ``.deleted`` ones are not (a swap
of several groups commits group by group: ``storage.clean_swap.log_files_now`` applies its rule).  A
``.cleaned`` file (a clean's output not swapped in yet) is never counted.

Two callers, one rule:

* ``appliance topics describe`` on the local path (``--control-socket``/``--data-dir``) measures the
  partition directories the control socket names;
* the broker answers DescribeLogDirs (``--bootstrap-server``, and Kafka's own ``kafka-log-dirs.sh`` or
  ``AdminClient.describeLogDirs``) with :func:`describe_log_dirs`: one result per log dir in ``log.dirs``
  (its absolute path), listing the partitions whose directories live there -- every partition this
  appliance holds, led here or followed -- with their sizes.  A request naming topics limits the answer to
  those partitions; names and partitions that do not exist are left out, as Kafka does.  ``offset_lag`` is
  Kafka's for a current (not future) log: ``max(0, high watermark - log end offset)``, 0 for a partition led
  here (its high watermark never passes its log end offset) and for one whose state page is not readable.

A log dir that cannot be listed (unmounted, permissions) answers ``KAFKA_STORAGE_ERROR`` with no topics,
the other dirs are answered normally.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ipc.kafka import ErrorCode
from ipc.kafka.messages import (
    DescribeLogDirsPartition,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
)

if TYPE_CHECKING:
    from appliance.broker.partitions import PartitionTable

__all__ = ["describe_log_dirs", "partition_size_bytes"]


def partition_size_bytes(directory: str) -> int:
    """Bytes of the segment files (``<base offset>.log``) in a partition directory, as Kafka's ``Log.size``;
    during a clean's swap, the segments that are the log at that moment (module docstring).

    Raises OSError (FileNotFoundError, PermissionError) if the directory cannot be listed; a segment deleted
    or renamed between the listing and its ``stat`` (retention, a swap) counts 0.
    """
    # (storage.segment loads numba: imported here, not for every CLI command that imports this module)
    from storage.clean_swap import log_files_now

    with os.scandir(directory) as listing:
        entries = list(listing)
    counted = set(log_files_now([e.name for e in entries]))
    total = 0
    for entry in entries:
        if entry.name not in counted:
            continue
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total


def describe_log_dirs(table: PartitionTable, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    """The DescribeLogDirs answer for the partitions ``table`` knows, by log dir (see the module doc)."""
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for topic in request.topics:
            wanted.setdefault(topic.topic, set()).update(topic.partitions)
    log_dirs = [os.path.abspath(d) for d in table.log_dirs]
    # log dir -> topic -> partitions found there
    found: dict[str, dict[str, list[DescribeLogDirsPartition]]] = {d: {} for d in log_dirs}
    failed: set[str] = {d for d in log_dirs if not os.path.isdir(d)}
    for name in sorted(table.topics):
        meta = table.topics[name]
        indexes = range(meta.partitions) if wanted is None else sorted(wanted.get(name, ()))
        for index in indexes:
            if not 0 <= index < meta.partitions:
                continue
            where = _partition_directory(log_dirs, meta.directories.get(index), name, index)
            if where is None:
                continue
            log_dir, directory = where
            if log_dir in failed:
                continue
            try:
                size_bytes = partition_size_bytes(directory)
            except OSError:
                failed.add(log_dir)
                continue
            found.setdefault(log_dir, {}).setdefault(name, []).append(
                DescribeLogDirsPartition(
                    partition_index=index,
                    partition_size=size_bytes,
                    offset_lag=_offset_lag(table, name, index),
                    is_future_key=False,
                )
            )
    results = []
    for log_dir, topics in found.items():
        if log_dir in failed:
            results.append(DescribeLogDirsResult(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=log_dir))
            continue
        results.append(
            DescribeLogDirsResult(
                error_code=ErrorCode.NONE,
                log_dir=log_dir,
                topics=[DescribeLogDirsTopic(name=t, partitions=p) for t, p in topics.items()],
            )
        )
    return DescribeLogDirsResponse(results=results)


def _partition_directory(
    log_dirs: list[str], known: str | None, topic: str, partition: int
) -> tuple[str, str] | None:
    """(log dir, partition directory) of a partition held here, or None."""
    if known is not None:
        directory = os.path.abspath(known)
        return (os.path.dirname(directory), directory) if os.path.isdir(directory) else None
    for log_dir in log_dirs:
        directory = os.path.join(log_dir, f"{topic}-{partition}")
        if os.path.isdir(directory):
            return log_dir, directory
    return None


def _offset_lag(table: PartitionTable, topic: str, partition: int) -> int:
    handle, _ = table.lookup(topic, partition)
    if handle is None:
        return 0
    return max(0, handle.high_watermark - handle.log_end_offset)
