"""The classic rebalance protocol, driven with a fake clock: joins, the leader's sync, fencing, expiry."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.coordinator import Completion, GroupCoordinator, GroupSettings, GroupState, JoinArgs
from appliance.coordinator.group import AssignmentStore, StaticReplacement
from ipc.kafka import (
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
)

SETTINGS = GroupSettings(min_session_timeout_ms=6000, max_session_timeout_ms=1800000,
                         initial_rebalance_delay_ms=100)
SESSION_MS = 10_000
REBALANCE_MS = 30_000


def coordinator() -> GroupCoordinator:
    ids = itertools.count(1)
    return GroupCoordinator(SETTINGS, new_member_id=lambda client: f"{client}-{next(ids)}")


def join_args(member_id: str = "", *, protocols: list[tuple[str, bytes]] | None = None,
              session_ms: int = SESSION_MS, two_step: bool = False) -> JoinArgs:
    return JoinArgs(member_id=member_id, session_timeout_ms=session_ms, rebalance_timeout_ms=REBALANCE_MS,
                    protocol_type="consumer", protocols=protocols or [("range", b"meta")], client_id="c",
                    require_known_member_id=two_step)


def answers(completions: list[Completion]) -> dict[Any, Any]:
    return {c.token: c.response for c in completions}


def stable_group(c: GroupCoordinator, n: int, *, write: bool = True) -> list[str]:
    """n members joined at time 0, rebalanced once (after the initial delay) and synced, the group's record
    written (``write``; else the group waits for it, CompletingRebalance); their ids."""
    for i in range(n):
        assert c.join("g", join_args(), f"j{i}", 0) == []
    delay = SETTINGS.initial_rebalance_delay_ms
    done = answers(c.tick(delay) + c.tick(2 * delay))  # several joined: the delay is waited twice
    ids = [done[f"j{i}"].member_id for i in range(n)]
    leader = done["j0"].leader
    generation = done["j0"].generation_id
    for i, member_id in enumerate(ids):
        if member_id != leader:
            assert c.sync("g", member_id, generation, [], f"s{i}", 200) == []
    plan = [(m, f"part-{m}".encode()) for m in ids]
    assert c.sync("g", leader, generation, plan, "s-leader", 200) == []  # held until the record is written
    assert c.groups["g"].state == GroupState.COMPLETING_REBALANCE
    if not write:
        return ids
    synced = answers(written(c, 200))
    assert set(synced) == {f"s{i}" for i in range(n) if ids[i] != leader} | {"s-leader"}
    assert all(r.error_code == ErrorCode.NONE for r in synced.values())
    assert c.groups["g"].state == GroupState.STABLE
    return ids


def written(c: GroupCoordinator, now_ms: int) -> list[Completion]:
    """The group metadata records due are written (as the broker writes them to ``__consumer_offsets``):
    what they record is confirmed at ``now_ms`` (also their wall time); the answers that releases."""
    c.take_metadata(now_ms)
    return c.confirm(c.take_unconfirmed(), now_ms)


def test_members_joining_in_the_initial_delay_rebalance_once_and_the_leader_sees_all() -> None:
    c = coordinator()
    assert c.join("g", join_args(), "a", 0) == []
    assert c.join("g", join_args(), "b", 50) == []  # a new member: the delay is waited again
    assert c.tick(100) == []
    assert c.tick(199) == []
    done = answers(c.tick(200))
    assert set(done) == {"a", "b"}
    assert {r.generation_id for r in done.values()} == {1}
    leader = done["a"]
    assert leader.leader == leader.member_id and len(leader.members) == 2
    assert done["b"].members == [] and done["b"].protocol_name == "range"
    assert c.groups["g"].state == GroupState.COMPLETING_REBALANCE


def test_followers_get_the_leaders_assignment_when_it_syncs() -> None:
    c = coordinator()
    ids = stable_group(c, 3)
    g = c.groups["g"]
    for member_id in ids:
        got = answers(c.sync("g", member_id, g.generation_id, [], "again", 300))["again"]
        assert got.error_code == ErrorCode.NONE and got.assignment == f"part-{member_id}".encode()


def test_two_step_join_answers_member_id_required_then_accepts_that_id() -> None:
    c = coordinator()
    first = answers(c.join("g", join_args(two_step=True), "t1", 0))["t1"]
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
    assert c.join("g", join_args(first.member_id, two_step=True), "t2", 10) == []
    done = answers(c.tick(200))
    assert done["t2"].error_code == ErrorCode.NONE and done["t2"].member_id == first.member_id


def test_a_member_leaving_a_stable_group_makes_the_others_rejoin_and_a_new_generation() -> None:
    c = coordinator()
    a, b = stable_group(c, 2)
    generation = c.groups["g"].generation_id
    response, released = c.leave("g", [(b, None)], 1000)
    assert response.error_code == ErrorCode.NONE and released == []
    assert c.heartbeat("g", a, generation, 1001).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    done = answers(c.join("g", join_args(a), "rejoin", 1002))
    assert done["rejoin"].generation_id == generation + 1 and done["rejoin"].leader == a


def test_stale_generation_and_unknown_member_are_fenced_and_commit_nothing() -> None:
    c = coordinator()
    a, _ = stable_group(c, 2)
    generation = c.groups["g"].generation_id
    assert c.heartbeat("g", a, generation - 1, 300).error_code == ErrorCode.ILLEGAL_GENERATION
    assert c.heartbeat("g", "nobody", generation, 300).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    for member_id, gen, error in ((a, generation - 1, ErrorCode.ILLEGAL_GENERATION),
                                  ("nobody", generation, ErrorCode.UNKNOWN_MEMBER_ID)):
        response = c.commit(commit_request(member_id, gen, 42), 7, 300)
        assert response.topics[0].partitions[0].error_code == error
    assert fetched(c) == -1
    response = c.commit(commit_request(a, generation, 42), 7, 300)
    assert response.topics[0].partitions[0].error_code == ErrorCode.NONE
    assert fetched(c) == 42


def commit_request(member_id: str, generation: int, offset: int) -> OffsetCommitRequest:
    part = OffsetCommitRequestPartition(partition_index=0, committed_offset=offset, committed_metadata=None)
    return OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=generation, member_id=member_id,
                               topics=[OffsetCommitRequestTopic("t", [part])])


def fetched(c: GroupCoordinator) -> int:
    response = c.fetch(OffsetFetchRequest("g", [OffsetFetchRequestTopic("t", [0])]))
    return int(response.topics[0].partitions[0].committed_offset)


def test_a_silent_member_is_removed_after_its_session_timeout() -> None:
    c = coordinator()
    a, b = stable_group(c, 2)
    generation = c.groups["g"].generation_id
    now = 200 + SESSION_MS - 1
    assert c.heartbeat("g", a, generation, now).error_code == ErrorCode.NONE
    c.tick(200 + SESSION_MS)
    assert b not in c.groups["g"].members
    assert c.groups["g"].state == GroupState.PREPARING_REBALANCE


def test_session_timeout_out_of_range_and_empty_group_id_are_refused() -> None:
    c = coordinator()
    for ms in (SETTINGS.min_session_timeout_ms - 1, SETTINGS.max_session_timeout_ms + 1):
        got = answers(c.join("g", join_args(session_ms=ms), "t", 0))["t"]
        assert got.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert answers(c.join("", join_args(), "t", 0))["t"].error_code == ErrorCode.INVALID_GROUP_ID
    assert c.groups.get("g") is None or not c.groups["g"].members


def test_a_member_with_no_protocol_in_common_is_refused_and_changes_nothing() -> None:
    c = coordinator()
    ids = stable_group(c, 2)
    got = answers(c.join("g", join_args(protocols=[("other", b"\xff" * 7)]), "x", 300))["x"]
    assert got.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert c.groups["g"].state == GroupState.STABLE and list(c.groups["g"].members) == ids


def test_garbage_metadata_is_passed_through_opaque() -> None:
    c = coordinator()
    c.join("g", join_args(protocols=[("range", b"\x00\xff garbage")]), "a", 0)
    done = answers(c.tick(100))
    assert done["a"].members[0].metadata == b"\x00\xff garbage"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "heartbeat", "tick", "sync", "write", "fail"]),
                          st.integers(0, 3), st.integers(1, 4000)), max_size=40))
def test_every_held_request_is_answered_once_and_generations_only_grow(
    steps: list[tuple[str, int, int]],
) -> None:
    """Whatever the order of joins, leaves, heartbeats, SyncGroups, group records written or failed and
    time, each held JoinGroup and SyncGroup gets exactly one answer, generations never go back while a
    group lives (an Empty group without offsets is removed, as Kafka's Dead group is, and one made again
    starts at 0), and a Stable or CompletingRebalance group has a leader member."""
    c = coordinator()
    now = 0
    held: set[str] = set()
    answered: set[str] = set()
    known: dict[int, str] = {}
    last_generation = 0
    alive: object = None
    for n, (op, who, dt) in enumerate(steps):
        now += dt
        out: list[Completion] = []
        if op == "join":
            token = f"j{n}"
            held.add(token)
            out = c.join("g", join_args(known.get(who, "")), token, now)
        elif op == "leave" and who in known:
            out = c.leave("g", [(known.pop(who), None)], now)[1]
        elif op == "heartbeat" and who in known and "g" in c.groups:
            c.heartbeat("g", known[who], c.groups["g"].generation_id, now)
        elif op == "sync" and who in known and "g" in c.groups:
            token = f"s{n}"
            held.add(token)
            group = c.groups["g"]
            plan = [(m, b"a") for m in group.members]
            out = c.sync("g", known[who], group.generation_id, plan, token, now)
        elif op in ("write", "fail"):  # the records due are written, or their append fails
            c.take_metadata(now)
            unconfirmed = c.take_unconfirmed()
            out = (c.confirm(unconfirmed, now) if op == "write"
                   else c.undo(unconfirmed, ErrorCode.COORDINATOR_NOT_AVAILABLE, now))
        else:
            out = c.tick(now)
        for done in out:
            assert done.token not in answered
            answered.add(done.token)
            response = done.response
            if getattr(response, "error_code", None) == ErrorCode.NONE and hasattr(response, "leader"):
                slot = int(done.token[1:]) if done.token.startswith("j") else -1
                known[steps[slot][1]] = response.member_id
        group = c.groups.get("g")
        if group is not None:
            if group is not alive:  # a new group object: the old one was removed
                alive, last_generation = group, 0
            assert group.generation_id >= last_generation
            last_generation = group.generation_id
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                assert group.leader_id in group.members
    c.take_metadata(now)
    final = c.confirm(c.take_unconfirmed(), now) + c.tick(now + 10 * REBALANCE_MS)
    for done in final:
        assert done.token not in answered
        answered.add(done.token)
    assert held == answered


def test_a_member_commits_while_the_next_rebalance_is_prepared_but_not_before_its_assignment() -> None:
    c = coordinator()
    a, b = stable_group(c, 2)
    generation = c.groups["g"].generation_id
    c.leave("g", [(b, None)], 1000)  # PreparingRebalance: a's partitions are being revoked
    response = c.commit(commit_request(a, generation, 7), 7, 1001)
    assert response.topics[0].partitions[0].error_code == ErrorCode.NONE and fetched(c) == 7
    rejoined = answers(c.join("g", join_args(a), "rejoin", 1002))["rejoin"]
    assert c.groups["g"].state == GroupState.COMPLETING_REBALANCE
    response = c.commit(commit_request(a, rejoined.generation_id, 9), 7, 1003)
    assert response.topics[0].partitions[0].error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert fetched(c) == 7


# -- static membership -----------------------------------------------------------------------------------


def static_args(instance: str, member_id: str = "", protocols: list[tuple[str, bytes]] | None = None,
                ) -> JoinArgs:
    args = join_args(member_id, protocols=protocols, two_step=True)
    args.group_instance_id = instance
    return args


def static_group(c: GroupCoordinator) -> dict[str, str]:
    """Two static members, "ia" (the leader) and "ib", Stable: instance id -> member id."""
    both = [("range", b"m"), ("roundrobin", b"m")]
    assert c.join("g", static_args("ia", protocols=both), "ja", 0) == []
    assert c.join("g", static_args("ib", protocols=both), "jb", 0) == []
    done = answers(c.tick(100) + c.tick(200))  # two joined in the initial delay: waited twice
    ids = {"ia": done["ja"].member_id, "ib": done["jb"].member_id}
    generation = done["ja"].generation_id
    assert done["ja"].leader == ids["ia"]
    c.sync("g", ids["ib"], generation, [], "sb", 210, "ib")
    c.sync("g", ids["ia"], generation, [(m, f"part-{i}".encode()) for i, m in ids.items()], "sa", 210, "ia")
    assert set(answers(written(c, 210))) == {"sa", "sb"}
    assert c.groups["g"].state == GroupState.STABLE
    return ids


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance() -> None:
    c = coordinator()
    ids = static_group(c)
    g = c.groups["g"]
    generation = g.generation_id
    done = answers(c.join("g", static_args("ib"), "again", 1000))["again"]  # the same consumer, restarted
    assert done.error_code == ErrorCode.NONE and done.member_id not in ids.values()
    assert (done.generation_id, done.leader, done.members) == (generation, ids["ia"], [])
    assert g.state == GroupState.STABLE
    synced = answers(c.sync("g", done.member_id, generation, [], "s", 1001, "ib"))["s"]
    assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, b"part-ib")
    assert c.heartbeat("g", ids["ia"], generation, 1002, "ia").error_code == ErrorCode.NONE  # no rebalance
    # the old copy of the member is fenced, whatever it sends
    assert c.heartbeat("g", ids["ib"], generation, 1003, "ib").error_code == ErrorCode.FENCED_INSTANCE_ID
    old = answers(c.join("g", static_args("ib", ids["ib"]), "old", 1004))["old"]
    assert old.error_code == ErrorCode.FENCED_INSTANCE_ID
    response, _ = c.leave("g", [(ids["ib"], "ib")], 1005)
    assert response.members[0].error_code == ErrorCode.FENCED_INSTANCE_ID
    assert g.state == GroupState.STABLE and len(g.members) == 2


def test_a_restarted_static_leader_is_not_told_it_leads() -> None:
    c = coordinator()
    ids = static_group(c)
    done = answers(c.join("g", static_args("ia"), "again", 1000))["again"]
    assert done.leader == ids["ia"] != done.member_id and done.members == []
    assert c.groups["g"].leader_id == done.member_id  # it leads the next rebalance


def test_a_static_member_rejoining_with_another_protocol_starts_a_rebalance() -> None:
    c = coordinator()
    ids = static_group(c)
    generation = c.groups["g"].generation_id
    protocols = [("roundrobin", b"m"), ("range", b"m")]
    assert c.join("g", static_args("ia", protocols=protocols), "again", 1000) == []  # held: a rebalance
    assert c.groups["g"].state == GroupState.PREPARING_REBALANCE
    assert c.heartbeat("g", ids["ib"], generation, 1001, "ib").error_code == ErrorCode.REBALANCE_IN_PROGRESS


def test_a_static_member_leaves_by_its_instance_id_or_when_its_session_expires() -> None:
    c = coordinator()
    ids = static_group(c)
    response, _ = c.leave("g", [("", "ia")], 1000)  # an admin tool names the instance only
    assert response.members[0].error_code == ErrorCode.NONE and ids["ia"] not in c.groups["g"].members
    assert c.leave("g", [("", "nobody")], 1000)[0].members[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    g = c.groups["g"]
    c.tick(1000 + SESSION_MS + REBALANCE_MS + 1)  # "ib" goes silent: removed at its session's end
    assert g.members == {} and g.static_members == {}


def test_a_static_replacement_whose_record_is_not_written_is_undone_and_answered_the_error() -> None:
    """Kafka's storeGroup callback: the old member id stays, the new one is refused with the append's error,
    an empty member id and the group's generation and leader."""
    c = coordinator()
    ids = static_group(c)
    g = c.groups["g"]
    generation = g.generation_id
    done = answers(c.join("g", static_args("ib"), "again", 1000))["again"]
    assert done.error_code == ErrorCode.NONE
    replaced = [u for u in c.take_unconfirmed() if isinstance(u, StaticReplacement)]
    assert [r.group_id for r in replaced] == ["g"]
    assert c.take_unconfirmed() == []  # taken once, with its record
    (undone,) = c.undo(replaced, ErrorCode.COORDINATOR_NOT_AVAILABLE, 1001)
    assert undone.token == "again"
    response = undone.response
    assert (response.error_code, response.member_id) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, "")
    assert (undone.response.generation_id, undone.response.leader) == (generation, ids["ia"])
    assert set(g.members) == set(ids.values()) and g.static_members == ids
    assert g.state == GroupState.STABLE
    assert c.heartbeat("g", ids["ib"], generation, 1002, "ib").error_code == ErrorCode.NONE
    assert c.heartbeat("g", done.member_id, generation, 1002, "ib").error_code == ErrorCode.FENCED_INSTANCE_ID
    synced = answers(c.sync("g", ids["ib"], generation, [], "s", 1003, "ib"))["s"]
    assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, b"part-ib")


