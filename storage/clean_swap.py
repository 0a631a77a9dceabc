"""Swapping cleaned segments in for the segments they replace, with renames a crash cannot leave half done.

Theory of operation
-------------------
A clean writes each group of segments it rewrote aside, ``<base>.log.cleaned`` with ``<base>.index.cleaned``
and ``<base>.timeindex.cleaned`` (``storage.cleaner``), where ``<base>`` is the base offset of the group's
first segment.  :func:`swap_in` then replaces one or more groups (:class:`SwapGroup`: disjoint runs of
closed segments) in five steps, each done for every group before the next, the directory fsynced once after
each of steps 2-4 (three directory fsyncs a swap, however many groups it holds):

1. the cleaned files are complete and fsynced (the ``.log``; the indexes are disposable);
2. every file of every replaced segment is renamed ``<name>.deleted`` (and a stale ``<b>.log.cleaned`` at a
   replaced segment that is not a group's first is unlinked: the rule below reads those names);
3. group by group: its cleaned indexes are renamed ``*.swap``, then ``<base>.log.cleaned`` ->
   ``<base>.log.swap``: **this rename commits that group**;
4. the ``*.deleted`` files are unlinked;
5. the ``*.swap`` indexes, then the ``*.log.swap`` files, are renamed to their final names.  No fsync of its
   own: a crash that loses some of these renames leaves ``*.swap`` files that the next open finishes (or,
   the log's rename kept and an index's lost, an index ``.swap`` it unlinks: indexes are rebuilt); the
   next swap's step 2 or the ``cleaner-offset-checkpoint`` written after the pass makes them durable.

**The commit rule** (several groups, decided from the names alone).  A group's *mark* is its
``<base>.log.swap`` (committed) or ``<base>.log.cleaned`` (not yet).  A ``*.deleted`` file of the segment at
offset ``b`` belongs to the group whose mark has the largest base at or below ``b`` (groups are disjoint runs
of segments and a group's base is its first segment's, so no other group's mark lies between a group's base
and its segments; step 2 unlinks stale ``.cleaned`` files there).  It is unlinked if that mark is a
``.log.swap``, renamed back otherwise, or when no mark lies at or below it.  An index ``<b>.*.swap`` is
installed if ``<b>.log.swap`` exists, else unlinked.  So a crash between two groups' commits finishes the
groups committed and undoes the others: each group is a whole replacement on its own.  The marks of every
group are durable before any group commits (step 2's fsync), so a mark lost in a crash can only be that of a
group with nothing committed, whose files are restored.

Kafka's ``LogCleaner`` renames ``.cleaned`` to ``.swap`` before it renames the old segments ``.deleted``,
and its recovery deletes the old segments that the ``.swap`` file's offsets cover.  A clean here may drop
every batch at the end of a group, so the cleaned file's offsets do not say which old segments it replaces;
renaming them first, and committing after, lets recovery decide from the names alone.
:func:`finish_interrupted_swap` (``Log.open``, before anything else reads the directory) applies the rule,
then unlinks every ``*.cleaned`` file left (Kafka's rule: a ``.cleaned`` file is deleted).

Readers: a process that holds a replaced segment open (a descriptor, a mapping) keeps reading the old inode
after the unlink; one that lists the directory between steps 2 and 5 sees the replaced offsets missing, so
it must list again while any ``*.deleted`` or ``*.swap`` file is there (``storage.log_reader`` does, for a
bounded wait, then raises ``SwapInProgressError``).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Final, NamedTuple

from storage.atomic_file import fsync_directory
from storage.clean_faults import CLEAN_FAULTS
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path

__all__ = [
    "CLEANED_SUFFIX",
    "DELETED_SUFFIX",
    "SWAP_SUFFIX",
    "SwapGroup",
    "cleaned_paths",
    "finish_interrupted_swap",
    "log_files_now",
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


class SwapGroup(NamedTuple):
    """One cleaned segment, ``<base_offset>.log.cleaned``, and the base offsets of the consecutive closed
    segments it replaces (``base_offset`` the first of them)."""

    base_offset: int
    replaced: tuple[int, ...]


def swap_in(directory: str, groups: Sequence[SwapGroup]) -> None:
    """Steps 2-5 of the module docstring: each group's cleaned segment replaces its ``replaced`` segments."""
    first_cleaned = cleaned_paths(directory, groups[0].base_offset)[0]
    _fault("clean.cleaned", first_cleaned)
    for group in groups:
        for old in group.replaced:
            if old != group.base_offset:
                with contextlib.suppress(FileNotFoundError):  # a stale mark inside the group: never one's own
                    os.unlink(cleaned_paths(directory, old)[0])
            for suffix in _SEGMENT_SUFFIXES:
                path = segment_path(directory, old, suffix)
                with contextlib.suppress(FileNotFoundError):  # an index a crash already lost
                    os.rename(path, path + DELETED_SUFFIX)
    fsync_directory(directory)
    _fault("clean.deleted", first_cleaned)
    for group in groups:
        _commit(directory, group.base_offset)
    fsync_directory(directory)
    _fault("clean.committed", directory)
    _unlink_all(directory, DELETED_SUFFIX)
    fsync_directory(directory)
    _fault("clean.unlinked", directory)
    _install_swaps(directory)
    _fault("clean.installed", directory)


