"""The hand-off of a cleaned segment: the cleaner process wrote it aside, the log's owner swaps it in.

Theory of operation
-------------------
A log has one writer.  The cleaner process (``appliance.cleaner``) reads closed segments and writes each
cleaned group aside as ``<base>.log.cleaned`` (and its indexes); it never renames or deletes a segment.
For the groups of a pass it sends the control op ``swap_cleaned`` (``topic``, ``partition``, ``groups``: one
``[base_offset, replaced, sizes]`` a group, ``replaced`` the base offsets of the closed segments it replaces,
``sizes`` their sizes as the cleaner read them) and waits; the groups are swapped in one swap.
:func:`swap_cleaned` (the supervisor) gives the swap to whoever owns the log now:

* **a writer runs** (and is not stopping): the writer command ``{"op": "swap_cleaned", ...}``
  (``Partition.ask_writer``); the writer checks the replaced segments are still its closed segments with
  those sizes and calls ``Log.swap_cleaned`` between two drain rounds (``appliance.server.writer_admin``),
  so its segment list and the directory change together;
* **no writer runs**: the supervisor swaps here and now, in one turn of its loop, holding the log's lock
  (``.lock``): no writer can be forked for the partition before the turn ends, and a process still holding
  the lock (a writer of an earlier supervisor) makes the swap refused;
* **a writer is starting, stopping or waiting for its restart**: refused (retriable); the cleaner unlinks
  its files and measures the log again next round.

Either way the swap is ``storage.clean_swap.swap_in`` (renames, each step fsynced; a SIGKILL at any step
is finished or undone, group by group, by the log's next open), after the same check, for every group (one
group refused refuses them all, nothing renamed): the replaced segments are consecutive, closed (the active
segment is never replaced), of the sizes the cleaner read (else retention, DeleteRecords or a truncation
changed the log meanwhile: refused, nothing renamed), and the cleaned file exists.  A refusal is
``KAFKA_STORAGE_ERROR`` naming the partition and the segment; nothing changed.

The supervisor's own swap holds the replaced ``.log`` files open across it and retires them to a deleter of
its own (``storage.segment_deleter``, after the topic's ``file.delete.delay.ms``), as a writer's log does
with its segments, so the unlink is not the last reference and its loop does not wait for the kernel to
free them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from appliance.server.partitions import Partition
from appliance.server.writer_admin import check_replaced
from ipc.control import error_response, ok_response
from ipc.kafka.errors import ErrorCode
from storage.clean_swap import SwapGroup, finish_interrupted_swap, swap_in
from storage.errors import LogLockedError, describe_os_error
from storage.log_dir import lock_log_directory, segment_base_offsets, unlock_log_directory
from storage.segment import LOG_SUFFIX, segment_path
from storage.segment_deleter import HeldFile, SegmentDeleter, hold_files

__all__ = ["swap_cleaned"]

_log = logging.getLogger("appliance.supervisor")

Reply = Callable[[dict[str, Any]], None]

# the supervisor's swaps hold the replaced files open until this closes them (``storage.segment_deleter``)
_DELETER = SegmentDeleter("delete-swapped")


def swap_cleaned(part: Partition, message: Mapping[str, Any], reply: Reply) -> dict[str, Any] | None:
    """The control op ``swap_cleaned`` for ``part``: the reply now, or None (``reply`` is called when the
    partition's writer answered)."""
    groups = message.get("groups")
    if not isinstance(groups, list) or not groups or not all(_well_formed(group) for group in groups):
        return error_response(ErrorCode.INVALID_REQUEST, f"swap_cleaned of {part.name}: groups must be a "
                              "list of [base_offset, replaced, sizes]: an offset and two lists of "
                              "integers")  # fmt: skip
    if part.offline:
        return error_response(ErrorCode.KAFKA_STORAGE_ERROR,
                              f"partition {part.name} is offline: {part.offline}")
    child = part.writer
    if child.channel is not None and not child.stopping:
        part.ask_writer({"op": "swap_cleaned", "groups": groups}, lambda answer: reply(_answer(answer)))
        return None
    if child.pid or child.stopping or child.restart_at_s is not None:
        return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {part.name}: its writer is starting "
                              "or stopping; the cleaner tries again later")  # fmt: skip
    return _swap_here(part.spec.directory, part.name, groups, part.spec.log_config.file_delete_delay_ms)


def _well_formed(group: object) -> bool:
    """Whether ``group`` is ``[base_offset, replaced, sizes]``: an offset, two equally long lists of ints."""
    if not isinstance(group, list) or len(group) != 3:
        return False
    base, replaced, sizes = group
    return (isinstance(base, int) and isinstance(replaced, list) and isinstance(sizes, list)
            and bool(replaced) and len(replaced) == len(sizes)
            and all(isinstance(v, int) for v in (*replaced, *sizes)))


def _swap_here(directory: str, name: str, groups: list[list[Any]], delete_delay_ms: int) -> dict[str, Any]:
    try:
        lock_fd = lock_log_directory(directory, name)
    except LogLockedError as exc:
        return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"{exc}; the cleaner tries again later")
    held: list[HeldFile] = []
    try:
        bases = segment_base_offsets(os.listdir(directory))
        for base, replaced, sizes in groups:
            refused = check_replaced(directory, bases, name, base, replaced, sizes,
                                     lambda b: os.stat(segment_path(directory, b, LOG_SUFFIX)).st_size)
            if refused is not None:
                return error_response(ErrorCode.KAFKA_STORAGE_ERROR, refused)
        held = hold_files([segment_path(directory, b, LOG_SUFFIX) for _, olds, _ in groups for b in olds])
        try:
            swap_in(directory, [SwapGroup(base, tuple(replaced)) for base, replaced, _ in groups])
        except OSError as exc:
            finish_interrupted_swap(directory)
            return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {name}: swapping in the "
                                  f"segments cleaned at {[g[0] for g in groups]}: "
                                  f"{describe_os_error(exc)}")  # fmt: skip
    except OSError as exc:
        return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {name}: {describe_os_error(exc)}")
    finally:
        unlock_log_directory(lock_fd)
        _DELETER.retire(held, delete_delay_ms)
    _log.info("partition %s: swapped in cleaned segments (base offset, replaced segments) %s (no writer "
              "running)", name, [(g[0], g[1]) for g in groups])
    return ok_response()


def _answer(answer: Mapping[str, Any]) -> dict[str, Any]:
    if answer.get("ok"):
        return ok_response()
    code = ErrorCode.__members__.get(str(answer.get("error")), ErrorCode.KAFKA_STORAGE_ERROR)
    return error_response(code, str(answer.get("message", "the writer refused the swap")))
