"""The group coordinator: every group this broker coordinates, its requests and its timers; no I/O.

The broker's loop (``appliance.broker.group_requests``) hands each group request here with ``now_ms`` and a
*token* (its reserved response slot) and gets back a list of :class:`~appliance.coordinator.group.Completion`:
the answers that can be given now -- to this request, or to requests held earlier (a member's JoinGroup
waits for the others').  A request absent from the list is held; its answer comes from a later call or from
:meth:`GroupCoordinator.tick`, due at :meth:`GroupCoordinator.next_deadline_ms`.

Committed offsets (:class:`~appliance.coordinator.offsets.OffsetStore`) are checked against the group as
Kafka checks them (``GroupCoordinator.handleCommitOffsets`` / ``validateOffsetCommit``): a commit with
generation -1 (and every v0 commit, which carries no generation) to a group that does not exist or is
Empty is accepted (a "simple" commit: an admin tool, or a consumer assigning itself); one with a
generation to a group that does not exist is ILLEGAL_GENERATION.  Otherwise a commit naming a member (a
generation, a member id or a ``group.instance.id``) is checked as that member's: an instance id known
with another member id is FENCED_INSTANCE_ID, an unknown member UNKNOWN_MEMBER_ID, another generation
ILLEGAL_GENERATION; a simple commit to a group with members is UNKNOWN_MEMBER_ID (only its members
commit).  Nothing of a refused commit is stored.  As in Kafka, a member may commit for its
generation while the group prepares the next rebalance (an eager consumer commits as its partitions are
revoked), but not between its JoinGroup answer and its assignment (CompletingRebalance:
REBALANCE_IN_PROGRESS).  A partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION (Kafka's check
against its metadata, before the group's), and nothing of it is stored.

Group ids are validated as Kafka validates them: an empty group id is INVALID_GROUP_ID (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetDelete); OffsetFetch, DescribeGroups and DeleteGroups
answer it per group.

**Deleting.**  DeleteGroups deletes an Empty group (NON_EMPTY_GROUP while it has members; GROUP_ID_NOT_FOUND
for a group with neither members nor committed offsets, or one being deleted).  OffsetDelete deletes a
group's committed offsets, except those of a topic a member of a non-empty group still subscribes to
(GROUP_SUBSCRIBED_TO_TOPIC for those partitions; subscriptions that cannot be read count as every topic);
a non-empty group of another protocol type than ``consumer`` is NON_EMPTY_GROUP as a whole.  Both are
planned here and written as tombstones to ``__consumer_offsets`` by the broker; a group being deleted is
Dead meanwhile (a JoinGroup or an OffsetCommit for it is COORDINATOR_NOT_AVAILABLE, retriable) and comes
back Empty, untouched, when the tombstones cannot be written.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.coordinator.group import (
    AssignmentStore,
    Completion,
    Group,
    GroupSettings,
    GroupState,
    JoinArgs,
    Unconfirmed,
)
from appliance.coordinator.group_records import GroupMetadata
from appliance.coordinator.offsets import CommittedOffset, OffsetStore
from appliance.coordinator.subscription import CONSUMER_PROTOCOL_TYPE, subscribed_topics
from ipc.kafka import (
    DescribedGroup,
    DescribedGroupMember,
    ErrorCode,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListedGroup,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    SyncGroupResponse,
)
from storage.log_config import LONG_MAX

__all__ = ["CommitPlan", "GroupCoordinator", "GroupDeletion", "OffsetDeletion", "OffsetExpiry"]

# A group id longer than this is refused (INVALID_GROUP_ID): it is kept in memory per group and, in Kafka's
# schemas, in every offset record's key.
MAX_GROUP_ID_CHARS = 255


@dataclass(slots=True)
class CommitPlan:
    """An OffsetCommit checked and not stored yet: its response and the entries to write and keep."""

    group_id: str
    response: OffsetCommitResponse
    accepted: list[tuple[str, int, CommittedOffset]]


@dataclass(slots=True)
class GroupDeletion:
    """A DeleteGroups checked and not written yet: every group's answer (NONE: deleted once its tombstones
    are written), and the committed partitions (topic, partition) of each group being deleted."""

    results: dict[str, ErrorCode]
    deleting: dict[str, list[tuple[str, int]]]


@dataclass(slots=True)
class OffsetExpiry:
    """Committed offsets past ``offsets.retention.minutes``, to tombstone, and whether the (Empty) group
    goes too, its offsets all gone (it is Dead until :meth:`GroupCoordinator.finish_expiry`)."""

    group_id: str
    tombstones: list[tuple[str, int]]
    remove_group: bool


@dataclass(slots=True)
class OffsetDeletion:
    """An OffsetDelete checked and not written yet: its response and the partitions to tombstone."""

    group_id: str
    response: OffsetDeleteResponse
    tombstones: list[tuple[str, int]]


def _expired(commit: CommittedOffset, since_ms: int, wall_ms: int, retention_ms: int) -> bool:
    """Whether ``commit`` is past its retention at ``wall_ms``: its own expire timestamp when it has one,
    else ``retention_ms`` after ``since_ms`` (when its group emptied; -1: a group that never had members,
    its commit timestamp)."""
    if commit.expire_timestamp_ms >= 0:
        return wall_ms >= commit.expire_timestamp_ms
    return wall_ms - (since_ms if since_ms >= 0 else commit.commit_timestamp_ms) >= retention_ms


def _new_member_id(client_id: str) -> str:
    return f"{client_id or 'member'}-{uuid.uuid4()}"


def valid_group_id(group_id: str | None) -> bool:
    return bool(group_id) and len(group_id or "") <= MAX_GROUP_ID_CHARS


class GroupCoordinator:
    """Every group of this broker (module docstring).  ``new_member_id`` is a seam for tests."""

    def __init__(
        self,
        settings: GroupSettings,
        offsets: OffsetStore | None = None,
        new_member_id: Callable[[str], str] = _new_member_id,
    ) -> None:
        self.settings = settings
        self.offsets = offsets if offsets is not None else OffsetStore()
        self.groups: dict[str, Group] = {}
        self._new_member_id = new_member_id
        # (group, topic, partition) -> commits planned and not yet applied or discarded (being written)
        self._pending_commits: dict[tuple[str, str, int], int] = {}

    def _group(self, group_id: str, *, create: bool = False) -> Group | None:
        group = self.groups.get(group_id)
        if group is None and create:
            group = Group(group_id, self.settings, self._new_member_id)
            self.groups[group_id] = group
        return group

    def _member_group(self, group_id: str) -> Group | ErrorCode:
        """The group a member's request names, or the error it gets: INVALID_GROUP_ID, or UNKNOWN_MEMBER_ID
        for a group that does not exist (its members cannot either)."""
        if not valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        return self.groups.get(group_id, ErrorCode.UNKNOWN_MEMBER_ID)

    # -- the rebalance protocol --------------------------------------------------------------------------

    def join(self, group_id: str, args: JoinArgs, token: Any, now_ms: int) -> list[Completion]:
        if not valid_group_id(group_id):
            return [Completion(token, JoinGroupResponse(error_code=ErrorCode.INVALID_GROUP_ID,
                                                        member_id=args.member_id, members=[]))]
        group = self._group(group_id, create=not args.member_id)
        if group is None:
            return [Completion(token, JoinGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID,
                                                        member_id=args.member_id, members=[]))]
        return group.join(args, token, now_ms)

    def sync(self, group_id: str, member_id: str, generation_id: int, assignments: list[tuple[str, bytes]],
             token: Any, now_ms: int, group_instance_id: str | None = None) -> list[Completion]:
        group = self._member_group(group_id)
        if isinstance(group, ErrorCode):
            return [Completion(token, SyncGroupResponse(error_code=group, assignment=b""))]
        return group.sync(member_id, generation_id, assignments, token, now_ms, group_instance_id)

    def heartbeat(self, group_id: str, member_id: str, generation_id: int, now_ms: int,
                  group_instance_id: str | None = None) -> HeartbeatResponse:
        group = self._member_group(group_id)
        error = group if isinstance(group, ErrorCode) else group.heartbeat(member_id, generation_id, now_ms,
                                                                           group_instance_id)
        return HeartbeatResponse(error_code=error)

    def leave(self, group_id: str, members: list[tuple[str, str | None]], now_ms: int, *,
              batch: bool = False) -> tuple[LeaveGroupResponse, list[Completion]]:
        """LeaveGroup for one member (v0-2) or several (v3+, ``batch``), each ``(member id,
        group.instance.id)``: the response and the answers it releases.  As in Kafka, a v0-2 answer carries
        its member's error at the top; a v3+ answer only the group's (INVALID_GROUP_ID, or
        COORDINATOR_NOT_AVAILABLE while it is being deleted), each member's error in its own entry."""
        group = self._member_group(group_id)
        if group == ErrorCode.INVALID_GROUP_ID:
            return LeaveGroupResponse(error_code=ErrorCode.INVALID_GROUP_ID, members=[]), []
        if isinstance(group, Group) and group.state == GroupState.DEAD:  # being deleted: retriable
            return LeaveGroupResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, members=[]), []
        released: list[Completion] = []
        results = []
        for member_id, instance_id in members:
            error, out = (group, []) if isinstance(group, ErrorCode) else group.leave(member_id, now_ms,
                                                                                     instance_id)
            results.append(MemberResponse(member_id, instance_id, error))
            released += out
        top = results[0].error_code if len(results) == 1 and not batch else ErrorCode.NONE
        return LeaveGroupResponse(error_code=top, members=results), released

    def tick(self, now_ms: int) -> list[Completion]:
        out: list[Completion] = []
        for group_id, group in list(self.groups.items()):
            out += group.tick(now_ms)
            if group.state == GroupState.EMPTY and not group.members and not group.pending \
                    and group.generation_id == 0 and not self.offsets.has_group(group_id):
                del self.groups[group_id]  # (a group with a generation is in __consumer_offsets)
        return out

    def next_deadline_ms(self) -> int | None:
        return min((d for g in self.groups.values() if (d := g.next_deadline_ms()) is not None), default=None)

    def close(self) -> list[Completion]:
        return [c for g in self.groups.values() for c in g.close()]

    # -- committed offsets -------------------------------------------------------------------------------

    def commit_error(self, body: OffsetCommitRequest, api_version: int, now_ms: int) -> ErrorCode | None:
        """Whether this commit may be stored, as Kafka's ``handleCommitOffsets`` and ``validateOffsetCommit``
        decide (module docstring); None: yes.  A v0 request carries neither generation nor member id: it is
        a simple commit (generation -1, empty member id), as Kafka reads it."""
        if not valid_group_id(body.group_id):
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(body.group_id)
        generation = body.generation_id_or_member_epoch if api_version >= 1 else -1
        member_id = body.member_id if api_version >= 1 else ""
        instance_id = body.group_instance_id if api_version >= 7 else None
        if group is None and not self.offsets.has_group(body.group_id):
            # no group: Kafka makes a simple (Empty) one for a commit of no generation, else the commit
            # comes from a generation that is gone
            return None if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        state = GroupState.EMPTY if group is None else group.state  # offsets alone: an Empty group
        if state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE  # being deleted
        if generation < 0 and state == GroupState.EMPTY:
            return None  # an admin tool, or a consumer that assigns its partitions itself
        if generation >= 0 or member_id or instance_id is not None:
            if group is None:
                return ErrorCode.UNKNOWN_MEMBER_ID  # an Empty group has no member
            error = group.check_member(member_id, generation, now_ms, instance_id)
            if error is None and state == GroupState.COMPLETING_REBALANCE:
                return ErrorCode.REBALANCE_IN_PROGRESS  # it has its new generation but not its assignment yet
            return error
        return ErrorCode.UNKNOWN_MEMBER_ID  # a simple commit to a group with members: only they commit

    def plan_commit(self, body: OffsetCommitRequest, api_version: int, now_ms: int, wall_ms: int,
                    known: Callable[[str, int], bool] | None = None) -> CommitPlan:
        """Check a commit without storing it: the response (its refused partitions answered, the accepted
        ones NONE for now) and the accepted entries, stamped ``wall_ms`` (the commit timestamp Kafka
        records; a v1 partition's own ``commit_timestamp`` when it gives one, -1 meaning now) and, for a
        v2-v4 ``retention_time_ms`` other than -1, expiring at ``wall_ms`` plus it (Kafka's
        ``OffsetAndMetadata.expireTimestamp``; v5+ have no such field).  ``known(topic, partition)``: the
        partition exists (None: every one does); one that does not is UNKNOWN_TOPIC_OR_PARTITION, before
        any check of the group, as in Kafka.  The caller writes the entries to ``__consumer_offsets`` and
        then :meth:`apply` them, or answers the accepted partitions with the append's error (nothing
        stored)."""
        error = self.commit_error(body, api_version, now_ms)
        retention_ms = body.retention_time_ms if 2 <= api_version <= 4 else -1
        # a retention past the int64 the record holds (Long.MAX_VALUE: "forever") never expires
        expire_ms = -1 if retention_ms == -1 else min(max(wall_ms + retention_ms, 0), LONG_MAX)
        topics = []
        accepted: list[tuple[str, int, CommittedOffset]] = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                code = error
                if known is not None and not known(t.name, p.partition_index):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif code is None:
                    code = self.offsets.check(t.name, p.partition_index, p.committed_metadata)
                    if code == ErrorCode.NONE:
                        own = api_version == 1 and p.commit_timestamp != -1  # v1: -1 is "now"
                        stamp = p.commit_timestamp if own else wall_ms
                        entry = CommittedOffset(p.committed_offset, p.committed_leader_epoch,
                                                p.committed_metadata or "", stamp, expire_ms)
                        accepted.append((t.name, p.partition_index, entry))
                parts.append(OffsetCommitResponsePartition(p.partition_index, code))
            topics.append(OffsetCommitResponseTopic(t.name, parts))
        for topic, partition, _ in accepted:
            key = (body.group_id, topic, partition)
            self._pending_commits[key] = self._pending_commits.get(key, 0) + 1
        return CommitPlan(body.group_id, OffsetCommitResponse(topics=topics), accepted)

    def apply(self, plan: CommitPlan) -> None:
        """Store a planned commit whose records are in ``__consumer_offsets``."""
        for topic, partition, entry in plan.accepted:
            self.offsets.put(plan.group_id, topic, partition, entry)
        self.discard(plan)

    def discard(self, plan: CommitPlan) -> None:
        """A planned commit is applied, or could not be written: it is no longer pending (an expiry may
        take its partitions again)."""
        for topic, partition, _ in plan.accepted:
            key = (plan.group_id, topic, partition)
            left = self._pending_commits.get(key, 0) - 1
            if left > 0:
                self._pending_commits[key] = left
            else:
                self._pending_commits.pop(key, None)

    def commit(self, body: OffsetCommitRequest, api_version: int, now_ms: int) -> OffsetCommitResponse:
        """Check and store a commit at once (no log behind it: tests of the state machine)."""
        plan = self.plan_commit(body, api_version, now_ms, now_ms)
        self.apply(plan)
        return plan.response

    def fetch(self, body: OffsetFetchRequest) -> OffsetFetchResponse:
        if not valid_group_id(body.group_id):
            return OffsetFetchResponse(topics=[], error_code=ErrorCode.INVALID_GROUP_ID)
        if body.topics is None:
            asked = self.offsets.topics_of(body.group_id)
        else:
            asked = {t.name: list(t.partition_indexes) for t in body.topics}
        topics = []
        for name, partitions in asked.items():
            parts = []
            for index in partitions:
                c = self.offsets.get(body.group_id, name, index)
                parts.append(OffsetFetchResponsePartition(
                    partition_index=index,
                    committed_offset=-1 if c is None else c.offset,
                    committed_leader_epoch=-1 if c is None else c.leader_epoch,
                    metadata="" if c is None else c.metadata,
                    error_code=ErrorCode.NONE,
                ))
            topics.append(OffsetFetchResponseTopic(name, parts))
        return OffsetFetchResponse(topics=topics, error_code=ErrorCode.NONE)

    # -- group metadata records -------------------------------------------------------------------------

    def take_metadata(self, wall_ms: int) -> list[tuple[str, GroupMetadata]]:
        """The group metadata records due since the last call (a rebalance completed, a group emptied, a
        static member replaced), stamped ``wall_ms``; the caller writes them to ``__consumer_offsets``."""
        return [(group_id, record) for group_id, group in self.groups.items()
                if (record := group.take_metadata(wall_ms)) is not None]

    def take_unconfirmed(self) -> list[Unconfirmed]:
        """What the records :meth:`take_metadata` gave record and a failed write undoes (static member
        replacements, completed rebalances), taken with them: the caller gives back those whose record
        could not be written to :meth:`undo`."""
        out = [u for group in self.groups.values() for u in group.unconfirmed]
        for group in self.groups.values():
            group.unconfirmed.clear()
        return out

    def confirm(self, unconfirmed: list[Unconfirmed], now_ms: int) -> list[Completion]:
        """Records that are written: a completed rebalance's group is Stable and its held SyncGroups are
        answered (``Group.confirm_assignment``); the answers that gives."""
        out = []
        for item in unconfirmed:
            group = self.groups.get(item.group_id)
            if isinstance(item, AssignmentStore) and group is not None:
                out += group.confirm_assignment(item, now_ms)
        return out

    def undo(self, unconfirmed: list[Unconfirmed], error: ErrorCode, now_ms: int) -> list[Completion]:
        """Undo what records that could not be written recorded: a replaced static member's JoinGroup is
        answered ``error`` (``Group.revert_replacement``), a completed rebalance's held SyncGroups are
        answered ``error`` and it starts again (``Group.undo_assignment``); the answers that gives."""
        out = []
        for item in unconfirmed:
            group = self.groups.get(item.group_id)
            if isinstance(item, AssignmentStore):
                out += [] if group is None else group.undo_assignment(item, error, now_ms)
            elif group is None:  # deleted meanwhile: only the answer changes
                out.append(Completion(item.token, JoinGroupResponse(error_code=error, member_id="",
                                                                    members=[])))
            else:
                out.append(group.revert_replacement(item, error, now_ms))
        return out

    def load_group(self, group_id: str, record: GroupMetadata | None, now_ms: int) -> None:
        """Apply a group metadata record read back from ``__consumer_offsets`` (None: a tombstone)."""
        if record is None:
            self.groups.pop(group_id, None)
            return
        group = self._group(group_id, create=True)
        assert group is not None
        group.restore(record, now_ms)

    # -- offsets.retention.minutes ------------------------------------------------------------------------

    def plan_expiry(self, wall_ms: int, retention_ms: int) -> list[OffsetExpiry]:
        """The offsets past their retention (Kafka 2.1+, KIP-211): every offset of a group Empty for
        ``retention_ms`` (counted from when it emptied: its last group metadata record); for a group that
        never had members, each offset not committed again for ``retention_ms`` (from its commit
        timestamp).  An offset committed with its own retention (an expire timestamp) expires at that time
        instead, sooner or later than the setting would have it (Kafka's "old expiration semantics").  A group
        with members keeps its offsets.  An Empty group left with no offsets goes too, as in Kafka.  A
        partition with a commit being written is left for the next check, and its group stays (Kafka's
        ``pendingOffsetCommits``): the tombstone would follow that commit in the log and delete it."""
        plans = []
        pending = self._pending_commits
        pending_groups = {g for g, _, _ in pending}
        for group_id in sorted(set(self.offsets.groups()) | set(self.groups)):
            group = self.groups.get(group_id)
            if group is not None and (group.state != GroupState.EMPTY or group.members or group.pending):
                continue
            since = group.state_timestamp_ms if group is not None and group.generation_id > 0 else -1
            committed = [(t, p, c) for t, parts in self.offsets.commits.get(group_id, {}).items()
                         for p, c in parts.items()]
            expired = [(t, p) for t, p, c in committed
                       if _expired(c, since, wall_ms, retention_ms) and (group_id, t, p) not in pending]
            remove = (group is not None and group.generation_id > 0 and len(expired) == len(committed)
                      and group_id not in pending_groups)
            if expired or remove:
                if remove and group is not None:
                    group.begin_deletion()
                plans.append(OffsetExpiry(group_id, expired, remove))
        return plans

    def finish_expiry(self, plan: OffsetExpiry, *, written: bool) -> None:
        """An expiry's tombstones are in the log (the offsets, and the group if it goes, are forgotten), or
        could not be written (nothing changes; the next check tries again)."""
        if not written:
            group = self.groups.get(plan.group_id)
            if group is not None:
                group.end_deletion()
            return
        for topic, partition in plan.tombstones:
            self.offsets.put(plan.group_id, topic, partition, None)
        if plan.remove_group:
            self.groups.pop(plan.group_id, None)

    # -- deleting groups and offsets --------------------------------------------------------------------

    def _deletable(self, group_id: str) -> ErrorCode:
        """Whether a group may lose its offsets wholesale: NONE (Empty), or Kafka's error."""
        if not valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE if self.offsets.has_group(group_id) else ErrorCode.GROUP_ID_NOT_FOUND
        if group.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        return ErrorCode.NONE if group.state == GroupState.EMPTY else ErrorCode.NON_EMPTY_GROUP

    def plan_delete_groups(self, group_ids: list[str]) -> GroupDeletion:
        """Check a DeleteGroups; each group to delete is Dead until :meth:`finish_delete`."""
        plan = GroupDeletion({}, {})
        for group_id in group_ids:
            if group_id in plan.results:
                continue
            code = self._deletable(group_id)
            plan.results[group_id] = code
            if code == ErrorCode.NONE:
                group = self._group(group_id, create=True)
                assert group is not None
                group.begin_deletion()
                plan.deleting[group_id] = [(t, p) for t, parts in self.offsets.topics_of(group_id).items()
                                           for p in parts]
        return plan

    def finish_delete(self, group_id: str, *, written: bool) -> None:
        """The tombstones of a group being deleted are in the log (it is gone), or could not be written (it
        is Empty again, with its offsets)."""
        group = self.groups.get(group_id)
        if not written:
            if group is not None:
                group.end_deletion()
            return
        self.groups.pop(group_id, None)
        for topic, parts in self.offsets.topics_of(group_id).items():
            for partition in parts:
                self.offsets.put(group_id, topic, partition, None)

    def plan_offset_delete(self, body: OffsetDeleteRequest,
                           known: Callable[[str, int], bool]) -> OffsetDeletion:
        """Check an OffsetDelete (module docstring); ``known(topic, partition)``: the partition exists
        (else UNKNOWN_TOPIC_OR_PARTITION).  Partitions with no commit are answered NONE, nothing written."""
        code = self._deletable(body.group_id)
        consumed: Callable[[str], bool] = lambda topic: False  # noqa: E731 -- Empty: nothing is consumed
        if code == ErrorCode.NON_EMPTY_GROUP:
            group = self.groups[body.group_id]
            if group.protocol_type == CONSUMER_PROTOCOL_TYPE:
                code = ErrorCode.NONE
                topics_read = None
                if group.protocol_name:  # a protocol chosen: the members' metadata for it
                    topics_read = subscribed_topics(m.metadata_for(group.protocol_name)
                                                    for m in group.members.values())
                consumed = (lambda topic: True) if topics_read is None else topics_read.__contains__
        if code != ErrorCode.NONE:
            return OffsetDeletion(body.group_id, OffsetDeleteResponse(error_code=code, topics=[]), [])
        topics = []
        tombstones: list[tuple[str, int]] = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                index = p.partition_index
                error = ErrorCode.NONE
                if not known(t.name, index):
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif consumed(t.name):
                    error = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
                elif self.offsets.get(body.group_id, t.name, index) is not None:
                    tombstones.append((t.name, index))
                parts.append(OffsetDeleteResponsePartition(index, error))
            topics.append(OffsetDeleteResponseTopic(t.name, parts))
        return OffsetDeletion(body.group_id, OffsetDeleteResponse(error_code=ErrorCode.NONE, topics=topics),
                              tombstones)

    def apply_offset_delete(self, plan: OffsetDeletion) -> None:
        """Forget the offsets of a planned OffsetDelete whose tombstones are in ``__consumer_offsets``."""
        for topic, partition in plan.tombstones:
            self.offsets.put(plan.group_id, topic, partition, None)

    # -- inspection --------------------------------------------------------------------------------------

    def list_groups(self) -> list[ListedGroup]:
        """Every group and its protocol type, as Kafka's ListGroups: empty for a group no member ever
        joined (one that only commits offsets: an admin tool, a consumer that assigns itself)."""
        names = set(self.groups) | set(self.offsets.groups())
        return [ListedGroup(g, self.groups[g].protocol_type if g in self.groups else "")
                for g in sorted(names)]

    def describe(self, group_id: str) -> DescribedGroup:
        """DescribeGroups of one group, as Kafka's ``GroupMetadata.summary``: the state, the protocol type
        and the members (ids, client id and host) always; the chosen protocol and each member's metadata
        and assignment only when the group is Stable (empty otherwise: a rebalance is choosing them)."""
        if not valid_group_id(group_id):
            return DescribedGroup(ErrorCode.INVALID_GROUP_ID, group_id, "", "", "", [])
        group = self.groups.get(group_id)
        if group is None:
            state = GroupState.EMPTY if self.offsets.has_group(group_id) else GroupState.DEAD
            return DescribedGroup(ErrorCode.NONE, group_id, state.value, "", "", [])
        stable = group.state == GroupState.STABLE
        members = [
            DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(group.protocol_name) if stable else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        return DescribedGroup(ErrorCode.NONE, group_id, group.state.value, group.protocol_type,
                              group.protocol_name if stable else "", members)
