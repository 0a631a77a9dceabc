"""``Consumer.subscribe()``: a subscription's rebalances, callbacks and automatic commits.

Theory of operation
-------------------
:class:`GroupSubscription` sits between :class:`~appliance.client.consumer.Consumer` and its
:class:`~appliance.client.group_member.GroupMember`.  Everything happens on the consumer's thread, at the
start of each ``poll()`` (:meth:`GroupSubscription.before_poll`), as in Kafka's consumer:

1. a fatal refusal seen by the heartbeat thread is raised;
2. with ``enable.auto.commit``, every ``auto.commit.interval.ms`` the positions are committed
   asynchronously: the offsets after the records the earlier polls returned, so a record is committed only
   once the application had it (at least once);
3. every ``metadata.max.age.ms`` the subscribed topics are looked at again (by name, or the topics matching
   the pattern): a topic created, deleted or given more partitions since the last join rejoins the group,
   so that the leader assigns what exists;
4. when the member must (re)join -- the first poll, a rebalance the coordinator announced in a heartbeat,
   a lost membership -- it rebalances:

   * **lost** (the session expired, or ``max.poll.interval.ms`` passed without a poll): the partitions are
     already someone else's; ``on_lost(consumer, partitions)`` is called (``on_revoke`` when no
     ``on_lost`` was given, as Kafka's default), nothing is committed;
   * **eager** assignors (``range``, ``roundrobin``): every partition is given up before joining: the
     positions are committed (auto commit), ``on_revoke(consumer, all partitions)``; after the rebalance
     ``on_assign(consumer, the whole new assignment)``;
   * **cooperative** (``cooperative-sticky``): the member keeps reading while it joins and sends the
     partitions it owns; after the rebalance only the partitions that move are revoked (committed, then
     ``on_revoke(consumer, those)``), ``on_assign(consumer, the added ones)`` (possibly none), and when
     something was revoked the member joins once more so that the rebalance after gives it out.

A newly assigned partition starts at the group's committed offset, or by ``auto.offset.reset`` when there
is none; a callback may ``seek()`` instead.  On ``close()`` / ``unsubscribe()`` the positions are committed
(auto commit), ``on_revoke`` is called for what the member owns, and it leaves the group.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

from appliance.client.assignors import ASSIGNORS
from appliance.client.group_member import CommitResult, GroupConfig, GroupError, GroupMember
from appliance.config.settings import INT_MAX, Invalid, Setting, boolean, integer, optional, text
from ipc.kafka import ErrorCode, error_name
from ipc.kafka.consumer_protocol import Subscription
from ipc.kafka_client import KafkaConnection, parse_bootstrap_servers
from storage.errors import ApplianceError, BrokerConnectionError, ConfigError

__all__ = [
    "GROUP_SETTINGS",
    "GroupSubscription",
    "RebalanceCallback",
    "commit_failure",
    "member_for",
    "subscription_for",
]

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
RebalanceCallback = Callable[[Any, list[Any]], None]  # (consumer, [TopicPartition, ...])


# -- settings ---------------------------------------------------------------------------------------------

_ASSIGNOR_CLASSES: Final = {"RangeAssignor": "range", "RoundRobinAssignor": "roundrobin",
                            "CooperativeStickyAssignor": "cooperative-sticky"}


def _assignors(value: object) -> object:
    """Kafka's ``partition.assignment.strategy``: names (or Kafka's class names), comma-separated."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise Invalid("expected assignor names, comma-separated")
    names = []
    for item in items:
        name = text(item).strip()
        name = _ASSIGNOR_CLASSES.get(name.rpartition(".")[2], name)
        if name not in ASSIGNORS:
            raise Invalid(f"unknown assignor {name!r}: expected {', '.join(ASSIGNORS)}")
        names.append(name)
    return tuple(dict.fromkeys(names))


