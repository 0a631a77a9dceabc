"""Deleting groups and committed offsets in the coordinator, planned and then written (no log behind it)."""

from __future__ import annotations

import itertools
import struct

from appliance.coordinator import GroupCoordinator, GroupSettings, GroupState, JoinArgs
from appliance.coordinator.subscription import subscribed_topics
from ipc.kafka import (
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)

SETTINGS = GroupSettings(initial_rebalance_delay_ms=0)


def coordinator() -> GroupCoordinator:
    ids = itertools.count(1)
    return GroupCoordinator(SETTINGS, new_member_id=lambda client: f"{client}-{next(ids)}")


def subscription(*topics: str) -> bytes:
    """Kafka's ConsumerProtocolSubscription v0: version, topics, user data (null)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def commit(c: GroupCoordinator, group: str, topic: str, partition: int, offset: int) -> None:
    body = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic(topic, [OffsetCommitRequestPartition(partition, offset, -1, -1, "")])])
    assert c.commit(body, 7, 0).topics[0].partitions[0].error_code == ErrorCode.NONE


def stable_member(c: GroupCoordinator, group: str, metadata: bytes, protocol_type: str = "consumer") -> str:
    args = JoinArgs(member_id="", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                    protocol_type=protocol_type, protocols=[("range", metadata)], client_id="c")
    (joined,) = c.join(group, args, "j", 0)
    member_id: str = joined.response.member_id
    assert c.sync(group, member_id, joined.response.generation_id, [(member_id, b"a")], "s", 0) == []
    c.take_metadata(0)  # the group's record is written: the SyncGroup is answered, the group Stable
    assert [done.token for done in c.confirm(c.take_unconfirmed(), 0)] == ["s"]
    assert c.groups[group].state == GroupState.STABLE
    return member_id


def offset_delete(group: str, **topics: list[int]) -> OffsetDeleteRequest:
    asked = [OffsetDeleteRequestTopic(t, [OffsetDeleteRequestPartition(p) for p in ps])
             for t, ps in topics.items()]
    return OffsetDeleteRequest(group, asked)


def every_partition(topic: str, partition: int) -> bool:
    return partition < 4


def test_an_empty_group_is_deleted_once_its_tombstones_are_written() -> None:
    c = coordinator()
    commit(c, "g", "t", 0, 5)
    commit(c, "g", "u", 1, 6)
    plan = c.plan_delete_groups(["g", "g", "nobody", ""])
    assert plan.results == {"g": ErrorCode.NONE, "nobody": ErrorCode.GROUP_ID_NOT_FOUND,
                            "": ErrorCode.INVALID_GROUP_ID}
    assert sorted(plan.deleting["g"]) == [("t", 0), ("u", 1)]
    # while the tombstones are written the group is Dead: no commit, no second deletion
    body = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 9, -1, -1, "")])])
    assert c.commit(body, 7, 0).topics[0].partitions[0].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert c.plan_delete_groups(["g"]).results == {"g": ErrorCode.GROUP_ID_NOT_FOUND}
    c.finish_delete("g", written=True)
    assert not c.offsets.has_group("g") and "g" not in c.groups
    assert [g.group_id for g in c.list_groups()] == []


def test_a_deletion_not_written_leaves_the_group_as_it_was() -> None:
    c = coordinator()
    commit(c, "g", "t", 0, 5)
    c.plan_delete_groups(["g"])
    c.finish_delete("g", written=False)
    assert c.groups["g"].state == GroupState.EMPTY
    assert c.offsets.get("g", "t", 0) is not None
    commit(c, "g", "t", 0, 7)


def test_a_group_with_members_is_not_deleted() -> None:
    c = coordinator()
    stable_member(c, "g", subscription("t"))
    assert c.plan_delete_groups(["g"]).results == {"g": ErrorCode.NON_EMPTY_GROUP}
    assert c.groups["g"].state == GroupState.STABLE


def test_offsets_of_an_empty_group_are_deleted_except_unknown_partitions() -> None:
    c = coordinator()
    commit(c, "g", "t", 0, 5)
    commit(c, "g", "t", 1, 6)
    plan = c.plan_offset_delete(offset_delete("g", t=[0, 2, 9]), every_partition)
    assert plan.response.error_code == ErrorCode.NONE
    assert [(p.partition_index, p.error_code) for p in plan.response.topics[0].partitions] == [
        (0, ErrorCode.NONE), (2, ErrorCode.NONE), (9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert plan.tombstones == [("t", 0)]  # partition 2 had no commit: nothing to write
    assert c.offsets.get("g", "t", 0) is not None  # not before the tombstones are written
    c.apply_offset_delete(plan)
    assert c.offsets.get("g", "t", 0) is None and c.offsets.get("g", "t", 1) is not None


def test_a_consumed_topic_keeps_its_offsets() -> None:
    c = coordinator()
    commit(c, "g", "t", 0, 5)
    commit(c, "g", "old", 0, 5)
    stable_member(c, "g", subscription("t"))
    plan = c.plan_offset_delete(offset_delete("g", t=[0], old=[0]), every_partition)
    errors = {t.name: t.partitions[0].error_code for t in plan.response.topics}
    assert errors == {"t": ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, "old": ErrorCode.NONE}
    assert plan.tombstones == [("old", 0)]


def test_unreadable_subscriptions_count_as_every_topic() -> None:
    c = coordinator()
    commit(c, "g", "t", 0, 5)
    stable_member(c, "g", b"\xff garbage")
    plan = c.plan_offset_delete(offset_delete("g", t=[0]), every_partition)
    assert plan.response.topics[0].partitions[0].error_code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
    assert plan.tombstones == []


def test_offset_delete_errors_for_the_whole_group() -> None:
    c = coordinator()
    stable_member(c, "connect", b"opaque", protocol_type="connect")
    cases = {"": ErrorCode.INVALID_GROUP_ID, "nobody": ErrorCode.GROUP_ID_NOT_FOUND,
             "connect": ErrorCode.NON_EMPTY_GROUP}
    for group, code in cases.items():
        plan = c.plan_offset_delete(offset_delete(group, t=[0]), every_partition)
        assert (plan.response.error_code, plan.response.topics, plan.tombstones) == (code, [], [])


def test_subscriptions_are_read_from_every_member() -> None:
    assert subscribed_topics([subscription("a", "b"), subscription("c")]) == {"a", "b", "c"}
    assert subscribed_topics([subscription("a"), b"\x00"]) is None
    assert subscribed_topics([]) == set()


# -- offsets.retention.minutes ---------------------------------------------------------------------------

RETENTION_MS = 60_000


def commit_at(c: GroupCoordinator, group: str, partition: int, wall_ms: int) -> None:
    body = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(partition, 1, -1, -1, "")])])
    plan = c.plan_commit(body, 7, 0, wall_ms)
    c.apply(plan)


def test_offsets_of_a_group_that_never_had_members_expire_one_by_one() -> None:
    c = coordinator()
    commit_at(c, "simple", 0, 1_000)
    commit_at(c, "simple", 1, 30_000)
    assert c.plan_expiry(1_000 + RETENTION_MS - 1, RETENTION_MS) == []
    (plan,) = c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS)
    assert (plan.group_id, plan.tombstones, plan.remove_group) == ("simple", [("t", 0)], False)
    c.finish_expiry(plan, written=True)
    assert c.offsets.topics_of("simple") == {"t": [1]}


def test_an_empty_groups_offsets_expire_from_when_it_emptied_and_the_group_goes_with_them() -> None:
    c = coordinator()
    member = stable_member(c, "g", subscription("t"))
    generation = c.groups["g"].generation_id
    body = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=generation, member_id=member,
                               topics=[OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 5)])])
    c.apply(c.plan_commit(body, 7, 0, 1_000))  # committed long before the group empties
    c.take_metadata(2_000)
    assert c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS) == []  # a member: kept
    c.leave("g", [(member, None)], 0)
    c.take_metadata(100_000)  # emptied: its record written at wall 100 s
    assert c.plan_expiry(100_000 + RETENTION_MS - 1, RETENTION_MS) == []
    (plan,) = c.plan_expiry(100_000 + RETENTION_MS, RETENTION_MS)
    assert (plan.tombstones, plan.remove_group) == ([("t", 0)], True)
    assert c.groups["g"].state == GroupState.DEAD  # while the tombstones are written
    c.finish_expiry(plan, written=True)
    assert "g" not in c.groups and not c.offsets.has_group("g")


def test_a_commits_own_retention_and_timestamp_count_as_kafka_counts_them() -> None:
    """OffsetCommit v2-v4 ``retention_time_ms`` gives the offset its own expire timestamp (the broker's
    time plus it: sooner or later than ``offsets.retention.minutes``), -1 leaves the setting; v1's
    per-partition ``commit_timestamp`` is the commit's time (-1: the broker's); v5+ have neither."""
    c = coordinator()

    def at(version: int, partition: int, *, retention_ms: int = -1, stamp: int = -1) -> None:
        part = OffsetCommitRequestPartition(partition, 5, commit_timestamp=stamp)
        body = OffsetCommitRequest(group_id="own", generation_id_or_member_epoch=-1, member_id="",
                                   retention_time_ms=retention_ms,
                                   topics=[OffsetCommitRequestTopic("t", [part])])
        c.apply(c.plan_commit(body, version, 0, 1_000))

    at(2, 0, retention_ms=500)  # expires at 1,500, long before the setting would have it
    at(4, 1, retention_ms=2 * RETENTION_MS)  # outlives the setting
    at(3, 2)  # -1: the setting, from its commit timestamp
    at(1, 3, stamp=-RETENTION_MS)  # v1: its own (old) commit timestamp
    at(5, 4, retention_ms=500)  # v5 has no retention_time_ms: ignored
    at(1, 5)  # v1 with -1: the broker's time
    kept = c.offsets.commits["own"]["t"]
    got = {p: (e.commit_timestamp_ms, e.expire_timestamp_ms) for p, e in kept.items()}
    assert got == {0: (1_000, 1_500), 1: (1_000, 1_000 + 2 * RETENTION_MS), 2: (1_000, -1),
                   3: (-RETENTION_MS, -1), 4: (1_000, -1), 5: (1_000, -1)}
    (plan,) = c.plan_expiry(1_500, RETENTION_MS)
    assert sorted(plan.tombstones) == [("t", 0), ("t", 3)]
    c.finish_expiry(plan, written=True)
    (plan,) = c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS)
    assert sorted(plan.tombstones) == [("t", 2), ("t", 4), ("t", 5)]  # partition 1 is kept
    c.finish_expiry(plan, written=True)
    (plan,) = c.plan_expiry(1_000 + 2 * RETENTION_MS, RETENTION_MS)
    assert plan.tombstones == [("t", 1)]


def test_an_empty_groups_offset_with_its_own_retention_expires_then_whenever_the_group_emptied() -> None:
    c = coordinator()
    member = stable_member(c, "g", subscription("t"))
    generation = c.groups["g"].generation_id
    part = OffsetCommitRequestPartition(0, 5)
    body = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=generation, member_id=member,
                               retention_time_ms=10_000, topics=[OffsetCommitRequestTopic("t", [part])])
    c.apply(c.plan_commit(body, 4, 0, 1_000))
    assert c.plan_expiry(20_000, RETENTION_MS) == []  # a member: kept, whatever its expire timestamp
    c.leave("g", [(member, None)], 0)
    c.take_metadata(30_000)  # emptied just now
    (plan,) = c.plan_expiry(30_000, RETENTION_MS)  # its own retention ran out before
    assert (plan.tombstones, plan.remove_group) == ([("t", 0)], True)


def test_an_expiry_not_written_changes_nothing() -> None:
    c = coordinator()
    member = stable_member(c, "g", subscription("t"))
    commit(c, "g-simple", "t", 0, 1)
    c.leave("g", [(member, None)], 0)
    c.take_metadata(0)
    plans = c.plan_expiry(RETENTION_MS, RETENTION_MS)
    assert {p.group_id: p.remove_group for p in plans} == {"g": True, "g-simple": False}
    for plan in plans:
        c.finish_expiry(plan, written=False)
    assert c.groups["g"].state == GroupState.EMPTY and c.offsets.has_group("g-simple")


# -- group.max.size ---------------------------------------------------------------------------------------


def test_a_full_group_refuses_new_members_and_keeps_its_own() -> None:
    c = GroupCoordinator(GroupSettings(initial_rebalance_delay_ms=0, max_size=1),
                         new_member_id=lambda client: f"{client}-1")
    member = stable_member(c, "g", subscription("t"))
    args = JoinArgs(member_id="", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                    protocol_type="consumer", protocols=[("range", b"m")], client_id="other")
    (refused,) = c.join("g", args, "j", 0)
    assert refused.response.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert list(c.groups["g"].members) == [member] and c.groups["g"].state == GroupState.STABLE


def test_a_commit_being_written_is_not_expired_under_it() -> None:
    """Kafka's pendingOffsetCommits: the expiry's tombstone would land after the commit and delete it."""
    c = coordinator()
    commit_at(c, "simple", 0, 1_000)
    commit_at(c, "simple", 1, 1_000)
    body = OffsetCommitRequest(group_id="simple", generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 9, -1, -1, "")])])
    fresh = c.plan_commit(body, 7, 0, 1_000 + RETENTION_MS)  # being written to __consumer_offsets
    (plan,) = c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS)
    assert plan.tombstones == [("t", 1)]  # partition 0 waits for the next check
    c.apply(fresh)
    c.finish_expiry(plan, written=True)
    committed = c.offsets.get("simple", "t", 0)
    assert committed is not None and committed.offset == 9
    assert c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS) == []  # its new commit is recent


def test_a_commit_that_could_not_be_written_no_longer_holds_back_the_expiry() -> None:
    c = coordinator()
    commit_at(c, "simple", 0, 1_000)
    body = OffsetCommitRequest(group_id="simple", generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 9, -1, -1, "")])])
    failed = c.plan_commit(body, 7, 0, 1_000 + RETENTION_MS)
    assert c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS) == []
    c.discard(failed)  # its append failed: answered with the error, nothing stored
    (plan,) = c.plan_expiry(1_000 + RETENTION_MS, RETENTION_MS)
    assert plan.tombstones == [("t", 0)]
