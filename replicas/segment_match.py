"""Comparing a follower's segments with its leader's: what each side holds, and which ranges differ.

Theory of operation
-------------------
A follower of a compacted topic adopts its leader's cleaned bytes (``appliance.follower.adoption``).  Both
sides describe their closed segments the same way, as :class:`SegmentDigest` rows: base offset, the next
segment's base offset, size and the CRC-32C of the whole ``.log`` file (:func:`closed_segments`; the
leader answers them through the private DescribeSegments API, ``appliance.broker.segment_requests``).
Checksums are cached per file (inode, size and modification time; not while the modification time is
within the kernel's clock tick, ``storage.log_dir.mtime_settled``): a closed segment changes only by being
replaced, which gives a new inode, so a segment is read once while it lives.

:func:`plan_adoptions` lists what the follower should copy.  A *cut* is an offset where both sides start
a segment.  Between two consecutive cuts lie one or more segments of each side covering the same offsets;
such a group is the same bytes when its segments are the same on both sides (bases, sizes, checksums), and
else the follower's segments of the group are to be replaced by the leader's.  The follower rolls its
active segment where the leader's segments begin (``replicas.fetcher``), and a leader's clean only merges
segments, so a differing group holds one leader segment: that is the unit adopted (one cleaned file, one
swap).  A group is adopted only when it lies wholly below ``limit`` (the follower's high watermark and its
active segment), so only records the follower already holds, and the leader has acknowledged, are
replaced, by the leader's cleaned version of them.  A group with several leader segments (a follower
whose segments were cut elsewhere, by a cleaner of its own before) is listed apart and left as it is.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import Final, NamedTuple

import crc32c

from storage.clean_swap import DELETED_SUFFIX, SWAP_SUFFIX
from storage.log_dir import mtime_settled
from storage.segment import LOG_SUFFIX, parse_segment_name, segment_path

__all__ = ["Adoption", "AdoptionPlan", "LeaderBases", "SegmentDigest", "SegmentListing", "checksum_file",
           "closed_segments", "plan_adoptions"]

_READ_BYTES: Final = 1 << 20
_CACHE_ENTRIES: Final = 4096  # checksums cached before the gone files' are dropped
NO_CHECKSUM: Final = -1


class SegmentDigest(NamedTuple):
    """One closed segment: offsets ``[base_offset, next_offset)``, its ``.log`` size and CRC-32C."""

    base_offset: int
    next_offset: int
    size_bytes: int
    checksum: int = NO_CHECKSUM


class SegmentListing(NamedTuple):
    """A partition directory's closed segments and the base offset of its active (last) segment;
    ``swapping``: a clean's swap is between its renames (the listing is not of one state)."""

    segments: list[SegmentDigest]
    active_base_offset: int
    swapping: bool


class Adoption(NamedTuple):
    """Replace the follower's segments ``replaced`` by the leader's ``segment`` (same first base)."""

    segment: SegmentDigest
    replaced: tuple[int, ...]


class AdoptionPlan(NamedTuple):
    adoptions: list[Adoption]
    unadoptable: list[tuple[int, int]]  # differing ranges [start, end) with several leader segments


class LeaderBases:
    """The base offsets of the leader's segments as last described (its closed ones and its active one),
    shared by a partition's fetcher (which rolls its active segment at them) and the adoption thread
    (which learns them).  Replaced whole, read without a lock."""

    def __init__(self) -> None:
        self._bases: list[int] = []

    def update(self, segments: Sequence[SegmentDigest], active_base_offset: int) -> None:
        bases = [s.base_offset for s in segments]
        if active_base_offset >= 0:
            bases.append(active_base_offset)
        self._bases = sorted(set(bases))

    def first_above(self, offset: int) -> int | None:
        """The smallest known leader base offset above ``offset``, or None."""
        bases = self._bases
        i = bisect.bisect_right(bases, offset)
        return bases[i] if i < len(bases) else None

    def between(self, low: int, high: int) -> list[int]:
        """The known leader base offsets above ``low`` and at or below ``high``, ascending."""
        bases = self._bases
        return bases[bisect.bisect_right(bases, low) : bisect.bisect_right(bases, high)]