GROUP_SETTINGS: Final = (
    Setting("group.id", None, optional(text), "the consumer group subscribe() joins and commits go to"),
    Setting("group.instance.id", None, optional(text), "static membership: this member's stable id"),
    Setting("partition.assignment.strategy", ("cooperative-sticky",), _assignors,
            "assignors by preference: range, roundrobin, cooperative-sticky"),
    Setting("session.timeout.ms", 45_000, integer(1, INT_MAX, text=True),
            "the member is removed when no heartbeat came for this long"),
    Setting("heartbeat.interval.ms", 3_000, integer(1, INT_MAX, text=True), "time between heartbeats"),
    Setting("max.poll.interval.ms", 300_000, integer(1, INT_MAX, text=True),
            "the member leaves the group when poll() is not called for this long (the rebalance timeout)"),
    Setting("enable.auto.commit", True, boolean(text=True), "commit the positions in the background"),
    Setting("auto.commit.interval.ms", 5_000, integer(0, INT_MAX, text=True), "how often auto commit runs"),
    Setting("metadata.max.age.ms", 300_000, integer(0, INT_MAX, text=True),
            "how often the subscribed topics are looked at for new, deleted or grown ones"),
)


def member_for(values: Mapping[str, Any], local_log_dirs: Sequence[str] | None) -> GroupMember:
    """The group member for a consumer's settings: over TCP to the coordinator, or, on the local path
    (``local_log_dirs`` given), over the broker's Unix socket."""
    if values["group.id"] is None:
        raise ConfigError("consumer: subscribe(), commit() and committed() need group.id")
    options: dict[str, Any] = {"client_id": values["client.id"],
                               "request_timeout_ms": values["request.timeout.ms"],
                               "connect_timeout_ms": values["socket.connection.setup.timeout.ms"]}
    unix_path = None if local_log_dirs is None else _unix_listener(values, local_log_dirs)

    def dial(host: str | None, port: int | None) -> KafkaConnection:
        if unix_path is not None:
            try:
                return KafkaConnection.over_unix_socket(unix_path, **options)
            except BrokerConnectionError as exc:
                raise BrokerConnectionError(
                    f"{exc}: on the local path the group is coordinated over the broker's Unix socket "
                    "(appliance.unix.listener): is the appliance serving, with that listener on?") from None
        if host is not None and port is not None:
            return KafkaConnection(host, port, **options)
        failures = []
        for server_host, server_port in parse_bootstrap_servers(values["bootstrap.servers"]):
            try:
                return KafkaConnection(server_host, server_port, **options)
            except BrokerConnectionError as exc:
                failures.append(str(exc))
        raise BrokerConnectionError("; ".join(failures))

    return GroupMember(GroupConfig(
        group_id=values["group.id"], group_instance_id=values["group.instance.id"],
        session_timeout_ms=values["session.timeout.ms"], rebalance_timeout_ms=values["max.poll.interval.ms"],
        heartbeat_interval_ms=values["heartbeat.interval.ms"],
        assignors=tuple(ASSIGNORS[n] for n in values["partition.assignment.strategy"]),
        request_timeout_ms=values["request.timeout.ms"], retry_backoff_ms=values["retry.backoff.ms"],
    ), dial)


def _unix_listener(values: Mapping[str, Any], log_dirs: Sequence[str]) -> str:
    """The broker's Unix socket: the configuration file's ``appliance.unix.listener``, else its default
    ``<first log dir>/.broker.sock``."""
    if values["appliance.config"] is None:
        return os.path.join(log_dirs[0], ".broker.sock")
    from appliance.config.server_config import load_config

    path = load_config(values["appliance.config"]).unix_listener
    if not path:
        raise ConfigError(f"consumer: group.id on the local path needs the broker's Unix socket, which "
                          f"{values['appliance.config']} disables (appliance.unix.listener = \"\")")
    return path


# -- the subscription -------------------------------------------------------------------------------------


