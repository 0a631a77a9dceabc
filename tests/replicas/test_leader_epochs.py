"""Where a follower truncates after a failover: the KIP-101 and KIP-279 scenarios, on real epoch caches.

Each scenario builds the leader's and the follower's leader-epoch caches as the failover history leaves
them, answers the follower's OffsetsForLeaderEpoch question from the leader's cache (as the broker does), and
checks the truncation offset -- then, where a truncation is intermediate, asks again with the follower's new
latest epoch, until complete.  The end-to-end versions (real logs, a real leader over TCP) are in
test_fetcher.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ipc.kafka import ErrorCode
from replicas.leader_epochs import (
    answer_offset_for_leader_epoch,
    begin_leader_epoch,
    check_current_leader_epoch,
    follower_truncation,
    truncation_without_epochs,
)
from storage.batch_builder import build_batch
from storage.checkpoints import EpochEntry, LeaderEpochCache
from storage.errors import NotLeaderError
from storage.log import Log


def cache(tmp_path: Path, name: str, entries: list[tuple[int, int]]) -> LeaderEpochCache:
    return LeaderEpochCache(str(tmp_path / name), [EpochEntry(e, o) for e, o in entries])


def settle(
    leader: LeaderEpochCache,
    leader_end: int,
    follower: LeaderEpochCache,
    follower_end: int,
    follower_hw: int = 0,
) -> tuple[int, int]:
    """Run the exchange to completion as a fetcher does; return (truncation offset, rounds)."""
    for rounds in range(1, 20):
        if follower.latest_epoch < 0:
            step = truncation_without_epochs(
                follower_log_end_offset=follower_end, follower_high_watermark=follower_hw
            )
        else:
            answer = answer_offset_for_leader_epoch(
                partition=0,
                requested_epoch=follower.latest_epoch,
                current_leader_epoch=-1,
                leader_epoch=9,
                end_offset_for=lambda epoch: leader.end_offset_for(epoch, leader_end),
            )
            assert answer.error_code == ErrorCode.NONE
            step = follower_truncation(
                leader_epoch=answer.leader_epoch,
                leader_end_offset=answer.end_offset,
                follower_epochs=follower,
                follower_log_end_offset=follower_end,
                follower_high_watermark=follower_hw,
            )
        assert step.offset <= follower_end
        follower_end = step.offset
        follower.truncate_from_end(step.offset)
        if step.complete:
            return step.offset, rounds
    raise AssertionError("truncation never completed")


def test_kip101_restarted_follower_keeps_replicated_records(tmp_path: Path) -> None:
    # KIP-101 scenario 1: follower B has m0, m1 (epoch 0) but its high watermark says 1.  Truncating to the
    # high watermark would drop m1, which the leader already acknowledged.  Asking the epoch keeps it.
    leader = cache(tmp_path, "a", [(0, 0)])
    follower = cache(tmp_path, "b", [(0, 0)])
    offset, rounds = settle(leader, 2, follower, 2, follower_hw=1)
    assert (offset, rounds) == (2, 1)


def test_kip101_divergent_follower_drops_what_the_new_leader_never_had(tmp_path: Path) -> None:
    # KIP-101 scenario 2: A led epoch 0 and wrote m0, m1; B had only m0.  Both crashed, B came back first and
    # leads epoch 1, writing m2 at offset 1.  A returns as a follower: its m1 at offset 1 must go.
    leader_b = cache(tmp_path, "b", [(0, 0), (1, 1)])
    follower_a = cache(tmp_path, "a", [(0, 0)])
    offset, _ = settle(leader_b, 2, follower_a, 2)
    assert offset == 1


def test_follower_behind_the_leader_truncates_nothing(tmp_path: Path) -> None:
    leader = cache(tmp_path, "a", [(0, 0), (3, 100)])
    follower = cache(tmp_path, "b", [(0, 0)])
    offset, _ = settle(leader, 250, follower, 80)
    assert offset == 80


def test_follower_ahead_in_the_same_epoch_is_cut_to_the_epoch_end(tmp_path: Path) -> None:
    # The follower led epoch 2 and wrote 60..79 that nobody else got; the leader moved on in epoch 4 at 60.
    leader = cache(tmp_path, "a", [(0, 0), (2, 40), (4, 60)])
    follower = cache(tmp_path, "b", [(0, 0), (2, 40)])
    offset, rounds = settle(leader, 90, follower, 80)
    assert (offset, rounds) == (60, 1)


def test_kip279_fast_failovers_need_a_second_round(tmp_path: Path) -> None:
    # KIP-279: the follower led epoch 2 (it never saw epoch 1); the leader saw epoch 1 but never epoch 2.
    #   leader:   0@0  1@50  3@70          end 100
    #   follower: 0@0  2@60                end 80  (60..79 written in epoch 2, 50..59 epoch-0 records here)
    # Round 1: follower asks 2 -> leader answers (1, 70); the follower has no epoch 1: cut where its epoch 0
    # ends (60) and ask again.  Round 2: asks 0 -> (0, 50): cut to 50 (the leader's 50..59 are epoch 1).
    leader = cache(tmp_path, "a", [(0, 0), (1, 50), (3, 70)])
    follower = cache(tmp_path, "b", [(0, 0), (2, 60)])
    offset, rounds = settle(leader, 100, follower, 80)
    assert (offset, rounds) == (50, 2)


def test_leader_that_knows_no_such_epoch_falls_back_to_the_high_watermark(tmp_path: Path) -> None:
    # The follower's epoch is newer than any the leader knows (an unclean leader with an older history).
    leader = cache(tmp_path, "a", [(0, 0)])
    follower = cache(tmp_path, "b", [(0, 0), (5, 30)])
    step = follower_truncation(
        leader_epoch=-1,
        leader_end_offset=-1,
        follower_epochs=follower,
        follower_log_end_offset=45,
        follower_high_watermark=35,
    )
    assert step == step._replace(offset=35, complete=True)
    assert leader.end_offset_for(5, 40) == (-1, -1)


def test_follower_without_epochs_truncates_to_its_high_watermark(tmp_path: Path) -> None:
    follower = cache(tmp_path, "b", [])
    assert settle(cache(tmp_path, "a", [(0, 0)]), 10, follower, 7, follower_hw=4) == (4, 1)
    assert truncation_without_epochs(follower_log_end_offset=3, follower_high_watermark=9).offset == 3


def test_epoch_older_than_the_followers_cache_uses_the_leaders_end(tmp_path: Path) -> None:
    # The follower's cache starts at epoch 3 (older entries were cleaned by retention); the leader answers
    # epoch 1: the follower tracks nothing at or below it, so the leader's end offset is the limit.
    follower = cache(tmp_path, "b", [(3, 500)])
    step = follower_truncation(
        leader_epoch=1,
        leader_end_offset=480,
        follower_epochs=follower,
        follower_log_end_offset=600,
        follower_high_watermark=0,
    )
    assert (step.offset, step.complete) == (480, True)


def test_v0_answer_without_epoch_uses_the_end_offset(tmp_path: Path) -> None:
    follower = cache(tmp_path, "b", [(0, 0), (1, 10)])
    step = follower_truncation(
        leader_epoch=-1,
        leader_end_offset=12,
        follower_epochs=follower,
        follower_log_end_offset=20,
        follower_high_watermark=0,
    )
    assert (step.offset, step.complete) == (12, True)


@pytest.mark.parametrize(
    ("requested", "ours", "expected"),
    [
        (-1, 5, ErrorCode.NONE),
        (5, 5, ErrorCode.NONE),
        (4, 5, ErrorCode.FENCED_LEADER_EPOCH),
        (6, 5, ErrorCode.UNKNOWN_LEADER_EPOCH),
    ],
)
def test_current_leader_epoch_fencing(requested: int, ours: int, expected: ErrorCode) -> None:
    assert check_current_leader_epoch(requested, ours) == expected


def test_fenced_offsets_for_leader_epoch_answer_carries_no_offsets(tmp_path: Path) -> None:
    leader = cache(tmp_path, "a", [(0, 0)])
    answer = answer_offset_for_leader_epoch(
        partition=3,
        requested_epoch=0,
        current_leader_epoch=1,
        leader_epoch=2,
        end_offset_for=lambda e: leader.end_offset_for(e, 9),
    )
    assert (answer.error_code, answer.partition, answer.leader_epoch, answer.end_offset) == (
        ErrorCode.FENCED_LEADER_EPOCH,
        3,
        -1,
        -1,
    )


def test_begin_leader_epoch_marks_where_the_old_epoch_ended(tmp_path: Path) -> None:
    # A promoted follower records its new epoch at its log end before appending anything, so the returning
    # old leader, asking about the epoch it led, learns where that epoch ends here (KIP-101).
    with Log.open(tmp_path / "t-0") as log:
        log.append(build_batch([b"a", b"b"]), leader_epoch=0)
        start = begin_leader_epoch(log, 1)
        assert start == 2 == log.log_end_offset
        assert log.end_offset_for_epoch(0) == (0, 2)
        assert begin_leader_epoch(log, 1) == 2  # idempotent
        log.append(build_batch([b"c"]), leader_epoch=1)
        assert begin_leader_epoch(log, 1) == 2
        with pytest.raises(NotLeaderError, match="epoch 1 is already recorded"):
            begin_leader_epoch(log, 0)
    assert LeaderEpochCache.load(str(tmp_path / "t-0" / "leader-epoch-checkpoint")).entries == [
        EpochEntry(0, 0),
        EpochEntry(1, 2),
    ]
