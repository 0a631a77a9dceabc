"""``replicas.segment_match``: which groups of a follower's segments differ from its leader's, and what
each side's files are described as."""

from __future__ import annotations

import os
import time
from pathlib import Path

import crc32c

from replicas.segment_match import (
    Adoption,
    LeaderBases,
    SegmentDigest,
    checksum_file,
    closed_segments,
    plan_adoptions,
)
from storage.segment import LOG_SUFFIX, segment_path


def _s(base: int, next_offset: int, size: int = 100, crc: int = 1) -> SegmentDigest:
    return SegmentDigest(base, next_offset, size, crc)


def test_the_same_segments_need_nothing() -> None:
    ours = [_s(0, 10), _s(10, 20)]
    assert plan_adoptions(ours, ours, 20) == ([], [])


def test_a_leader_group_merged_replaces_the_followers_segments() -> None:
    theirs = [_s(0, 20, 50, 7), _s(20, 30)]
    ours = [_s(0, 10), _s(10, 20), _s(20, 30)]
    plan = plan_adoptions(theirs, ours, 30)
    assert plan.adoptions == [Adoption(_s(0, 20, 50, 7), (0, 10))] and plan.unadoptable == []


def test_the_same_bounds_and_size_with_other_bytes_are_adopted() -> None:
    # a tombstone's delete horizon set by the leader's clean: the same size, another checksum
    plan = plan_adoptions([_s(0, 10, 100, 2)], [_s(0, 10, 100, 1)], 10)
    assert plan.adoptions == [Adoption(_s(0, 10, 100, 2), (0,))]


def test_nothing_at_or_above_the_limit_is_adopted() -> None:
    theirs, ours = [_s(0, 10, 100, 2), _s(10, 20, 100, 2)], [_s(0, 10), _s(10, 20)]
    assert [a.segment.base_offset for a in plan_adoptions(theirs, ours, 19).adoptions] == [0]
    assert plan_adoptions(theirs, ours, 9).adoptions == []


def test_a_group_of_several_leader_segments_is_left_and_listed() -> None:
    theirs = [_s(0, 10), _s(10, 20)]
    ours = [_s(0, 20, 200, 5)]
    assert plan_adoptions(theirs, ours, 20) == ([], [(0, 20)])


def test_ranges_only_one_side_holds_are_left_alone() -> None:
    # the follower starts later (its log start moved) and ends earlier: only the common groups count
    theirs = [_s(0, 10), _s(10, 20, 100, 9), _s(20, 30, 100, 9)]
    ours = [_s(10, 20)]
    assert plan_adoptions(theirs, ours, 30).adoptions == [Adoption(_s(10, 20, 100, 9), (10,))]


def test_leader_bases_say_where_to_roll() -> None:
    bases = LeaderBases()
    assert bases.between(0, 100) == [] and bases.first_above(0) is None
    bases.update([_s(0, 10), _s(10, 25)], 25)
    assert bases.between(0, 25) == [10, 25]
    assert bases.between(10, 24) == []
    assert bases.first_above(10) == 25 and bases.first_above(25) is None


def test_closed_segments_describe_the_files_with_their_crc(tmp_path: Path) -> None:
    for base, data in ((0, b"a" * 300), (7, b""), (9, b"b" * 50)):
        Path(segment_path(str(tmp_path), base, LOG_SUFFIX)).write_bytes(data)
    listing = closed_segments(str(tmp_path), checksums=True)
    assert listing.segments == [_s(0, 7, 300, crc32c.crc32c(b"a" * 300)), _s(7, 9, 0, 0)]
    assert listing.active_base_offset == 9 and not listing.swapping
    assert {s.checksum for s in closed_segments(str(tmp_path), checksums=False).segments} == {-1}
    path = segment_path(str(tmp_path), 0, LOG_SUFFIX)
    Path(path).write_bytes(b"c" * 300)  # replaced: the cached checksum is not used
    assert checksum_file(path) == (300, crc32c.crc32c(b"c" * 300))
    Path(path + ".deleted").write_bytes(b"")
    assert closed_segments(str(tmp_path), checksums=False).swapping


def test_a_checksum_is_not_cached_while_the_files_mtime_is_within_its_tick(tmp_path: Path) -> None:
    """Rewritten in place in the same tick of the kernel's clock, a file keeps its inode, size and mtime:
    its checksum is cached only once the mtime is over (here one in the future, never over)."""
    path = segment_path(str(tmp_path), 0, LOG_SUFFIX)
    Path(path).write_bytes(b"a" * 300)
    tick = time.time_ns() + 60 * 10**9
    os.utime(path, ns=(tick, tick))
    assert checksum_file(path) == (300, crc32c.crc32c(b"a" * 300))
    Path(path).write_bytes(b"b" * 300)
    os.utime(path, ns=(tick, tick))
    assert checksum_file(path) == (300, crc32c.crc32c(b"b" * 300))
