"""One consumer group under Kafka's classic rebalance protocol: a pure state machine with a clock parameter.

Theory of operation
-------------------
A group is in one of five states, as in Kafka's ``GroupMetadata``::

    Empty --join--> PreparingRebalance --all joined/deadline--> CompletingRebalance --leader sync--> Stable
                        ^  |                                            |                              |
                        |  +--no member left--> Empty                   |                              |
                        +-------------- a join, a leave, an expiry -----+------------------------------+
    Dead: the group was deleted; every request for it is answered COORDINATOR_NOT_AVAILABLE.

**Joining.**  A JoinGroup starts (or joins) a rebalance: the group goes to PreparingRebalance and each
member's JoinGroup is *held* (its answer is a :class:`Completion` given back later).  The rebalance ends
when every known member has joined again, or at its deadline: the largest ``rebalance_timeout_ms`` of the
members, counted from when it began; the members that did not rejoin by then are removed.  A group that was
Empty waits ``group.initial.rebalance.delay.ms`` first, and again (up to the rebalance timeout) each time a
new member joins in that delay, so a group starting with several members rebalances once.  Ending the
rebalance bumps the generation, chooses the protocol (the assignor) every member lists, by the members'
votes for their first choice among those, and answers every held JoinGroup: the leader (the previous one if
still a member, else the first to have joined) gets every member's metadata for that protocol and
assigns; the others get an empty member list.  The group is then CompletingRebalance.

**The two-step join (v4+).**  A JoinGroup v4+ with an empty member id and no ``group.instance.id`` is
answered MEMBER_ID_REQUIRED at once with a new member id; the client joins again with it.  Until then the
id is *pending*: it holds no place in the group, and it is forgotten after the session timeout.

**Syncing.**  Each member sends SyncGroup for the generation it got.  The members' SyncGroups are held until
the leader's arrives with the assignment, and then until the group's record (with the assignment) is
written: the group stays CompletingRebalance meanwhile, as Kafka's does while its ``storeGroup`` append is
out (DescribeGroups says so, an OffsetCommit is REBALANCE_IN_PROGRESS, a late follower's SyncGroup is held
too).  Once it is written (:meth:`Group.confirm_assignment`) the group is Stable and every held SyncGroup
is answered with its member's bytes; a SyncGroup in Stable is answered at once.  If it cannot be written,
the held SyncGroups are answered the append's error, the assignments are dropped and another rebalance
starts (:meth:`Group.undo_assignment`, as Kafka's store callback does).  A rebalance begun meanwhile (a
join, a leave) answers them REBALANCE_IN_PROGRESS and the record's outcome changes nothing.

**Fencing.**  A request naming a member the group does not have is UNKNOWN_MEMBER_ID; one naming another
generation is ILLEGAL_GENERATION; a SyncGroup or Heartbeat while the group prepares a rebalance is
REBALANCE_IN_PROGRESS, which tells the member to join again.  Protocol metadata and assignments are opaque
bytes, never parsed here: garbage from one member reaches only the leader's assignor, as in Kafka.

**Static members (KIP-345).**  A member that joins with a ``group.instance.id`` is static: the group maps
the instance id to its current member id.  A JoinGroup with that instance id and an empty member id (the
same consumer restarted) *replaces* the member: it gets a new member id and keeps the old one's place and
assignment; the old id's held requests are answered FENCED_INSTANCE_ID.  In a Stable group whose chosen
protocol stays the same, that is all (Kafka's rule): the JoinGroup is answered at once with the current
generation and the previous leader's id (so the new id never assigns alone) and the member's SyncGroup gets
its assignment back, with no rebalance for the others.  That replacement is recorded (a group metadata
record) before the JoinGroup is answered; if the record cannot be written, :meth:`Group.revert_replacement`
undoes it, as Kafka's ``storeGroup`` callback does: the old member id, its protocols and timeouts are back
and the JoinGroup is answered with the append's error, an empty member id, the group's generation and the
leader it had.  Otherwise (the protocol would change, or the group
is completing a rebalance, whose assignment names the old id) a rebalance starts.  A request that names a
known instance id with another member id is FENCED_INSTANCE_ID (JoinGroup, SyncGroup, Heartbeat,
OffsetCommit, LeaveGroup); a LeaveGroup may name the instance id alone.  A static member closing sends no
LeaveGroup: it goes only when its session expires.

**Size.**  A new member (an empty member id, not a static member's restart) joining a group that has
``group.max.size`` members, counting the member ids handed out by MEMBER_ID_REQUIRED and not used yet, is
refused with GROUP_MAX_SIZE_REACHED; the members it has are not touched.

**Liveness.**  Every request from a member (JoinGroup, SyncGroup, Heartbeat, OffsetCommit) renews its
session: a member heard from within ``session_timeout_ms`` stays; one not heard from is removed (as a
LeaveGroup) by :meth:`Group.tick`.  A member whose JoinGroup or SyncGroup is held is alive.

Nothing here reads a clock, a socket or a file: each call takes ``now_ms`` and returns the answers it can
give (:class:`Completion`, the token the caller passed with the held request, and the response body).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from appliance.coordinator.group_records import GroupMetadata, GroupMetadataMember
from ipc.kafka import (
    ErrorCode,
    JoinGroupResponse,
    JoinGroupResponseMember,
    SyncGroupResponse,
)

__all__ = ["AssignmentStore", "Completion", "Group", "GroupSettings", "GroupState", "JoinArgs", "Member",
           "StaticReplacement", "Unconfirmed"]


class GroupState(enum.Enum):
    """Kafka's names, as DescribeGroups reports them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """The broker's ``group.*`` settings (Kafka's defaults)."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = (1 << 31) - 1  # group.max.size: members (and member ids handed out) at most


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to a held request: ``token`` is what the caller gave with it."""

    token: Any
    response: Any


@dataclass(slots=True)
class JoinArgs:
    """A JoinGroup request's content, with who sent it."""

    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    client_id: str = ""
    client_host: str = ""
    group_instance_id: str | None = None
    require_known_member_id: bool = False  # JoinGroup v4+: the two-step join


@dataclass(slots=True)
class Member:
    """A member of the group; ``protocols`` and ``assignment`` are opaque bytes."""

    member_id: str
    client_id: str
    client_host: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    last_heard_ms: int
    assignment: bytes = b""
    join_token: Any = None  # a held JoinGroup
    sync_token: Any = None  # a held SyncGroup
    joined: bool = False  # has joined the rebalance in progress

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass(frozen=True, slots=True)
class StaticReplacement:
    """A static member replaced in a Stable group, its record not written yet: what a failed write undoes
    (the member as it was, the id that took its place) and the JoinGroup it answers then."""

    group_id: str
    old: Member
    new_member_id: str
    token: Any
    previous_leader: str


@dataclass(frozen=True, slots=True)
class AssignmentStore:
    """A rebalance completed (the leader's SyncGroup) whose record is not written yet: a failed write
    starts another rebalance, as Kafka's SyncGroup store callback does."""

    group_id: str
    generation: int


Unconfirmed = StaticReplacement | AssignmentStore  # what a group metadata record's failed write undoes


@dataclass(slots=True)
class Group:
    """One group's state; the coordinator (``appliance.coordinator.coordinator``) keeps one per group id."""

    group_id: str
    settings: GroupSettings
    new_member_id: Callable[[str], str]
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader_id: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)  # member id -> forget at (ms)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    rebalance_started_ms: int = 0
    join_deadline_ms: int | None = None
    initial_delay: bool = False  # the rebalance waits group.initial.rebalance.delay.ms
    new_member_joined: bool = False  # a member joined during the initial delay
    metadata_changed: bool = False  # a group metadata record is due (a rebalance completed, or emptied)
    state_timestamp_ms: int = -1  # wall ms of the last record written or loaded (currentStateTimestamp)
    unconfirmed: list[Unconfirmed] = field(default_factory=list)  # taken with the next record

    # -- JoinGroup ----------------------------------------------------------------------------------------

    def join(self, args: JoinArgs, token: Any, now_ms: int) -> list[Completion]:
        """A JoinGroup; its answer is among the returned completions now or from a later call."""
        error = self._join_error(args)
        if error is not None:
            return [Completion(token, _join_failed(error, args.member_id))]
        known = None if args.group_instance_id is None else self.static_members.get(args.group_instance_id)
        if known is not None and not args.member_id:
            return self._replace_static(known, args, token, now_ms)
        if known is not None and known != args.member_id:
            return [Completion(token, _join_failed(ErrorCode.FENCED_INSTANCE_ID, args.member_id))]
        if not args.member_id and len(self.members) + len(self.pending) >= self.settings.max_size:
            return [Completion(token, _join_failed(ErrorCode.GROUP_MAX_SIZE_REACHED, ""))]
        if not args.member_id:
            if args.require_known_member_id and args.group_instance_id is None:
                member_id = self.new_member_id(args.client_id)
                self.pending[member_id] = now_ms + args.session_timeout_ms
                return [Completion(token, _join_failed(ErrorCode.MEMBER_ID_REQUIRED, member_id))]
            return self._add_member(self.new_member_id(args.client_id), args, token, now_ms)
        if args.member_id in self.pending:
            del self.pending[args.member_id]
            return self._add_member(args.member_id, args, token, now_ms)
        member = self.members.get(args.member_id)
        if member is None:
            return [Completion(token, _join_failed(ErrorCode.UNKNOWN_MEMBER_ID, args.member_id))]
        return self._rejoin(member, args, token, now_ms)

    def _join_error(self, args: JoinArgs) -> ErrorCode | None:
        s = self.settings
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not s.min_session_timeout_ms <= args.session_timeout_ms <= s.max_session_timeout_ms:
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if not args.protocol_type or not args.protocols:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if self.members:
            if args.protocol_type != self.protocol_type:
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            offered = {name for name, _ in args.protocols}
            others = [m for m in self.members.values() if m.member_id != args.member_id]
            if others and not offered & _common_protocols(others):
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _add_member(self, member_id: str, args: JoinArgs, token: Any, now_ms: int) -> list[Completion]:
        if not self.members:
            self.protocol_type = args.protocol_type
        self.members[member_id] = Member(
            member_id=member_id,
            client_id=args.client_id,
            client_host=args.client_host,
            group_instance_id=args.group_instance_id,
            session_timeout_ms=args.session_timeout_ms,
            rebalance_timeout_ms=max(args.rebalance_timeout_ms, args.session_timeout_ms),
            protocols=list(args.protocols),
            last_heard_ms=now_ms,
            join_token=token,
            joined=True,
        )
        if args.group_instance_id is not None:
            self.static_members[args.group_instance_id] = member_id
        if self.state == GroupState.PREPARING_REBALANCE:
            self.new_member_joined = True
            return self._maybe_complete_join(now_ms)
        return self._prepare_rebalance(now_ms)

    def _rejoin(self, member: Member, args: JoinArgs, token: Any, now_ms: int) -> list[Completion]:
        out: list[Completion] = []
        if member.join_token is not None and member.join_token is not token:
            out.append(_join_answer(member.join_token, ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        changed = member.protocols != list(args.protocols)
        member.protocols = list(args.protocols)
        member.session_timeout_ms = args.session_timeout_ms
        member.rebalance_timeout_ms = max(args.rebalance_timeout_ms, args.session_timeout_ms)
        member.last_heard_ms = now_ms
        member.join_token, member.joined = token, True
        if self.state == GroupState.PREPARING_REBALANCE:
            return out + self._maybe_complete_join(now_ms)
        if self.state == GroupState.COMPLETING_REBALANCE and not changed:
            member.join_token = None  # the same join again: answer with the generation it is in
            return [*out, Completion(token, self._join_response(member))]
        if self.state == GroupState.STABLE and not changed and member.member_id != self.leader_id:
            member.join_token = None
            return [*out, Completion(token, self._join_response(member))]
        return out + self._prepare_rebalance(now_ms)

    def _replace_static(self, old_id: str, args: JoinArgs, token: Any, now_ms: int) -> list[Completion]:
        """A static member rejoins with an empty member id: a new id in the old one's place (docstring)."""
        old = self.members[old_id]
        out = []
        if old.join_token is not None:
            out.append(_join_answer(old.join_token, ErrorCode.FENCED_INSTANCE_ID, old_id))
        if old.sync_token is not None:
            out.append(_sync_answer(old.sync_token, ErrorCode.FENCED_INSTANCE_ID))
        member = dataclasses.replace(
            old, member_id=self.new_member_id(args.client_id), client_id=args.client_id,
            client_host=args.client_host, session_timeout_ms=args.session_timeout_ms,
            rebalance_timeout_ms=max(args.rebalance_timeout_ms, args.session_timeout_ms),
            protocols=list(args.protocols), last_heard_ms=now_ms, join_token=None, sync_token=None)
        # the new id takes the old one's place in the order (the leader's choice and the protocol vote)
        self.members = {(member.member_id if k == old_id else k): (member if k == old_id else m)
                        for k, m in self.members.items()}
        assert args.group_instance_id is not None
        self.static_members[args.group_instance_id] = member.member_id
        previous_leader = self.leader_id
        if self.leader_id == old_id:
            self.leader_id = member.member_id
        same_protocol = _choose_protocol(list(self.members.values())) == self.protocol_name
        if self.state == GroupState.STABLE and same_protocol:
            answer = self._join_response(member)
            answer.leader, answer.members = previous_leader, []
            self.metadata_changed = True
            self.unconfirmed.append(StaticReplacement(self.group_id, old, member.member_id, token,
                                                       previous_leader))
            return [*out, Completion(token, answer)]
        member.join_token, member.joined = token, True
        if self.state == GroupState.PREPARING_REBALANCE:
            return out + self._maybe_complete_join(now_ms)
        return out + self._prepare_rebalance(now_ms)

    def revert_replacement(self, replaced: StaticReplacement, error: ErrorCode, now_ms: int) -> Completion:
        """The record of a static member's replacement could not be written: the old member id is back in
        its place (if the new one still holds it), its session renewed, and the replacing JoinGroup gets
        ``error`` (module docstring)."""
        old = replaced.old
        instance_id = old.group_instance_id
        current = self.members.get(replaced.new_member_id)
        if current is not None and instance_id is not None \
                and self.static_members.get(instance_id) == replaced.new_member_id:
            back = dataclasses.replace(
                current, member_id=old.member_id, client_id=old.client_id, client_host=old.client_host,
                session_timeout_ms=old.session_timeout_ms, rebalance_timeout_ms=old.rebalance_timeout_ms,
                protocols=old.protocols, last_heard_ms=now_ms)
            self.members = {(old.member_id if k == current.member_id else k): (back if m is current else m)
                            for k, m in self.members.items()}
            self.static_members[instance_id] = old.member_id
            if self.leader_id == replaced.new_member_id:
                self.leader_id = old.member_id
        return Completion(replaced.token, JoinGroupResponse(
            error_code=error, generation_id=self.generation_id, protocol_name=self.protocol_name,
            leader=replaced.previous_leader, member_id="", members=[]))

    def confirm_assignment(self, stored: AssignmentStore, now_ms: int) -> list[Completion]:
        """The record of a completed rebalance is written: if the group still waits for it at that
        generation, it is Stable and every held SyncGroup is answered its member's assignment, its session
        starting again (Kafka's ``setAndPropagateAssignment``: a member held while the leader assigned and
        the record was written has had no way to heartbeat)."""
        if self.state != GroupState.COMPLETING_REBALANCE or self.generation_id != stored.generation:
            return []  # a rebalance began meanwhile: its SyncGroups were answered REBALANCE_IN_PROGRESS
        self.state = GroupState.STABLE
        out = []
        for m in self.members.values():
            if m.sync_token is not None:
                out.append(_sync_answer(m.sync_token, ErrorCode.NONE, m.assignment))
                m.sync_token, m.last_heard_ms = None, now_ms
        return out

    def undo_assignment(self, stored: AssignmentStore, error: ErrorCode, now_ms: int) -> list[Completion]:
        """The record of a completed rebalance could not be written: if the group still waits for it at
        that generation, its held SyncGroups are answered ``error``, every assignment is dropped and
        another rebalance starts (Kafka's ``resetAndPropagateAssignmentError`` and
        ``maybePrepareRebalance``)."""
        if self.state != GroupState.COMPLETING_REBALANCE or self.generation_id != stored.generation:
            return []  # the group moved on meanwhile: nothing of that generation is left to undo
        out = self._fail_syncs(error, now_ms)
        for member in self.members.values():
            member.assignment = b""
        return out + self._prepare_rebalance(now_ms)

    def _prepare_rebalance(self, now_ms: int) -> list[Completion]:
        out: list[Completion] = []
        if self.state == GroupState.COMPLETING_REBALANCE:
            out += self._fail_syncs(ErrorCode.REBALANCE_IN_PROGRESS, now_ms)
        for member in self.members.values():
            member.assignment = b""
            if member.join_token is None:
                member.joined = False
        self.initial_delay = self.state == GroupState.EMPTY
        self.state = GroupState.PREPARING_REBALANCE
        self.rebalance_started_ms = now_ms
        self.new_member_joined = False
        if self.initial_delay:
            delay_ms = min(self.settings.initial_rebalance_delay_ms, self._rebalance_timeout_ms())
            self.join_deadline_ms = now_ms + delay_ms
        else:
            self.join_deadline_ms = now_ms + self._rebalance_timeout_ms()
        return out + self._maybe_complete_join(now_ms)

    def _rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _maybe_complete_join(self, now_ms: int) -> list[Completion]:
        if self.state != GroupState.PREPARING_REBALANCE:
            return []
        all_joined = all(m.joined for m in self.members.values()) and not self.pending
        if self.initial_delay:
            if self.join_deadline_ms is not None and now_ms < self.join_deadline_ms:
                return []
            end_ms = self.rebalance_started_ms + self._rebalance_timeout_ms()
            if self.new_member_joined and now_ms < end_ms:  # wait the delay again for the late comers
                self.new_member_joined = False
                self.join_deadline_ms = min(now_ms + self.settings.initial_rebalance_delay_ms, end_ms)
                return []
        elif not all_joined and self.join_deadline_ms is not None and now_ms < self.join_deadline_ms:
            return []
        return self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> list[Completion]:
        for member_id in [m.member_id for m in self.members.values() if not m.joined]:
            self._forget(member_id)  # did not rejoin in time
        self.generation_id += 1
        self.join_deadline_ms = None
        self.initial_delay = False
        if not self.members:
            self._become_empty()
            return []
        self.protocol_name = _choose_protocol(list(self.members.values()))
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.state = GroupState.COMPLETING_REBALANCE
        out = []
        for member in self.members.values():
            member.last_heard_ms = now_ms
            if member.join_token is not None:
                out.append(Completion(member.join_token, self._join_response(member)))
                member.join_token = None
        return out

    def _join_response(self, member: Member) -> JoinGroupResponse:
        members = []
        if member.member_id == self.leader_id:
            members = [
                JoinGroupResponseMember(m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            ]
        return JoinGroupResponse(
            error_code=ErrorCode.NONE,
            generation_id=self.generation_id,
            protocol_name=self.protocol_name,
            leader=self.leader_id,
            member_id=member.member_id,
            members=members,
        )

    def _become_empty(self) -> None:
        self.metadata_changed = True
        self.state = GroupState.EMPTY
        self.leader_id = ""
        self.protocol_name = ""  # the protocol type stays, as in Kafka (ListGroups shows it)

    # -- SyncGroup ----------------------------------------------------------------------------------------

    def sync(
        self,
        member_id: str,
        generation_id: int,
        assignments: Iterable[tuple[str, bytes]],
        token: Any,
        now_ms: int,
        group_instance_id: str | None = None,
    ) -> list[Completion]:
        error = self.check_member(member_id, generation_id, now_ms, group_instance_id)
        if error is None and self.state == GroupState.PREPARING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not None:
            return [_sync_answer(token, error)]
        member = self.members[member_id]
        if self.state == GroupState.STABLE:
            return [_sync_answer(token, ErrorCode.NONE, member.assignment)]
        held, member.sync_token = member.sync_token, token
        # held already (a client that sent again on a new connection): that one is answered
        out = [] if held is None else [_sync_answer(held, ErrorCode.REBALANCE_IN_PROGRESS)]
        if member_id != self.leader_id or held is not None:
            return out  # a leader's second SyncGroup: its first assignment is the one being written
        given = dict(assignments)
        for m in self.members.values():
            m.assignment = bytes(given.get(m.member_id, b""))
        self.metadata_changed = True  # answered once written: confirm_assignment (module docstring)
        self.unconfirmed.append(AssignmentStore(self.group_id, self.generation_id))
        return out

    def _fail_syncs(self, error: ErrorCode, now_ms: int) -> list[Completion]:
        """Answer every held SyncGroup ``error``, each member's session starting again (Kafka's
        ``resetAndPropagateAssignmentError``): it has until then to join again."""
        out = []
        for m in self.members.values():
            if m.sync_token is not None:
                out.append(_sync_answer(m.sync_token, error))
                m.sync_token, m.last_heard_ms = None, now_ms
        return out

    # -- Heartbeat, member checks ------------------------------------------------------------------------

    def fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        """A request names a known instance id with another member id: an old copy of a static member."""
        if group_instance_id is None:
            return False
        known = self.static_members.get(group_instance_id)
        return known is not None and known != member_id

    def check_member(self, member_id: str, generation_id: int, now_ms: int,
                     group_instance_id: str | None = None) -> ErrorCode | None:
        """The fencing of a request from a member of a generation (module docstring); renews its session."""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member.last_heard_ms = now_ms
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    def heartbeat(self, member_id: str, generation_id: int, now_ms: int,
                  group_instance_id: str | None = None) -> ErrorCode:
        error = self.check_member(member_id, generation_id, now_ms, group_instance_id)
        if error is not None:
            return error
        if self.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # -- leaving, expiry ---------------------------------------------------------------------------------

    def leave(self, member_id: str, now_ms: int,
              group_instance_id: str | None = None) -> tuple[ErrorCode, list[Completion]]:
        """A LeaveGroup for one member (by member id, instance id or both): the error for that member, and
        the answers it releases."""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        if group_instance_id is not None:
            known = self.static_members.get(group_instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID, []
            if member_id and known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID, []
            member_id = known
        if member_id in self.pending:
            del self.pending[member_id]
            return ErrorCode.NONE, self._maybe_complete_join(now_ms)
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, []
        return ErrorCode.NONE, self._remove(member_id, now_ms)

    def _forget(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        instance_id = member.group_instance_id
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        return member

    def _remove(self, member_id: str, now_ms: int) -> list[Completion]:
        member = self._forget(member_id)
        out = []
        if member.join_token is not None:
            out.append(_join_answer(member.join_token, ErrorCode.UNKNOWN_MEMBER_ID, member_id))
        if member.sync_token is not None:
            out.append(_sync_answer(member.sync_token, ErrorCode.UNKNOWN_MEMBER_ID))
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return out + self._prepare_rebalance(now_ms)
        if self.state == GroupState.PREPARING_REBALANCE:
            return out + self._maybe_complete_join(now_ms)
        return out

    def tick(self, now_ms: int) -> list[Completion]:
        """Expire pending ids and silent members, end a rebalance at its deadline."""
        for member_id, forget_ms in list(self.pending.items()):
            if forget_ms <= now_ms:
                del self.pending[member_id]
        out: list[Completion] = []
        for member in list(self.members.values()):
            if member.member_id not in self.members:
                continue  # removed by the rebalance an earlier expiry ended
            held = member.join_token is not None or member.sync_token is not None
            if not held and member.last_heard_ms + member.session_timeout_ms <= now_ms:
                out += self._remove(member.member_id, now_ms)
        return out + self._maybe_complete_join(now_ms)

    def next_deadline_ms(self) -> int | None:
        """When :meth:`tick` next has something to do (None: nothing is timed)."""
        due = list(self.pending.values())
        due += [m.last_heard_ms + m.session_timeout_ms for m in self.members.values()
                if m.join_token is None and m.sync_token is None]
        if self.join_deadline_ms is not None:
            due.append(self.join_deadline_ms)
        return min(due, default=None)

    # -- the durable picture: group metadata records -----------------------------------------------------

    def snapshot(self, wall_ms: int) -> GroupMetadata:
        """The group as Kafka's GroupMetadataValue records it (``appliance.coordinator.group_records``)."""
        members = [
            GroupMetadataMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                m.rebalance_timeout_ms, m.session_timeout_ms,
                                m.metadata_for(self.protocol_name), m.assignment)
            for m in self.members.values()
        ]
        return GroupMetadata(self.protocol_type, self.generation_id, self.protocol_name or None,
                             self.leader_id or None, wall_ms, members)

    def take_metadata(self, wall_ms: int) -> GroupMetadata | None:
        """The record due since the last call (a rebalance completed, the group emptied, a static member
        replaced), or None."""
        due, self.metadata_changed = self.metadata_changed, False
        if not due or self.state == GroupState.DEAD:
            return None
        self.state_timestamp_ms = wall_ms
        return self.snapshot(wall_ms)

    def restore(self, record: GroupMetadata, now_ms: int) -> None:
        """Take the state a group metadata record holds: Stable with its members (their sessions start
        again at ``now_ms``, as in Kafka's loading), or Empty when it has none."""
        self.generation_id = record.generation
        self.protocol_type = record.protocol_type
        self.protocol_name = record.protocol or ""
        self.leader_id = record.leader or ""
        self.state_timestamp_ms = record.current_state_timestamp_ms
        self.members = {}
        self.static_members = {}
        for m in record.members:
            self.members[m.member_id] = Member(
                member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                group_instance_id=m.group_instance_id, session_timeout_ms=m.session_timeout_ms,
                rebalance_timeout_ms=m.rebalance_timeout_ms, protocols=[(self.protocol_name, m.subscription)],
                last_heard_ms=now_ms, assignment=m.assignment)
            if m.group_instance_id is not None:
                self.static_members[m.group_instance_id] = m.member_id
        self.state = GroupState.STABLE if self.members else GroupState.EMPTY
        if not self.members:
            self.leader_id = self.protocol_name = ""

    def begin_deletion(self) -> None:
        """An Empty group is being deleted: Dead until :meth:`end_deletion` (or forgotten)."""
        assert self.state == GroupState.EMPTY and not self.members
        self.state = GroupState.DEAD
        self.pending.clear()

    def end_deletion(self) -> None:
        """The deletion could not be written: the group is Empty again."""
        if self.state == GroupState.DEAD:
            self.state = GroupState.EMPTY

    def close(self) -> list[Completion]:
        """The group is going away (the coordinator stops): every held request is answered."""
        out = []
        for m in self.members.values():
            if m.join_token is not None:
                out.append(_join_answer(m.join_token, ErrorCode.COORDINATOR_NOT_AVAILABLE, m.member_id))
            if m.sync_token is not None:
                out.append(_sync_answer(m.sync_token, ErrorCode.COORDINATOR_NOT_AVAILABLE))
            m.join_token = m.sync_token = None
        return out


def _join_failed(error: ErrorCode, member_id: str) -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=error, generation_id=-1, protocol_name="", leader="", member_id=member_id, members=[]
    )


def _join_answer(token: Any, error: ErrorCode, member_id: str) -> Completion:
    return Completion(token, _join_failed(error, member_id))


def _sync_answer(token: Any, error: ErrorCode, assignment: bytes = b"") -> Completion:
    return Completion(token, SyncGroupResponse(error_code=error, assignment=assignment))


def _common_protocols(members: list[Member]) -> set[str]:
    sets = [{name for name, _ in m.protocols} for m in members]
    return set.intersection(*sets) if sets else set()


def _choose_protocol(members: list[Member]) -> str:
    """Kafka's vote: each member votes for its first choice among the protocols all members list."""
    common = _common_protocols(members)
    votes: dict[str, int] = {}
    for member in members:
        first = next(name for name, _ in member.protocols if name in common)
        votes[first] = votes.get(first, 0) + 1
    order = [name for name, _ in members[0].protocols if name in common]
    return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))
