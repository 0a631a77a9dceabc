"""CreatePartitions and DeleteRecords: adding partitions to a topic, moving a partition's log start offset.

Handlers as in ``appliance.broker.handlers``: ``(ctx, header, request body) -> response body``, each topic
or partition answered on its own.  Both are blocking calls to the supervisor from the broker's loop, each
for at most the control connection's request timeout (5 s) or the request's ``timeout_ms`` if shorter: a
call that runs out answers REQUEST_TIMED_OUT and the change goes on in the supervisor.

**CreatePartitions** checks what Kafka checks before asking: a topic named twice (INVALID_REQUEST), a name
Kafka refuses (INVALID_TOPIC_EXCEPTION), an unknown topic (UNKNOWN_TOPIC_OR_PARTITION), a count not above
the current one (INVALID_PARTITIONS), assignments that are not one per new partition of the topic's
replication factor, that name a node that does not exist, or that leave out this node
(INVALID_REPLICA_ASSIGNMENT, naming it: ``appliance.config.replica_assignment.check_new_partitions``).  The
supervisor then adds the partitions all-or-nothing, each new one with the replicas assigned to it (or
partition 0's), and the replicas that an assignment names follow them (``appliance.server.topic_admin``);
``validate_only`` stops before that.  The broker's topic view is reloaded before the answer, so a Metadata
sent after it lists the new partitions.

An internal topic (``__consumer_offsets``) gets no partitions (INVALID_TOPIC_EXCEPTION, a refusal of the
appliance's own: Kafka lets an authorized admin do it, and breaks every group's partition mapping) and no
deleted records (INVALID_TOPIC_EXCEPTION, as Kafka's ReplicaManager answers).

**DeleteRecords** is answered by the partition's leader only (NOT_LEADER_OR_FOLLOWER elsewhere).  Offset -1
means the high watermark; an offset above the high watermark, or below -1, is OFFSET_OUT_OF_RANGE.  The
partition's writer moves the log start offset (started for it if none runs); ``low_watermark`` is the log
start offset afterwards (-1 with an error).
"""

from __future__ import annotations

import logging

from appliance.broker.cluster import ClusterError
from appliance.broker.handlers import BrokerContext, Handler
from appliance.broker.partitions import INTERNAL_TOPICS, listed_replicas
from appliance.config.replica_assignment import AssignmentRefusal, check_new_partitions, known_nodes
from appliance.config.server_config import check_topic_name
from ipc.kafka import (
    ApiKey,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsTopic,
    CreatePartitionsTopicResult,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    ErrorCode,
    RequestHeader,
)

__all__ = ["PARTITION_HANDLERS"]

log = logging.getLogger("appliance.broker")

HIGH_WATERMARK = -1  # DeleteRecords' offset -1: everything below the high watermark


# -- CreatePartitions ------------------------------------------------------------------------------------


def create_partitions(
    ctx: BrokerContext, header: RequestHeader, body: CreatePartitionsRequest
) -> CreatePartitionsResponse:
    ctx.refresh_topics(soon=True)
    counts: dict[str, int] = {}
    for topic in body.topics:
        counts[topic.name] = counts.get(topic.name, 0) + 1
    results = []
    changed = False
    for topic in body.topics:
        result = CreatePartitionsTopicResult(name=topic.name, error_code=ErrorCode.NONE)
        results.append(result)
        refusal = _refusal(ctx, topic, counts[topic.name] > 1)
        checked = None if refusal is not None else _assignments(ctx, topic)
        if isinstance(checked, AssignmentRefusal):
            refusal, checked = (checked.code, checked.message), None
        if refusal is not None:
            result.error_code, result.error_message = refusal
            continue
        try:
            ctx.cluster.create_partitions(topic.name, topic.count, validate_only=body.validate_only,
                                          timeout_ms=body.timeout_ms, assignments=checked)  # fmt: skip
        except ClusterError as e:
            log.info("CreatePartitions %r (count %d) refused: %s", topic.name, topic.count, e)
            result.error_code, result.error_message = e.code, str(e)
            continue
        if not body.validate_only:
            log.info("topic %r: now %d partitions (CreatePartitions)", topic.name, topic.count)
            changed = True
    if changed:
        ctx.reload_topics()
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