class GroupConsumer(Protocol):
    """What a subscription needs from the consumer it drives."""

    def _set_assignment(self, partitions: Sequence[TopicPartitionKey]) -> None: ...
    def _group_positions(self, partitions: Sequence[TopicPartitionKey] | None = None,
                         ) -> dict[TopicPartitionKey, int]: ...
    def _group_start_at(self, starts: dict[TopicPartitionKey, int | None]) -> None: ...
    def _group_partitions(self, partitions: Sequence[TopicPartitionKey]) -> list[Any]: ...


def commit_failure(group_id: str, result: CommitResult) -> GroupError | None:
    """The error for a commit some partition refused, naming them; None when all were stored."""
    failed = {tp: code for tp, code in result.errors.items() if code != ErrorCode.NONE}
    if not failed:
        return None
    code = next(iter(failed.values()))
    names = ", ".join(f"{t}-{p}: {error_name(c)}" for (t, p), c in sorted(failed.items()))
    advice = ("the group rebalanced and these partitions may belong to another member now: poll() again "
              "(the consumer rejoins) and process from the committed offsets"
              if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
                          ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.FENCED_INSTANCE_ID)
              else "nothing was stored for them: commit again")
    return GroupError(f"group {group_id!r}: commit refused for {names}; {advice}", code)