def test_describe_shows_protocol_metadata_and_assignments_only_when_stable() -> None:
    """Kafka's GroupMetadata.summary: outside Stable, the protocol name and every member's metadata and
    assignment are empty; the state, the protocol type and the members are there."""
    c = coordinator()
    ids = stable_group(c, 2)
    stable = c.describe("g")
    assert (stable.group_state, stable.protocol_type, stable.protocol_data) == ("Stable", "consumer", "range")
    assert {(m.member_metadata, m.member_assignment) for m in stable.members} == {
        (b"meta", f"part-{m}".encode()) for m in ids}
    generation = c.groups["g"].generation_id
    assert c.join("g", join_args(ids[0]), "rejoin", 300) == []  # the leader rejoins: a rebalance
    for state in ("PreparingRebalance", "CompletingRebalance"):
        if state == "CompletingRebalance":
            c.join("g", join_args(ids[1]), "rejoin-2", 301)
        described = c.describe("g")
        assert (described.group_state, described.protocol_type, described.protocol_data) == (
            state, "consumer", "")
        assert [m.member_id for m in described.members] == ids
        assert {(m.member_metadata, m.member_assignment) for m in described.members} == {(b"", b"")}
    assert c.groups["g"].generation_id == generation + 1


def test_a_rebalance_completes_only_once_its_record_is_written() -> None:
    """Kafka's doSyncGroup: after the leader's SyncGroup the group stays CompletingRebalance while its
    record is appended (DescribeGroups says so and shows no assignment, a commit is REBALANCE_IN_PROGRESS, a
    heartbeat is answered, a late follower's SyncGroup waits); once written it is Stable and every
    SyncGroup is answered its assignment."""
    c = coordinator()
    for token in ("ja", "jb"):
        c.join("g", join_args(), token, 0)
    joined = answers(c.tick(100) + c.tick(200))
    leader, generation = joined["ja"].leader, joined["ja"].generation_id
    follower = next(r.member_id for r in joined.values() if r.member_id != leader)
    plan = [(leader, b"p-leader"), (follower, b"p-follower")]
    assert c.sync("g", leader, generation, plan, "s-leader", 300) == []
    described = c.describe("g")
    assert (described.group_state, described.protocol_data) == ("CompletingRebalance", "")
    assert {m.member_assignment for m in described.members} == {b""}
    refused = c.commit(commit_request(follower, generation, 5), 7, 301)
    assert refused.topics[0].partitions[0].error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert c.heartbeat("g", follower, generation, 302).error_code == ErrorCode.NONE
    assert c.sync("g", follower, generation, [], "s-follower", 303) == []  # after the leader's: held too
    done = answers(written(c, 304))
    assert {t: (r.error_code, r.assignment) for t, r in done.items()} == {
        "s-leader": (ErrorCode.NONE, b"p-leader"), "s-follower": (ErrorCode.NONE, b"p-follower")}
    assert c.describe("g").group_state == "Stable"