def _refusal(ctx: BrokerContext, topic: CreatePartitionsTopic, duplicated: bool) -> tuple[int, str] | None:
    """The error Kafka answers for one topic of a CreatePartitions before anything is asked, or None."""
    name = topic.name
    reason = check_topic_name(name)
    if reason is not None:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {reason}"
    if duplicated:
        return ErrorCode.INVALID_REQUEST, f"topic {name!r} appears more than once in the request"
    if name in INTERNAL_TOPICS:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, (
            f"cannot add partitions to internal topic {name!r}: a group's partition of it is hashed from "
            "the partition count, so every group would lose its committed offsets; its count is "
            "offsets.topic.num.partitions, fixed when it is created")
    meta = ctx.table.topics.get(name)
    if meta is None or meta.error:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
    if topic.count <= meta.partitions:
        return (ErrorCode.INVALID_PARTITIONS, f"topic {name!r} has {meta.partitions} partitions; the new "
                f"count must be larger, not {topic.count}")  # fmt: skip
    if topic.assignments is not None and len(topic.assignments) != topic.count - meta.partitions:
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"topic {name!r}: {len(topic.assignments)} "
                f"assignments for {topic.count - meta.partitions} new partitions; give one per new "
                "partition")  # fmt: skip
    return None


def _assignments(ctx: BrokerContext,
                 topic: CreatePartitionsTopic) -> tuple[tuple[int, ...], ...] | AssignmentRefusal | None:
    """The new partitions' replicas an assignment asks for (None: no assignment), or why not
    (``appliance.config.replica_assignment.check_new_partitions``)."""
    meta = ctx.table.topics[topic.name]
    if topic.assignments is None:
        return None
    nodes = known_nodes(ctx.node_id, len(ctx.config.replica_dirs), listed_replicas(ctx.table))
    return check_new_partitions(topic.name, [a.broker_ids for a in topic.assignments],
                                first_partition=meta.partitions, node_id=ctx.node_id, nodes=nodes,
                                replication_factor=meta.replication_factor)  # fmt: skip


# -- DeleteRecords ---------------------------------------------------------------------------------------


def delete_records(
    ctx: BrokerContext, header: RequestHeader, body: DeleteRecordsRequest
) -> DeleteRecordsResponse:
    topics = []
    for topic in body.topics:
        results = [_delete(ctx, topic.name, part.partition_index, part.offset, body.timeout_ms)
                   for part in topic.partitions]  # fmt: skip
        topics.append(DeleteRecordsTopicResult(name=topic.name, partitions=results))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


def _delete(ctx: BrokerContext, topic: str, partition: int, offset: int,
            timeout_ms: int) -> DeleteRecordsPartitionResult:  # fmt: skip
    out = DeleteRecordsPartitionResult(partition_index=partition, low_watermark=-1, error_code=ErrorCode.NONE)
    if topic in INTERNAL_TOPICS:  # Kafka's ReplicaManager refuses it the same way
        log.info("DeleteRecords %s-%d refused: cannot delete records of an internal topic", topic, partition)
        out.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
        return out
    handle, code = ctx.lookup(topic, partition)
    if handle is None:
        out.error_code = code
        return out
    high_watermark = handle.high_watermark
    target = high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0 or target > high_watermark:
        log.info("DeleteRecords %s-%d: offset %d outside 0..%d (the high watermark)", topic, partition,
                 offset, high_watermark)  # fmt: skip
        out.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return out
    try:
        out.low_watermark = ctx.cluster.delete_records(topic, partition, target, timeout_ms=timeout_ms)
    except ClusterError as e:
        log.info("DeleteRecords %s-%d (offset %d) failed: %s", topic, partition, target, e)
        out.error_code = e.code
    return out


PARTITION_HANDLERS: dict[int, Handler] = {
    ApiKey.CREATE_PARTITIONS: create_partitions,
    ApiKey.DELETE_RECORDS: delete_records,
}