def _commit(directory: str, base_offset: int) -> None:
    """Step 3 for the group at ``base_offset``: its indexes, then its ``.log``, renamed ``.swap``."""
    log_cleaned = cleaned_paths(directory, base_offset)[0]
    for suffix in _INDEX_SUFFIXES:
        path = segment_path(directory, base_offset, suffix)
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + CLEANED_SUFFIX, path + SWAP_SUFFIX)
    _fault("clean.indexes", log_cleaned)
    log_path = segment_path(directory, base_offset, LOG_SUFFIX)
    os.rename(log_cleaned, log_path + SWAP_SUFFIX)
    _fault("clean.swap", log_path)


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


def _base_of(name: str) -> int | None:
    """The base offset a segment file's name starts with, or None for any other file."""
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _marks(names: Sequence[str]) -> tuple[list[int], list[bool]]:
    """The groups' marks in ``names``: their bases, ascending, and whether each is committed."""
    marks: dict[int, bool] = {}
    for name in names:
        committed = name.endswith(LOG_SUFFIX + SWAP_SUFFIX)
        if committed or name.endswith(LOG_SUFFIX + CLEANED_SUFFIX):
            base = _base_of(name)
            if base is not None:
                marks[base] = marks.get(base, False) or committed
    bases = sorted(marks)
    return bases, [marks[b] for b in bases]


def _deleted_committed(name: str, bases: list[int], committed: list[bool]) -> bool:
    """Whether the ``*.deleted`` file ``name`` belongs to a committed group (the commit rule)."""
    base = _base_of(name)
    at = bisect.bisect_right(bases, base) - 1 if base is not None else -1
    return at >= 0 and committed[at]


def log_files_now(names: Sequence[str]) -> list[str]:
    """The files among ``names`` (a directory's listing) whose segment data is the log at this moment, during
    a swap too: each ``.log``, each committed group's ``.log.swap``, each uncommitted group's ``.log.deleted``
    (the commit rule of the module docstring)."""
    bases, committed = _marks(names)
    now = []
    for name in names:
        if _base_of(name) is None:
            continue
        if name.endswith((LOG_SUFFIX, LOG_SUFFIX + SWAP_SUFFIX)):
            now.append(name)
        elif name.endswith(LOG_SUFFIX + DELETED_SUFFIX) and not _deleted_committed(name, bases, committed):
            now.append(name)
    return now


def finish_interrupted_swap(directory: str) -> str | None:
    """Finish or undo, group by group, a swap a crash interrupted (the commit rule of the module docstring);
    returns what was done, for the log, or None when there was nothing to do."""
    names = os.listdir(directory)
    if not any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)) for name in names):
        return None
    bases, committed = _marks(names)
    done_bases = {b for b, c in zip(bases, committed, strict=True) if c}
    unlinked, restored = [], []
    for name in sorted(n for n in names if n.endswith(DELETED_SUFFIX)):
        path = os.path.join(directory, name)
        if _deleted_committed(name, bases, committed):
            os.unlink(path)
            unlinked.append(name)
        else:
            os.rename(path, path[: -len(DELETED_SUFFIX)])
            restored.append(name)
    for name in sorted(n for n in names if n.endswith(SWAP_SUFFIX)):
        if _base_of(name) not in done_bases:  # an uncommitted group's index
            os.unlink(os.path.join(directory, name))
            unlinked.append(name)
    installed = _install_swaps(directory)
    unlinked += _unlink_all(directory, CLEANED_SUFFIX)
    fsync_directory(directory)
    done = f"installed {installed}, restored {restored}, unlinked {unlinked}"
    _log.warning("%s: a clean was interrupted; finished its committed groups and undid the others: %s",
                 directory, done)
    return done
