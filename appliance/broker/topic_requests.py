"""CreateTopics and DeleteTopics: checked at once, then held until the supervisor answers or time runs out.

Theory of operation
-------------------
Creating a topic of a thousand partitions takes the supervisor seconds (it recovers a log and starts a writer
per partition); deleting one stops as many writers.  The broker's loop must not wait for that: other clients'
Metadata, Fetch and Produce go on meanwhile.  So a CreateTopics or DeleteTopics request is handled as a
Produce waiting for acks is (``appliance.broker.produce``):

1. :meth:`TopicRequests.start` checks each topic as Kafka does (a name Kafka would refuse, a duplicate, a
   bad partition count or replication factor, a replica assignment the appliance cannot honour
   (``appliance.config.replica_assignment``), a bad setting, a topic that exists or does not) and answers at
   once if nothing is left to ask the supervisor (or ``validate_only``).  Every topic that passed is a
   :class:`~appliance.broker.cluster.TopicChange` submitted to the supervisor without waiting
   (:meth:`~appliance.broker.cluster.Cluster.submit`), and the request is *held*: the broker parks its
   connection (the requests behind it wait, as Kafka mutes a connection with a request in progress; other
   connections are served).
2. Each turn that the supervisor's answers arrive (or a deadline passes), :meth:`TopicRequests.poll`
   returns the held requests whose every topic is answered, or whose ``timeout_ms`` ran out: those topics get
   REQUEST_TIMED_OUT (retriable) and the change goes on -- or rolls back -- in the supervisor; its late
   answer is dropped (:meth:`~appliance.broker.cluster.Cluster.withdraw`).  A retry of a creation then
   finds TOPIC_ALREADY_EXISTS or creates it, never half a topic (``appliance.server.topic_changes``).
3. When a held request had a change that happened, the broker's topic list is reloaded before the answer
   goes out, so a Metadata sent after the answer sees the change.

A CreateTopics ``timeout_ms <= 0`` is Kafka's "do not wait": the supervisor answers once the topic is
recorded, and the request is held at most :data:`NO_WAIT_TIMEOUT_MS` for that.  A deletion is one control
request whatever its partition count (the supervisor stops the topic's writers together).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.broker.cluster import TopicChange
from appliance.broker.handlers import BrokerContext
from appliance.broker.partitions import INTERNAL_TOPICS, listed_replicas
from appliance.config.replica_assignment import (
    Assignment,
    AssignmentRefusal,
    check_assignment,
    known_nodes,
)
from appliance.config.server_config import check_new_topic_name, check_topic_name, parse_override
from ipc.kafka import (
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ErrorCode,
    RequestHeader,
)
from storage.errors import ConfigError

__all__ = ["NO_WAIT_TIMEOUT_MS", "TopicRequests"]

log = logging.getLogger("appliance.broker")

NO_WAIT_TIMEOUT_MS: Final = 5000  # timeout_ms <= 0: wait this long for the topic to be recorded

Result = CreatableTopicResult | DeletableTopicResult


@dataclass(eq=False, slots=True)
class _Held:
    """A request waiting for the supervisor: its answers so far, and the changes still out."""

    owner: object
    header: RequestHeader
    deleting: bool  # DeleteTopics (else CreateTopics)
    deadline_ms: float
    results: list[Any]  # CreatableTopicResult or DeletableTopicResult, in request order
    changes: list[tuple[TopicChange, Result]] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return all(change.done for change, _ in self.changes)


class TopicRequests:
    """The held CreateTopics and DeleteTopics requests (module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self._held: list[_Held] = []

    @property
    def pending(self) -> int:
        return len(self._held)

    def next_deadline_ms(self) -> float | None:
        return min((held.deadline_ms for held in self._held), default=None)

    # -- starting -----------------------------------------------------------------------------------------

    def start_create(self, owner: object, header: RequestHeader, body: CreateTopicsRequest,
                     now_ms: float) -> CreateTopicsResponse | None:  # fmt: skip
        """The answer now, or None: held, answered by :meth:`poll`."""
        self.ctx.refresh_topics(soon=True)
        counts: dict[str, int] = {}
        for topic in body.topics:
            counts[topic.name] = counts.get(topic.name, 0) + 1
        timeout_ms = body.timeout_ms if body.timeout_ms > 0 else NO_WAIT_TIMEOUT_MS
        held = _Held(owner, header, False, now_ms + timeout_ms, [])
        for topic in body.topics:
            result = CreatableTopicResult(name=topic.name, error_code=ErrorCode.NONE)
            held.results.append(result)
            checked = self._check_create(topic, counts[topic.name] > 1, body.timeout_ms)
            if isinstance(checked, TopicChange):
                if not body.validate_only:
                    held.changes.append((checked, result))
            else:
                result.error_code, result.error_message = checked
        return self._hold_or_answer(held)

    def start_delete(self, owner: object, header: RequestHeader, body: DeleteTopicsRequest,
                     now_ms: float) -> DeleteTopicsResponse | None:  # fmt: skip
        """The answer now, or None: held, answered by :meth:`poll`."""
        self.ctx.refresh_topics(soon=True)
        timeout_ms = body.timeout_ms if body.timeout_ms > 0 else NO_WAIT_TIMEOUT_MS
        held = _Held(owner, header, True, now_ms + timeout_ms, [])
        for name in body.topic_names:
            result = DeletableTopicResult(name=name, error_code=ErrorCode.NONE)
            held.results.append(result)
            if check_topic_name(name) is not None:
                result.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
            elif not self.ctx.config.delete_topic_enable:
                result.error_code = ErrorCode.TOPIC_DELETION_DISABLED
            elif name in INTERNAL_TOPICS:  # every group's committed offsets: docs/protocol.md
                log.info("DeleteTopics %r refused: it holds every consumer group's offsets", name)
                result.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
            elif name not in self.ctx.table.topics:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                held.changes.append((TopicChange("delete", name, timeout_ms), result))
        return self._hold_or_answer(held)

    def _hold_or_answer(self, held: _Held) -> Any:
        for change, _ in held.changes:
            self.ctx.cluster.submit(change)
        if held.answered:  # nothing to ask, or every change refused (or answered) at once
            return self._response(held)
        self._held.append(held)
        return None

    def _check_create(self, topic: Any, duplicated: bool,
                      timeout_ms: int) -> TopicChange | tuple[ErrorCode, str]:  # fmt: skip
        """The change to submit, or the error Kafka answers for this topic of a CreateTopics."""
        name = topic.name
        refusal = _refusal(topic, duplicated)
        if refusal is not None:
            return refusal
        if name in self.ctx.table.topics:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        # CreateTopics carries every value as a string: read it as `--topic-config KEY=VALUE` is read
        # (2048 an integer, true a boolean, anything else the text)
        configs: dict[str, Any] = {
            c.name: parse_override(f"{c.name}={c.value}")[1] for c in topic.configs if c.value is not None
        }
        partitions = None if topic.num_partitions == -1 else topic.num_partitions
        replication = None if topic.replication_factor == -1 else topic.replication_factor
        assignments: tuple[tuple[int, ...], ...] | None = None
        if topic.assignments:
            assigned = self._assignment(topic)
            if isinstance(assigned, AssignmentRefusal):
                log.info("CreateTopics %r refused: %s", name, assigned.message)
                return assigned.code, assigned.message
            partitions, replication, assignments = (assigned.partitions, assigned.replication_factor,
                                                    assigned.replicas)  # fmt: skip
        overrides: dict[str, object] = dict(configs)
        if partitions is not None:
            overrides["partitions"] = partitions
        if replication is not None:
            overrides["replication.factor"] = replication
        try:
            self.ctx.config.topic(name, overrides)
        except ConfigError as e:
            return ErrorCode.INVALID_CONFIG, str(e)
        return TopicChange("create", name, timeout_ms, partitions=partitions, replication_factor=replication,
                           configs=configs, assignments=assignments)  # fmt: skip

    def _assignment(self, topic: Any) -> Assignment | AssignmentRefusal:
        """The replicas a CreateTopics topic's explicit assignment asks for, or why they cannot be honoured
        (``appliance.config.replica_assignment``)."""
        config = self.ctx.config
        nodes = known_nodes(config.node_id, len(config.replica_dirs), listed_replicas(self.ctx.table))
        pairs = [(a.partition_index, list(a.broker_ids)) for a in topic.assignments]
        return check_assignment(topic.name, pairs, num_partitions=topic.num_partitions,
                                replication_factor=topic.replication_factor, node_id=config.node_id,
                                nodes=nodes)  # fmt: skip

    # -- finishing ----------------------------------------------------------------------------------------

    def poll(self, now_ms: float) -> list[tuple[object, RequestHeader, Any]]:
        """The held requests answered now: every change answered, or the deadline passed."""
        if not self._held:
            return []
        finished = []
        for held in list(self._held):
            if held.answered or held.deadline_ms <= now_ms:
                self._held.remove(held)
                finished.append(held)
        return [(held.owner, held.header, self._response(held)) for held in finished]

    def _response(self, held: _Held) -> Any:
        changed = False
        for change, result in held.changes:
            if not change.done:
                self.ctx.cluster.withdraw(change)
                _answer(result, ErrorCode.REQUEST_TIMED_OUT, _timed_out(change))
            elif change.error is not None:
                _answer(result, change.error.code, str(change.error))
            else:
                changed = True
                log.info("topic %r %s", change.name, "created by CreateTopics" if change.op == "create"
                         else "deleted by DeleteTopics")  # fmt: skip
        if changed:
            self.ctx.reload_topics()
        if held.deleting:
            return DeleteTopicsResponse(responses=held.results)
        return CreateTopicsResponse(topics=held.results)

    def close(self) -> None:
        """Stop waiting for every held request (the broker stops; their connections close)."""
        for held in self._held:
            for change, _ in held.changes:
                if not change.done:
                    self.ctx.cluster.withdraw(change)
        self._held.clear()


def _refusal(topic: Any, duplicated: bool) -> tuple[ErrorCode, str] | None:
    """The error Kafka answers for a CreateTopics topic whatever exists: a bad name, count or factor."""
    reason = check_new_topic_name(topic.name)
    if reason is not None:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, reason
    if duplicated:
        return ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} appears more than once in the request"
    if topic.num_partitions == 0 or topic.num_partitions < -1:
        return (ErrorCode.INVALID_PARTITIONS,
                f"number of partitions {topic.num_partitions}: must be at least 1")  # fmt: skip
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        return (ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {topic.replication_factor}: must be at least 1")  # fmt: skip
    return None


def _answer(result: Result, code: int, message: str) -> None:
    result.error_code = code
    if isinstance(result, CreatableTopicResult):
        result.error_message = message
    else:
        log.info("DeleteTopics %r: %s", result.name, message)  # DeleteTopics carries no message


def _timed_out(change: TopicChange) -> str:
    what = "creation" if change.op == "create" else "deletion"
    return (f"topic {change.name!r}: the {what} did not finish within the request's timeout; it goes on (or "
            "rolls back) in the appliance: list the topics before retrying")
