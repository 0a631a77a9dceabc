"""Repairing a damaged partition log by hand: what ``appliance repair`` shows and does.

Theory of operation
-------------------
Start-up cuts what it safely can (``storage.recovery`` rule 3: an invalid tail after which nothing valid
follows) and refuses the rest (rule 4: an invalid batch with valid batches after it), and the partition
stays offline.  Kafka, on an unclean recovery, truncates at the first invalid batch by itself; here a person
decides, because the records after the damage were acknowledged and cutting loses them: they may rather
restore the partition from a replica, or salvage what they can first.

:func:`survey` reads a partition directory as recovery would after a crash, every segment and every batch
(structure and CRC-32C), and finds the first invalid batch.  Its :class:`RepairPlan` says what cutting the
log there removes: the rest of that file and every later segment, with the valid batches among them
(how many, their offsets, their bytes).  :func:`apply_repair` then:

1. copies what it removes aside, into ``repaired-<UTC time>/`` in the partition directory (the cut tail as
   ``<base offset>.log.tail``; later ``.log`` files moved whole), so nothing is destroyed
   (``appliance dump-log`` reads them; delete the directory once done with it);
2. cuts the damaged file at the invalid batch (fsynced), deletes the later segments and the cut segment's
   indexes (rebuilt at the next start), and removes ``.clean-shutdown`` (the next start checks the log as
   after a crash) and ``.offline`` (the supervisor's note that the partition is offline).

The caller holds the partition's writer lock (``storage.log_dir.lock_log_directory``) throughout, so no
writer runs meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field

from storage.atomic_file import fsync_directory
from storage.batch_scan import scan_segment, valid_batches_after
from storage.log_config import LogConfig
from storage.log_damage import LogDamage, find_resumption
from storage.log_dir import (
    CLEAN_SHUTDOWN_FILE,
    OFFLINE_FILE,
    delete_segment_files,
    list_segment_base_offsets,
)
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path

__all__ = ["LostData", "RepairPlan", "apply_repair", "survey"]


@dataclass(slots=True)
class LostData:
    """The valid batches a cut removes, and all the bytes it removes."""

    batches: int = 0
    first_offset: int = -1
    last_offset: int = -1
    valid_bytes: int = 0  # of those batches
    removed_bytes: int = 0  # every byte removed: the damage, the batches, anything else

    def add(self, batches: int, first_offset: int, last_offset: int, size_bytes: int) -> None:
        if batches == 0:
            return
        self.batches += batches
        if self.first_offset < 0:
            self.first_offset = first_offset
        self.last_offset = max(self.last_offset, last_offset)
        self.valid_bytes += size_bytes


@dataclass(slots=True)
class RepairPlan:
    """What is damaged in a partition directory and what a repair would do."""

    directory: str
    segments: int  # segment files read
    damage: LogDamage | None  # None: every batch is valid, nothing to do
    later_segments: list[int] = field(default_factory=list)  # base offsets of the segments removed whole
    lost: LostData = field(default_factory=LostData)

    def describe(self) -> list[str]:
        """Lines for a person: the damage, then what cutting there removes."""
        if self.damage is None:
            return [f"{self.directory}: {self.segments} segments, every batch valid: nothing to repair"]
        damage = self.damage
        lost = self.lost
        lines = [f"damaged: {damage.describe()}",
                 f"repair: cut {damage.path} at position {damage.position} (the log then ends at offset "
                 f"{damage.next_offset - 1}, the next append gets offset {damage.next_offset})"]
        if self.later_segments:
            lines.append(f"        and remove {len(self.later_segments)} later segments (base offsets "
                         f"{', '.join(str(b) for b in self.later_segments)})")
        last = lost.last_offset if lost.batches else -1  # (a damaged header's claim is not trusted)
        offsets = f"offsets {damage.next_offset}..{last}: " if last >= damage.next_offset else ""
        lines.append(f"lost:   {offsets}the damaged batch and {lost.batches} valid batches after it "
                     f"({lost.valid_bytes} bytes); {lost.removed_bytes} bytes removed in all")
        return lines


def survey(directory: str, config: LogConfig | None = None) -> RepairPlan:
    """Scan every segment of the partition directory; the first invalid batch and what cutting there
    would remove."""
    config = config or LogConfig()
    bases = list_segment_base_offsets(directory)
    plan = RepairPlan(directory, len(bases), None)
    for i, base in enumerate(bases):
        path = segment_path(directory, base, LOG_SUFFIX)
        scan = scan_segment(path, base, index_interval_bytes=config.index_interval_bytes)
        if scan.error is None:
            continue
        resumes = find_resumption(directory, bases, i, scan.error)
        plan.damage = LogDamage.from_scan(path, base, scan.error, scan.next_offset, resumes)
        size = os.path.getsize(path)
        plan.lost.removed_bytes += size - scan.valid_bytes
        found = valid_batches_after(path, scan.error.position + 1, base)
        if found:
            plan.lost.add(len(found), found[0].base_offset, found[-1].last_offset, sum(b.size for b in found))
        for later in bases[i + 1 :]:
            plan.later_segments.append(later)
            _count_segment(directory, later, plan.lost)
        break
    return plan


def _count_segment(directory: str, base: int, lost: LostData) -> None:
    """Add a whole segment's valid batches (wherever they are in it) and bytes to ``lost``."""
    path = segment_path(directory, base, LOG_SUFFIX)
    lost.removed_bytes += os.path.getsize(path)
    found = valid_batches_after(path, 0, base)
    if found:
        lost.add(len(found), found[0].base_offset, found[-1].last_offset, sum(b.size for b in found))


def apply_repair(plan: RepairPlan) -> str | None:
    """Do what ``plan`` says (module docstring, steps 1-2); returns the directory the removed data was
    moved to, or None when there was nothing to remove."""
    directory = plan.directory
    damage = plan.damage
    aside = None
    if damage is not None:
        aside = os.path.join(directory, time.strftime("repaired-%Y%m%dT%H%M%SZ", time.gmtime()))
        os.makedirs(aside, exist_ok=True)
        _save_tail(damage.path, damage.position, os.path.join(aside, f"{damage.segment_base_offset:020d}"
                                                                      f"{LOG_SUFFIX}.tail"))
        for base in plan.later_segments:
            name = f"{base:020d}{LOG_SUFFIX}"
            os.replace(segment_path(directory, base, LOG_SUFFIX), os.path.join(aside, name))
            delete_segment_files(directory, base)
        fsync_directory(aside)
        fd = os.open(damage.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, damage.position)
            os.fsync(fd)
        finally:
            os.close(fd)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(segment_path(directory, damage.segment_base_offset, suffix))
    for name in (CLEAN_SHUTDOWN_FILE, OFFLINE_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    fsync_directory(directory)
    return aside


def _save_tail(path: str, position: int, target: str) -> None:
    """Copy the bytes of ``path`` from ``position`` to its end into ``target`` (fsynced)."""
    with open(path, "rb") as source, open(target, "wb") as out:
        source.seek(position)
        shutil.copyfileobj(source, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