class GroupSubscription:
    """The consumer's subscription to ``topics`` (or the topics matching ``pattern``); see the module doc."""

    def __init__(self, consumer: GroupConsumer, member: GroupMember, *, topics: Sequence[str] = (),
                 pattern: re.Pattern[str] | None = None, cooperative: bool,
                 on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                 on_lost: RebalanceCallback | None = None, auto_commit_interval_ms: int | None,
                 metadata_max_age_ms: int) -> None:
        self.consumer = consumer
        self.member = member
        self.topics = tuple(dict.fromkeys(topics))
        self.pattern = pattern
        self.cooperative = cooperative
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.owned: list[TopicPartitionKey] = []
        self._seen: dict[str, int] = {}  # subscribed topic -> partition count, at the last look
        self._seen_at = -1.0
        self._next_auto_commit = time.monotonic() + (auto_commit_interval_ms or 0) / 1000

    # -- each poll -------------------------------------------------------------------------------------------
    def before_poll(self) -> None:
        member = self.member
        member.poll_called()
        if member.fatal is not None:
            raise member.fatal
        member.drain_async(block=False)
        if self.auto_commit_interval_ms is not None and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000
            if not member.rejoin_needed:
                member.commit_async(self.consumer._group_positions(), self._log_auto_commit)
        if self._seen_at >= 0 and time.monotonic() - self._seen_at >= self.metadata_max_age_ms / 1000:
            if self._look() != self._seen:
                member.request_rejoin()
        if member.rejoin_needed:
            self.rebalance()

    def _log_auto_commit(self, result: CommitResult) -> None:
        error = commit_failure(self.member.config.group_id, result)
        if error is not None:
            log.warning("auto commit: %s", error)

    def _look(self) -> dict[str, int]:
        """The subscribed topics that exist (by name, or matching the pattern) and their partition counts."""
        self._seen_at = time.monotonic()
        if self.pattern is None:
            return self.member.partition_counts(self.topics)
        pattern = self.pattern
        return {t: n for t, n in self.member.partition_counts(None).items() if pattern.fullmatch(t)}

    def subscribed_topics(self) -> tuple[str, ...]:
        """What this member subscribes to at a join: the names given, or the topics matching the pattern
        now.  Also remembers their partition counts: a topic created, deleted or grown later rejoins the
        group (looked at every ``metadata.max.age.ms``), so the leader assigns what exists."""
        self._seen = self._look()
        return self.topics if self.pattern is None else tuple(sorted(self._seen))

    # -- rebalancing -----------------------------------------------------------------------------------------
    def rebalance(self) -> None:
        """Give up what must be given up, join, take what was given: see the module doc."""
        member = self.member
        if member.lost:
            self._lose()
        elif not self.cooperative and self.owned:
            self._revoke(list(self.owned))
        generation = member.generation_id
        owned = tuple(self.owned) if self.cooperative else ()
        joined = member.join(Subscription(self.subscribed_topics(), owned, generation))
        new = sorted(set(joined.partitions))
        if self.cooperative:
            revoked = [tp for tp in self.owned if tp not in new]
            added = [tp for tp in new if tp not in self.owned]
            if revoked:
                self._revoke(revoked)
            self._take(new, added)
            if revoked:
                member.request_rejoin()  # the second rebalance gives the revoked partitions out
        else:
            self._take(new, new)

    def _take(self, assignment: list[TopicPartitionKey], added: list[TopicPartitionKey]) -> None:
        self.consumer._set_assignment(assignment)
        self.owned = list(assignment)
        if added:
            self.consumer._group_start_at(self.member.committed(added))
        self._call(self.on_assign, added)

    def _revoke(self, partitions: list[TopicPartitionKey]) -> None:
        if self.auto_commit_interval_ms is not None:
            self.commit_quietly(self.consumer._group_positions(partitions))
        self._call(self.on_revoke, partitions)
        self.owned = [tp for tp in self.owned if tp not in partitions]
        self.consumer._set_assignment(self.owned)

    def _lose(self) -> None:
        lost, self.owned = list(self.owned), []
        self.member.lost = False
        if lost:
            log.warning("group %r: partitions %s were lost (the membership expired): another member may be "
                        "reading them; they were not committed", self.member.config.group_id, lost)
            self._call(self.on_lost or self.on_revoke, lost)
        self.consumer._set_assignment([])

    def _call(self, callback: RebalanceCallback | None, partitions: list[TopicPartitionKey]) -> None:
        if callback is not None:
            callback(self.consumer, self.consumer._group_partitions(partitions))

    def commit_quietly(self, offsets: dict[TopicPartitionKey, int]) -> None:
        """A synchronous commit whose failure is logged, not raised (auto commit before a revocation)."""
        if not offsets:
            return
        try:
            error = commit_failure(self.member.config.group_id, self.member.commit(offsets))
        except ApplianceError as exc:
            error = GroupError(str(exc), ErrorCode.UNKNOWN_SERVER_ERROR)
        if error is not None:
            log.warning("auto commit before giving partitions up: %s", error)

    # -- the end ---------------------------------------------------------------------------------------------
    def leave(self) -> None:
        """Commit (auto commit), revoke what is owned, leave the group (``close()``, ``unsubscribe()``)."""
        if self.member.lost:
            self._lose()
        elif self.owned:
            self._revoke(list(self.owned))
        self.member.leave()


def subscription_for(consumer: GroupConsumer, member: GroupMember, values: Mapping[str, Any],
                     topics: Iterable[str] | str | re.Pattern[str], **callbacks: RebalanceCallback | None,
                     ) -> GroupSubscription:
    """The subscription ``Consumer.subscribe(topics, ...)`` asks for: topic names, or a pattern (an
    ``re.Pattern``, or a string starting with ``^``, as librdkafka reads one); its rebalance protocol and
    auto commit from the consumer's settings."""
    pattern: re.Pattern[str] | None = None
    names: tuple[str, ...] = ()
    if isinstance(topics, re.Pattern):
        pattern = topics
    elif isinstance(topics, str):
        pattern, names = (re.compile(topics), ()) if topics.startswith("^") else (None, (topics,))
    else:
        names = tuple(str(t) for t in topics)
    return GroupSubscription(
        consumer, member, topics=names, pattern=pattern,
        cooperative=all(ASSIGNORS[n].cooperative for n in values["partition.assignment.strategy"]),
        auto_commit_interval_ms=values["auto.commit.interval.ms"] if values["enable.auto.commit"] else None,
        metadata_max_age_ms=values["metadata.max.age.ms"], **callbacks,
    )