def test_a_rebalance_begun_while_the_record_is_written_answers_the_syncs_and_ignores_the_record() -> None:
    c = coordinator()
    stable_group(c, 2, write=False)  # both SyncGroups held, the record not written yet
    c.take_metadata(0)
    stored = c.take_unconfirmed()
    joined = answers(c.join("g", join_args(), "new", 400))  # a new member: a rebalance
    assert {t: r.error_code for t, r in joined.items()} == {
        "s-leader": ErrorCode.REBALANCE_IN_PROGRESS, "s1": ErrorCode.REBALANCE_IN_PROGRESS}
    assert c.confirm(stored, 400) == [] and c.groups["g"].state == GroupState.PREPARING_REBALANCE


def test_a_syncgroup_sent_again_while_held_answers_the_first_and_writes_one_record() -> None:
    """A member whose SyncGroup is held sends another (a client on a new connection): the first is answered
    REBALANCE_IN_PROGRESS, the second when the record is written; a leader's second assignment is not
    stored again (its first is being written)."""
    c = coordinator()
    ids = stable_group(c, 2, write=False)  # both SyncGroups held, the leader's record due
    leader = c.groups["g"].leader_id
    follower = next(m for m in ids if m != leader)
    generation = c.groups["g"].generation_id
    for member_id, first in ((leader, "s-leader"), (follower, f"s{ids.index(follower)}")):
        again = answers(c.sync("g", member_id, generation, [(m, b"other") for m in ids], f"{first}-2", 300))
        assert {t: r.error_code for t, r in again.items()} == {first: ErrorCode.REBALANCE_IN_PROGRESS}
    c.take_metadata(300)
    stored = c.take_unconfirmed()
    assert len(stored) == 1
    synced = answers(c.confirm(stored, 301))
    assert {t: (r.error_code, r.assignment) for t, r in synced.items()} == {
        "s-leader-2": (ErrorCode.NONE, f"part-{leader}".encode()),
        f"s{ids.index(follower)}-2": (ErrorCode.NONE, f"part-{follower}".encode())}
    assert c.groups["g"].state == GroupState.STABLE


