"""Damage in a partition log: the first invalid batch, and whether valid batches come after it.

Theory of operation
-------------------
``storage.batch_scan`` stops at the first batch of a segment that breaks a rule.  What that means depends on
what follows it, up to the end of the log:

* **nothing valid**: the bytes are the tail of a write a crash tore, or garbage added to the file; no record
  in them was ever acknowledged (an acknowledgement follows the append of a whole, valid batch, and every
  later append would be a valid batch after it).  Recovery cuts them (``storage.recovery``, rule 3).
* **a valid batch further on**, in the same file or in a later segment: records after the damage were
  appended, and so acknowledged; cutting the log at the damage would lose them.  The log is *corrupt*:
  it does not open (:class:`~storage.errors.LogCorruptionError` carrying a :class:`LogDamage`) and a person
  decides what to do (``appliance repair``, ``storage.log_repair``).

:func:`find_resumption` answers which: it tries every position after the damage in the damaged file
(``batch_scan.valid_batches_after``), then the first valid batch of each later segment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from storage.batch_scan import FoundBatch, ScanError, valid_batches_after
from storage.segment import LOG_SUFFIX, segment_path

__all__ = ["LogDamage", "Resumption", "find_resumption"]


@dataclass(frozen=True, slots=True)
class Resumption:
    """The first valid batch after damage: in which file, where, and its offsets."""

    path: str
    position: int
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class LogDamage:
    """The first invalid batch of a log and what follows it."""

    path: str  # the segment file holding it
    segment_base_offset: int
    position: int  # where the invalid batch starts: the file's valid prefix ends here
    reason: str  # the rule it breaks (batch_scan.REASONS)
    claimed_offsets: tuple[int, int] | None  # (base, last) its header claims, when a header was there
    next_offset: int  # the offset after the last valid batch before it
    resumes: Resumption | None  # the first valid batch after it; None: nothing valid follows (a torn tail)

    @classmethod
    def from_scan(cls, path: str, segment_base_offset: int, error: ScanError, next_offset: int,
                  resumes: Resumption | None) -> LogDamage:
        claimed = None if error.base_offset is None or error.last_offset is None else (
            error.base_offset, error.last_offset)
        return cls(path, segment_base_offset, error.position, error.reason, claimed, next_offset, resumes)

    def describe(self) -> str:
        """One line: the file, the position, the offsets, the reason and what follows."""
        claimed = "" if self.claimed_offsets is None else (
            f" (its header claims offsets {self.claimed_offsets[0]}..{self.claimed_offsets[1]})")
        line = (f"{self.path}: invalid record batch at position {self.position}{claimed}, after offset "
                f"{self.next_offset - 1}: {self.reason}")
        if self.resumes is None:
            return f"{line}; nothing valid follows"
        where = "further on" if self.resumes.path == self.path else f"in {self.resumes.path}"
        return (f"{line}; valid batches follow {where} at position {self.resumes.position} (offsets from "
                f"{self.resumes.base_offset}), so records after the damage were acknowledged")


def find_resumption(directory: str, base_offsets: Sequence[int], index: int, error: ScanError, *,
                    later_segments: bool = True) -> Resumption | None:
    """The first valid batch after the invalid one ``error`` describes in segment ``base_offsets[index]``:
    later in that file, else (with ``later_segments``) the first valid batch of a later segment; None if
    there is none."""
    base = base_offsets[index]
    path = segment_path(directory, base, LOG_SUFFIX)
    found = valid_batches_after(path, error.position + 1, base, limit=1)
    if found:
        return _resumption(path, found[0])
    for later in base_offsets[index + 1 :] if later_segments else ():
        later_path = segment_path(directory, later, LOG_SUFFIX)
        if os.path.getsize(later_path) == 0:
            continue
        found = valid_batches_after(later_path, 0, later, limit=1)
        if found:
            return _resumption(later_path, found[0])
    return None


def _resumption(path: str, batch: FoundBatch) -> Resumption:
    return Resumption(path, batch.position, batch.base_offset, batch.last_offset)
