"""The group coordinator as a client sees it over the wire of a real appliance, where it follows Kafka.

A static member joins and syncs; OffsetCommit v0 (no generation) and a simple commit (generation -1, no
member id) to that group are UNKNOWN_MEMBER_ID (Kafka's ``validateOffsetCommit``: only members commit to a
group with members).  The appliance restarts (SIGTERM) with the test fault point ``group.store`` armed,
which refuses the next group metadata append to ``__consumer_offsets`` as a partition without enough
in-sync replicas does.  The same static member restarts (JoinGroup v5, empty member id): its replacement
cannot be recorded, so it is undone (Kafka's ``storeGroup`` callback in ``updateStaticMemberAndRebalance``):
the JoinGroup is answered COORDINATOR_NOT_AVAILABLE with no member id, and the group keeps the old member
id (DescribeGroups; its Heartbeat is answered NONE).  A second member joining then starts a rebalance, and
DescribeGroups during it shows, as Kafka's ``GroupMetadata.summary``, the state, the protocol type and the
members but no protocol name, member metadata or assignment.  When that rebalance completes, the fault
fires again on its record: the leader's SyncGroup is answered COORDINATOR_NOT_AVAILABLE and the group
prepares another rebalance (Kafka's SyncGroup store callback).
"""

from __future__ import annotations

import time

from support.harness import Appliance
from support.kafka_appliance import free_port
from support.wire import WireClient

from ipc.kafka import (
    ApiKey,
    DescribedGroup,
    DescribeGroupsRequest,
    ErrorCode,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)

GROUP = "static-store"
TOPIC = "t"
INSTANCE = "instance-1"


def _join(client: WireClient, member_id: str = "") -> JoinGroupResponse:
    body = JoinGroupRequest(group_id=GROUP, session_timeout_ms=30000, rebalance_timeout_ms=30000,
                            member_id=member_id, group_instance_id=INSTANCE, protocol_type="consumer",
                            protocols=[JoinGroupRequestProtocol("range", b"sub")])
    return client.call(ApiKey.JOIN_GROUP, 5, body)


def _until_coordinator(client: WireClient) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key=GROUP, key_type=0))
        if found.error_code == ErrorCode.NONE:
            described = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest([GROUP])).groups[0]
            if described.error_code == ErrorCode.NONE:
                return
        time.sleep(0.1)
    raise AssertionError("the coordinator did not load the group in 30 s")


def _sync(client: WireClient, member_id: str, generation: int, members: list[str]) -> int:
    body = SyncGroupRequest(group_id=GROUP, generation_id=generation, member_id=member_id,
                            group_instance_id=INSTANCE,
                            assignments=[SyncGroupRequestAssignment(m, m.encode()) for m in members])
    return int(client.call(ApiKey.SYNC_GROUP, 3, body).error_code)


def _describe(client: WireClient) -> DescribedGroup:
    (described,) = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest([GROUP])).groups
    return described


def _simple_commit(client: WireClient, version: int) -> int:
    part = OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_metadata="")
    body = OffsetCommitRequest(group_id=GROUP, generation_id_or_member_epoch=-1, member_id="",
                               topics=[OffsetCommitRequestTopic(TOPIC, [part])])
    return int(client.call(ApiKey.OFFSET_COMMIT, version, body).topics[0].partitions[0].error_code)


def _heartbeat(client: WireClient, member_id: str, generation: int) -> int:
    body = HeartbeatRequest(group_id=GROUP, generation_id=generation, member_id=member_id,
                            group_instance_id=INSTANCE)
    return int(client.call(ApiKey.HEARTBEAT, 3, body).error_code)


def test_simple_commits_a_static_replacement_not_stored_and_describe_during_a_rebalance() -> None:
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", "group.initial.rebalance.delay.ms=0",
                    f"topics.{TOPIC}.partitions=1")
    log = ""
    try:
        app.start()
        client = WireClient(("127.0.0.1", port), client_id="static", timeout_s=40)
        try:
            _until_coordinator(client)
            # the group's record is the first append to its partition: a ring attach late under load
            # answers REBALANCE_IN_PROGRESS (a retriable REQUEST_TIMED_OUT): join and sync again
            old_id = ""
            for _ in range(3):
                joined = _join(client, old_id)
                assert joined.error_code == ErrorCode.NONE, joined
                old_id, generation = joined.member_id, joined.generation_id
                if _sync(client, old_id, generation, [old_id]) == ErrorCode.NONE:
                    break
            for version in (0, 2, 7):  # no generation: not a member's commit
                assert _simple_commit(client, version) == ErrorCode.UNKNOWN_MEMBER_ID, version
        finally:
            client.close()
        assert app.stop() == 0
        app.overrides.append('appliance.test.faults=["group.store:2"]')
        app.start()
        client = WireClient(("127.0.0.1", port), client_id="static")
        try:
            _until_coordinator(client)
            refused = _join(client)  # the member restarted: its record cannot be written
            assert refused.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE, refused
            assert (refused.member_id, refused.generation_id, refused.leader) == ("", generation, old_id)
            described = _describe(client)
            assert (described.group_state, [m.member_id for m in described.members]) == ("Stable", [old_id])
            assert _heartbeat(client, old_id, generation) == ErrorCode.NONE
            other = WireClient(("127.0.0.1", port), client_id="other")
            try:  # a new member's JoinGroup is held: the group prepares a rebalance
                other.send(ApiKey.JOIN_GROUP, 3, JoinGroupRequest(
                    group_id=GROUP, session_timeout_ms=30000, rebalance_timeout_ms=30000, member_id="",
                    protocol_type="consumer", protocols=[JoinGroupRequestProtocol("range", b"sub")]))
                deadline = time.monotonic() + 10
                while True:
                    described = _describe(client)
                    if described.group_state != "Stable" or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                assert (described.group_state, described.protocol_type, described.protocol_data) == (
                    "PreparingRebalance", "consumer", "")
                assert len(described.members) == 2
                assert {(m.member_metadata, m.member_assignment) for m in described.members} == {(b"", b"")}
                rejoined = _join(client, old_id)  # every member joined: the rebalance completes
                assert (rejoined.error_code, rejoined.leader) == (ErrorCode.NONE, old_id), rejoined
                new_generation = rejoined.generation_id
                members = [m.member_id for m in rejoined.members]
                # the leader's assignment cannot be recorded (group.store fires again): the SyncGroup is
                # answered the error, the assignment dropped and another rebalance begins, as in Kafka
                synced = _sync(client, old_id, new_generation, members)
                assert synced == ErrorCode.COORDINATOR_NOT_AVAILABLE
                described = _describe(client)
                assert (described.group_state, described.protocol_data) == ("PreparingRebalance", "")
                assert _heartbeat(client, old_id, new_generation) == ErrorCode.REBALANCE_IN_PROGRESS
            finally:
                other.close()
        finally:
            client.close()
        log = app.log()
    finally:
        app.close()
    assert "test fault point group.store fired" in log
    assert "Traceback" not in log, log
