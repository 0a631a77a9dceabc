"""Swapping a cleaned segment in for the segments it replaces, with renames a crash cannot leave half done.

Theory of operation
-------------------
A clean writes its result aside, ``<base>.log.cleaned`` with ``<base>.index.cleaned`` and
``<base>.timeindex.cleaned`` (``storage.cleaner``), where ``<base>`` is the base offset of the first segment
it replaces.  :func:`swap_in` then replaces the group ``[base, ...)`` of closed segments in five steps, the
directory fsynced after each of steps 2-4:

1. the cleaned files are complete and fsynced (the ``.log``; the indexes are disposable);
2. every file of every replaced segment is renamed ``<name>.deleted``;
3. the cleaned indexes are renamed ``*.swap``, then ``<base>.log.cleaned`` -> ``<base>.log.swap``: **this
   rename commits the swap**;
4. the ``*.deleted`` files are unlinked;
5. the ``*.swap`` indexes, then ``<base>.log.swap``, are renamed to their final names.  No fsync of its
   own: a crash that loses some of these renames leaves ``*.swap`` files that the next open finishes (or,
   the log's rename kept and an index's lost, an index ``.swap`` it unlinks: indexes are rebuilt); the
   next swap's step 2 or the ``cleaner-offset-checkpoint`` written after the pass makes them durable.

Kafka's ``LogCleaner`` renames ``.cleaned`` to ``.swap`` before it renames the old segments ``.deleted``,
and its recovery deletes the old segments that the ``.swap`` file's offsets cover.  A clean here may drop
every batch at the end of a group, so the cleaned file's offsets do not say which old segments it replaces;
renaming them first, and committing after, lets recovery decide from the names alone.
:func:`finish_interrupted_swap` (``Log.open``, before anything else reads the directory) applies:

* a ``<base>.log.swap`` exists: the swap was committed.  Every ``*.deleted`` file is unlinked and every
  ``*.swap`` file renamed into place (steps 4 and 5 finished);
* no ``.log.swap``: the swap was not committed.  Every ``*.deleted`` file is renamed back (step 2 undone),
  and every ``*.cleaned`` and index ``*.swap`` file is unlinked;
* in both cases a ``*.cleaned`` file left is unlinked (Kafka's rule: a ``.cleaned`` file is deleted).

Readers: a process that holds a replaced segment open (a descriptor, a mapping) keeps reading the old inode
after the unlink; one that lists the directory between steps 2 and 5 sees the replaced offsets missing, so
it must list again while any ``*.deleted`` or ``*.swap`` file is there (``storage.log_reader`` does, for a
bounded wait, then raises ``SwapInProgressError``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Final

from storage.atomic_file import fsync_directory
from storage.clean_faults import CLEAN_FAULTS
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path

__all__ = [
    "CLEANED_SUFFIX",
    "DELETED_SUFFIX",
    "SWAP_SUFFIX",
    "cleaned_paths",
    "finish_interrupted_swap",
    "swap_in",
]

CLEANED_SUFFIX: Final = ".cleaned"
SWAP_SUFFIX: Final = ".swap"
DELETED_SUFFIX: Final = ".deleted"
_INDEX_SUFFIXES: Final = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
_SEGMENT_SUFFIXES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

_log = logging.getLogger(__name__)


def cleaned_paths(directory: str, base_offset: int) -> tuple[str, str, str]:
    """Where a clean writes the segment at ``base_offset``: its ``.log``, ``.index``, ``.timeindex``."""
    return tuple(segment_path(directory, base_offset, suffix) + CLEANED_SUFFIX  # type: ignore[return-value]
                 for suffix in _SEGMENT_SUFFIXES)


def _fault(point: str, path: str) -> None:
    if CLEAN_FAULTS.armed:
        CLEAN_FAULTS.check(point, path)


def swap_in(directory: str, base_offset: int, replaced: Sequence[int]) -> None:
    """Steps 2-5 of the module docstring: the cleaned segment at ``base_offset`` replaces the segments whose
    base offsets are ``replaced`` (``base_offset`` among them)."""
    log_cleaned = cleaned_paths(directory, base_offset)[0]
    _fault("clean.cleaned", log_cleaned)
    for old in replaced:
        for suffix in _SEGMENT_SUFFIXES:
            path = segment_path(directory, old, suffix)
            with contextlib.suppress(FileNotFoundError):  # an index a crash already lost
                os.rename(path, path + DELETED_SUFFIX)
    fsync_directory(directory)
    _fault("clean.deleted", log_cleaned)
    for suffix in _INDEX_SUFFIXES:
        path = segment_path(directory, base_offset, suffix)
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + CLEANED_SUFFIX, path + SWAP_SUFFIX)
    _fault("clean.indexes", log_cleaned)
    log_path = segment_path(directory, base_offset, LOG_SUFFIX)
    os.rename(log_cleaned, log_path + SWAP_SUFFIX)
    fsync_directory(directory)
    _fault("clean.swap", log_path)
    _unlink_all(directory, DELETED_SUFFIX)
    fsync_directory(directory)
    _fault("clean.unlinked", log_path)
    _install_swaps(directory)
    _fault("clean.installed", log_path)


def _names(directory: str, suffix: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(suffix))


def _unlink_all(directory: str, suffix: str) -> list[str]:
    names = _names(directory, suffix)
    for name in names:
        os.unlink(os.path.join(directory, name))
    return names


def _install_swaps(directory: str) -> list[str]:
    """Rename every ``*.swap`` into place, the ``.log`` files last (their ``.swap`` is the commit mark)."""
    names = _names(directory, SWAP_SUFFIX)
    names.sort(key=lambda name: name.endswith(LOG_SUFFIX + SWAP_SUFFIX))
    for name in names:
        path = os.path.join(directory, name)
        os.rename(path, path[: -len(SWAP_SUFFIX)])
    return names


def finish_interrupted_swap(directory: str) -> str | None:
    """Finish or undo a swap a crash interrupted (the rules in the module docstring); returns what was done,
    for the log, or None when there was nothing to do."""
    names = os.listdir(directory)
    committed = any(name.endswith(LOG_SUFFIX + SWAP_SUFFIX) for name in names)
    if not any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)) for name in names):
        return None
    cleaned = _unlink_all(directory, CLEANED_SUFFIX)
    if committed:
        deleted = _unlink_all(directory, DELETED_SUFFIX)
        installed = _install_swaps(directory)
        done = f"finished a committed swap: installed {installed}, unlinked {deleted + cleaned}"
    else:
        restored = _names(directory, DELETED_SUFFIX)
        for name in restored:
            path = os.path.join(directory, name)
            os.rename(path, path[: -len(DELETED_SUFFIX)])
        swaps = _unlink_all(directory, SWAP_SUFFIX)
        done = f"undid an uncommitted swap: restored {restored}, unlinked {swaps + cleaned}"
    fsync_directory(directory)
    _log.warning("%s: a clean was interrupted; %s", directory, done)
    return done