_cache_lock = threading.Lock()
_checksums: dict[str, tuple[int, int, int, int]] = {}  # path -> (inode, size, mtime_ns, crc)


def checksum_file(path: str) -> tuple[int, int]:
    """(size, CRC-32C) of the whole file at ``path``, from the cache when the file is unchanged."""
    with open(path, "rb") as file:
        st = os.fstat(file.fileno())
        seen_ns = time.time_ns()
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with _cache_lock:
            known = _checksums.get(path)
        if known is not None and known[:3] == key:
            return st.st_size, known[3]
        crc = 0
        remaining = st.st_size
        while remaining > 0:
            chunk = file.read(min(_READ_BYTES, remaining))
            if not chunk:
                break
            crc = crc32c.crc32c(chunk, crc)
            remaining -= len(chunk)
    if not mtime_settled(st.st_mtime_ns, seen_ns):  # a change in the same tick would keep the key
        return st.st_size, crc
    with _cache_lock:
        if len(_checksums) >= _CACHE_ENTRIES:  # forget the files that are gone (replaced, deleted)
            for gone in [p for p in _checksums if not os.path.exists(p)]:
                del _checksums[gone]
        _checksums[path] = (*key, crc)
    return st.st_size, crc


def closed_segments(directory: str, *, checksums: bool) -> SegmentListing:
    """The closed segments of the partition in ``directory`` as its files are now (FileNotFoundError for
    a missing directory; a segment unlinked meanwhile makes the listing ``swapping``)."""
    names = os.listdir(directory)
    swapping = any(name.endswith((DELETED_SUFFIX, SWAP_SUFFIX)) for name in names)
    bases = sorted(b for b in (parse_segment_name(name) for name in names) if b is not None)
    if not bases:
        return SegmentListing([], -1, swapping)
    segments: list[SegmentDigest] = []
    for base, next_base in itertools.pairwise(bases):
        path = segment_path(directory, base, LOG_SUFFIX)
        try:
            if checksums:
                size, crc = checksum_file(path)
            else:
                size, crc = os.stat(path).st_size, NO_CHECKSUM
        except FileNotFoundError:
            return SegmentListing(segments, bases[-1], True)
        segments.append(SegmentDigest(base, next_base, size, crc))
    return SegmentListing(segments, bases[-1], swapping)


def plan_adoptions(leader: Sequence[SegmentDigest], follower: Sequence[SegmentDigest],
                   limit: int) -> AdoptionPlan:
    """The groups of segments that differ (module docstring), below ``limit``, oldest first."""
    leader_bases = {s.base_offset for s in leader}
    follower_bases = {s.base_offset for s in follower}
    ends = {s.next_offset for s in leader} & {s.next_offset for s in follower}
    cuts = sorted((leader_bases & follower_bases) | ends)
    by_leader = {s.base_offset: s for s in leader}
    by_follower = {s.base_offset: s for s in follower}
    plan = AdoptionPlan([], [])
    for start, end in itertools.pairwise(cuts):
        if end > limit:
            break
        ours = _covering(by_follower, start, end)
        theirs = _covering(by_leader, start, end)
        if ours is None or theirs is None or ours == theirs:
            continue  # a side does not hold the whole range (log start, a gap in a listing), or same bytes
        if len(theirs) != 1:
            plan.unadoptable.append((start, end))
            continue
        plan.adoptions.append(Adoption(theirs[0], tuple(s.base_offset for s in ours)))
    return plan


def _covering(by_base: dict[int, SegmentDigest], start: int, end: int) -> list[SegmentDigest] | None:
    """The consecutive segments from ``start`` exactly to ``end``, or None if they do not tile it."""
    out = []
    at = start
    while at < end:
        segment = by_base.get(at)
        if segment is None:
            return None
        out.append(segment)
        at = segment.next_offset
    return out if at == end else None