def test_members_answered_when_the_record_is_written_or_fails_have_a_new_session() -> None:
    """As Kafka's ``propagateAssignment``: a member whose SyncGroup was held (the leader assigning, the record
    being written) could not heartbeat meanwhile; its session starts again when it is answered."""
    late = 200 + SESSION_MS + 1_000  # the SyncGroups were held longer than a session
    c = coordinator()
    ids = stable_group(c, 2, write=False)  # both synced at 200
    c.take_metadata(0)
    assert len(c.confirm(c.take_unconfirmed(), late)) == 2
    assert c.tick(late + 1) == []
    assert (c.groups["g"].state, set(c.groups["g"].members)) == (GroupState.STABLE, set(ids))
    c = coordinator()
    ids = stable_group(c, 2, write=False)
    c.take_metadata(0)
    failed = c.undo(c.take_unconfirmed(), ErrorCode.COORDINATOR_NOT_AVAILABLE, late)
    assert [r.response.error_code for r in failed] == [ErrorCode.COORDINATOR_NOT_AVAILABLE] * 2
    c.tick(late + 1)  # they have a session's time to join again
    assert (c.groups["g"].state, set(c.groups["g"].members)) == (GroupState.PREPARING_REBALANCE, set(ids))


def test_commits_are_checked_as_kafkas_validate_offset_commit_for_every_version_and_state() -> None:
    """v0 carries no generation (a simple commit); a simple commit is for a group with no members only;
    a generation names a member; with no group at all a generation is ILLEGAL_GENERATION."""
    c = coordinator()

    def code(group: str, member_id: str, generation: int, version: int = 7,
             instance_id: str | None = None) -> ErrorCode:
        body = commit_request(member_id, generation, 1)
        body.group_id, body.group_instance_id = group, instance_id
        return ErrorCode(c.commit(body, version, 300).topics[0].partitions[0].error_code)

    # no group
    assert code("none-1", "", -1) == ErrorCode.NONE  # a simple commit makes a simple group
    assert code("none-2", "someone", -1) == ErrorCode.NONE  # Kafka: generation -1 to an Empty group
    assert code("none-3", "", -1, version=0) == ErrorCode.NONE
    assert code("none-4", "someone", 3) == ErrorCode.ILLEGAL_GENERATION
    assert code("none-5", "", 0, version=1) == ErrorCode.ILLEGAL_GENERATION
    # a simple group (offsets, no member)
    assert code("none-1", "", -1, version=0) == ErrorCode.NONE
    assert code("none-1", "someone", -1) == ErrorCode.NONE
    assert code("none-1", "someone", 3) == ErrorCode.UNKNOWN_MEMBER_ID
    # a group with members
    a, _ = stable_group(c, 2)
    generation = c.groups["g"].generation_id
    assert code("g", "", -1, version=0) == ErrorCode.UNKNOWN_MEMBER_ID
    for version in (1, 2, 5, 7, 8):
        assert code("g", "", -1, version=version) == ErrorCode.UNKNOWN_MEMBER_ID
    assert code("g", a, -1) == ErrorCode.ILLEGAL_GENERATION
    assert code("g", "nobody", generation) == ErrorCode.UNKNOWN_MEMBER_ID
    assert code("g", a, generation) == ErrorCode.NONE


def test_a_rebalance_whose_record_is_not_written_starts_again() -> None:
    """Kafka's SyncGroup store callback: on a failed write the assignments are dropped, the SyncGroups
    answered the error (the broker's part) and the group prepares another rebalance."""
    c = coordinator()
    a, b = stable_group(c, 2, write=False)
    generation = c.groups["g"].generation_id
    c.take_metadata(0)
    (stored,) = c.take_unconfirmed()
    assert stored == AssignmentStore("g", generation)
    failed = answers(c.undo([stored], ErrorCode.COORDINATOR_NOT_AVAILABLE, 300))
    assert {t: r.error_code for t, r in failed.items()} == {
        "s-leader": ErrorCode.COORDINATOR_NOT_AVAILABLE, "s1": ErrorCode.COORDINATOR_NOT_AVAILABLE}
    g = c.groups["g"]
    assert g.state == GroupState.PREPARING_REBALANCE and {m.assignment for m in g.members.values()} == {b""}
    assert c.heartbeat("g", b, generation, 301).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    c.join("g", join_args(a), "ja", 302)
    done = answers(c.join("g", join_args(b), "jb", 303))
    assert {r.generation_id for r in done.values()} == {generation + 1}
    assert c.undo([stored], ErrorCode.COORDINATOR_NOT_AVAILABLE, 304) == []  # moved on: nothing undone
    assert g.state == GroupState.COMPLETING_REBALANCE
