"""The broker's answers to the requests that need no waiting: versions, metadata, offsets, topics, ids.

Each handler is a plain function ``(ctx, header, request body) -> response body``: no sockets, no clocks,
so the rules are readable in one place and the broker loop (``appliance.broker.broker``) only dispatches.
Produce (``appliance.broker.produce``), Fetch (``appliance.broker.fetch_session``), CreateTopics and
DeleteTopics (``appliance.broker.topic_requests``) may have to wait and live apart.

Conventions, as Kafka has them:

* Errors are per topic or per partition inside a successful response; nothing here closes a connection.
* UNKNOWN_TOPIC_OR_PARTITION for a topic or partition that does not exist; NOT_LEADER_OR_FOLLOWER for one
  this appliance does not serve (or not yet); INVALID_TOPIC_EXCEPTION for a name Kafka would refuse
  (``appliance.config.check_topic_name``: 1-249 of ``[A-Za-z0-9._-]``, not ``.`` or ``..``), so no name can
  reach a path.
* ListOffsets "latest" (-1) is the high watermark for consumers (isolation level read_uncommitted; with no
  transactions read_committed is the same) and the log end offset for followers (``replica_id >= 0``) and
  for Kafka's debugging replica id -2 (``appliance topics describe`` over TCP).
  "earliest" (-2) is the log start offset.  A timestamp finds the first record whose timestamp is at or after
  it (``storage.timestamp_search``: to the record, inside compressed batches too), below the high watermark,
  else offset -1; the max-timestamp spec (-3, v7+) the first record holding the largest timestamp, with that
  timestamp, or offset -1 when it is at or above the high watermark (Kafka filters it the same way).  Any
  other negative timestamp (-4 and -5 belong to versions 8 and 9, not served) answers INVALID_TIMESTAMP for
  that partition and reads nothing.
* Metadata creates a topic it is asked about and does not know when ``auto.create.topics.enable`` and the
  request's ``allow_auto_topic_creation`` (v4+; always on before v4) say so; never one whose name begins
  with ``__`` (reserved for internal topics: INVALID_TOPIC_EXCEPTION, as CreateTopics answers).  As in
  Kafka, the creation is not waited for: it is submitted to the supervisor as CreateTopics' are
  (``Cluster.submit``, answered once recorded), the topic is answered LEADER_NOT_AVAILABLE (retriable) in
  that response, and a later Metadata lists it; a request asking again meanwhile submits nothing new
  (``BrokerContext.auto_creating``).  Otherwise a missing topic is UNKNOWN_TOPIC_OR_PARTITION.
* Metadata builds each topic's answer, and each partition's, on its own: a topic the supervisor could not
  describe is answered with its error (LEADER_NOT_AVAILABLE: retriable), a partition whose answer fails
  with KAFKA_STORAGE_ERROR (a file or shared-memory error) or UNKNOWN_SERVER_ERROR (a bug), each logged
  with its name; every other topic and partition is answered in full.
* Consumer groups are answered by ``appliance.broker.group_requests`` (the coordinator's glue).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.broker import log_dirs
from appliance.broker.cluster import Cluster, ClusterError, TopicChange
from appliance.broker.partitions import INTERNAL_TOPICS, PartitionHandle, PartitionTable, TopicMeta
from appliance.broker.replication import LeaderReplication
from appliance.config.server_config import Config, check_new_topic_name, check_topic_name
from ipc.kafka import (
    ApiKey,
    ApiVersionsResponse,
    EpochEndOffset,
    ErrorCode,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
    RequestHeader,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
    supported_api_versions,
)
from ipc.kafka.messages import DescribeLogDirsRequest, DescribeLogDirsResponse
from replicas.leader_epochs import answer_offset_for_leader_epoch
from storage.errors import ApplianceError

__all__ = ["HANDLERS", "BrokerContext", "Handler", "metadata"]

log = logging.getLogger("appliance.broker")

EARLIEST_TIMESTAMP = -2
DEBUGGING_REPLICA_ID = -2  # ListOffsets from a tool (not a consumer): "latest" is the log end offset
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3  # ListOffsets v7+: the record with the largest timestamp
METADATA_REFRESH_MS = 200  # at most this often when nothing forces a refresh
PERIODIC_REFRESH_MS = 1000  # while requests come in, at least this often (topics deleted elsewhere) ...
PERIODIC_REFRESH_SHARE = 0.05  # ... but a periodic refresh takes at most this share of the broker's time
REFRESH_ANSWER_TIMEOUT_MS = 5000  # a periodic refresh not answered in this long is asked again
FORCED_REFRESH_MS = 10  # ... and at most this often when forced (a name we do not know) ...
FORCED_REFRESH_SHARE = 0.25  # ... unless a reload takes more than this share of that (a large topic list)
_TOPIC_LIST = "the topic list"  # BrokerContext.log_failure's key for a failed ask


@dataclass
class BrokerContext:
    """What every handler may use: the configuration, the partition table, the metadata owner."""

    config: Config
    table: PartitionTable
    cluster: Cluster
    cluster_id: str
    # listener name -> the (host, port) clients are told to connect to
    advertised: dict[str, tuple[str, int]] = field(default_factory=dict)
    replication: LeaderReplication | None = None  # the ISR of the replicated partitions led here
    # topics Metadata is auto-creating: submitted to the supervisor, not yet in the topic list
    auto_creating: dict[str, TopicChange] = field(default_factory=dict)
    _listed_at: float = -1e18  # when the list now in the table was asked (monotonic ms)
    _reload_ms: float = 0.0  # what the last reload took (thousands of partitions: a large answer to parse)
    _periodic_asked_at: float | None = None  # when the periodic refresh on its way was asked; None: none
    _failed_at: float = -1e18  # when a blocking ask last failed (monotonic ms)
    _generation: int = 0  # counts the table's changes: a refresh answer older than one is dropped
    _failures_logged: dict[str, str] = field(default_factory=dict)  # topic or partition -> last error logged

    def log_failure(self, what: str, why: str) -> None:
        """Log a topic's or partition's failure once per distinct reason (Metadata is asked often)."""
        if self._failures_logged.get(what) != why:
            self._failures_logged[what] = why
            log.error("metadata: %s: %s", what, why)

    @property
    def node_id(self) -> int:
        return self.config.node_id

    def refresh_topics(self, *, soon: bool = False) -> None:
        """Ask the metadata owner for the topic list, and wait for it, unless the list in the table was
        asked in the last :data:`METADATA_REFRESH_MS`; if ``soon`` (a name we do not know), in the last
        :data:`FORCED_REFRESH_MS`, or the last reload's time over :data:`FORCED_REFRESH_SHARE` when that is
        longer, up to :data:`METADATA_REFRESH_MS` (a client asking for an unknown name in a loop must not
        keep a broker of thousands of partitions reloading).  The list's age counts from when it was asked,
        set when its answer is taken: a periodic refresh on its way does not make the table any younger.
        After a failed ask the next waits :data:`METADATA_REFRESH_MS` (an unanswering supervisor must not
        hold every request)."""
        now_ms = time.monotonic() * 1000
        least_ms: float = METADATA_REFRESH_MS
        if soon:
            least_ms = min(least_ms, max(FORCED_REFRESH_MS, self._reload_ms / FORCED_REFRESH_SHARE))
        if now_ms - self._listed_at < least_ms:
            return
        if now_ms - self._failed_at < METADATA_REFRESH_MS:
            return
        self.reload_topics()

    def refresh_if_stale(self) -> None:
        """Refresh if the list in the table was asked more than :data:`PERIODIC_REFRESH_MS` ago, or more
        than the last reload's time over :data:`PERIODIC_REFRESH_SHARE` when that is longer (called as
        requests come).

        The broker's loop does not wait for it: the request is sent (``Cluster.topics_later``) and the list
        taken when the answer comes, unless the table changed meanwhile (a blocking reload, a topic the
        broker created): that answer may be older, and is dropped.  One is on its way at a time (asked
        again after :data:`REFRESH_ANSWER_TIMEOUT_MS` without an answer)."""
        now_ms = time.monotonic() * 1000
        asked_ms = self._periodic_asked_at
        if asked_ms is not None and now_ms - asked_ms < REFRESH_ANSWER_TIMEOUT_MS:
            return
        period_ms = max(PERIODIC_REFRESH_MS, self._reload_ms / PERIODIC_REFRESH_SHARE)
        if now_ms - self._listed_at < period_ms:
            return
        self._periodic_asked_at = now_ms
        generation = self._generation

        def answered(topics: Mapping[str, TopicMeta] | ApplianceError) -> None:
            if self._periodic_asked_at == now_ms:
                self._periodic_asked_at = None
            if isinstance(topics, ApplianceError):
                self._list_failed(topics)
                return
            if generation != self._generation:
                return  # the table changed since it was asked: this answer may be older
            self._take_topics(topics, now_ms)

        self.cluster.topics_later(answered)

    def _take_topics(self, topics: Mapping[str, TopicMeta], asked_ms: float) -> None:
        self._generation += 1
        self.table.update(topics)
        self._listed_at = asked_ms
        self._failed_at = -1e18  # answered again: a forced refresh need not wait for the failure's pause
        self._failures_logged.pop(_TOPIC_LIST, None)
        self._reload_ms = time.monotonic() * 1000 - asked_ms
        if self.replication is not None:
            self.replication.sync()

    def reload_topics(self) -> None:
        """Ask the metadata owner for the topic list now and wait for it (after we changed it)."""
        asked_ms = time.monotonic() * 1000
        try:
            topics = self.cluster.topics()
        except ApplianceError as e:
            self._failed_at = time.monotonic() * 1000
            self._list_failed(e)
            return
        self._take_topics(topics, asked_ms)

    def _list_failed(self, error: ApplianceError) -> None:
        """Log a failed ask for the topic list once per reason until one succeeds (a failed ask leaves the
        table's age as it was: the next request that needs a younger list asks again)."""
        if self._failures_logged.get(_TOPIC_LIST) != str(error):
            self._failures_logged[_TOPIC_LIST] = str(error)
            log.warning("cannot refresh topic metadata from the supervisor: %s", error)

    def add_topic(self, meta: TopicMeta) -> None:
        """Take one topic the metadata owner just described (a creation's answer) without asking for the
        whole list."""
        self._generation += 1
        self.table.update({**self.table.topics, meta.name: meta})
        if self.replication is not None:
            self.replication.sync()

    def lookup(self, topic: str, partition: int) -> tuple[PartitionHandle | None, ErrorCode]:
        """Like ``PartitionTable.lookup``, refreshing the topic list once if the topic is unknown."""
        handle, code = self.table.lookup(topic, partition)
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and check_topic_name(topic) is None:
            self.refresh_topics(soon=True)
            handle, code = self.table.lookup(topic, partition)
        return handle, code


Handler = Callable[[BrokerContext, RequestHeader, Any], Any]


# -- ApiVersions -----------------------------------------------------------------------------------------


def api_versions(ctx: BrokerContext, header: RequestHeader, body: Any) -> ApiVersionsResponse:
    return ApiVersionsResponse(error_code=ErrorCode.NONE, api_keys=supported_api_versions())


# -- Metadata --------------------------------------------------------------------------------------------


def metadata(
    ctx: BrokerContext, header: RequestHeader, body: MetadataRequest, listener: str = "PLAINTEXT"
) -> MetadataResponse:
    ctx.refresh_topics()
    table = ctx.table
    if body.topics is None:
        names = sorted(table.topics)
    else:
        names = list(dict.fromkeys(t.name for t in body.topics))
    if any(name not in table.topics and check_topic_name(name) is None for name in names):
        ctx.refresh_topics(soon=True)  # once for every name we do not know
    auto_create = ctx.config.auto_create_topics_enable and (
        header.api_version < 4 or body.allow_auto_topic_creation
    )
    topics = []
    for name in names:
        meta = table.topics.get(name)
        if meta is None:
            reason = check_topic_name(name)
            if reason is not None:
                topics.append(MetadataResponseTopic(error_code=ErrorCode.INVALID_TOPIC_EXCEPTION, name=name))
                continue
        if meta is None and auto_create and check_new_topic_name(name) is not None:
            topics.append(MetadataResponseTopic(error_code=ErrorCode.INVALID_TOPIC_EXCEPTION, name=name))
            continue
        if meta is None and auto_create:
            topics.append(MetadataResponseTopic(error_code=_auto_create(ctx, name), name=name))
            continue
        if meta is None:
            topics.append(MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name))
            continue
        ctx.auto_creating.pop(name, None)
        topics.append(_topic_metadata_or_error(ctx, meta))
    host, port = ctx.advertised.get(listener) or next(iter(ctx.advertised.values()), ("127.0.0.1", 9092))
    return MetadataResponse(
        brokers=[MetadataResponseBroker(node_id=ctx.node_id, host=host, port=port, rack=None)],
        cluster_id=ctx.cluster_id,
        controller_id=ctx.node_id,
        topics=topics,
    )


def _topic_metadata_or_error(ctx: BrokerContext, meta: TopicMeta) -> MetadataResponseTopic:
    """One topic's answer; its error alone if the supervisor could not describe it or building it fails."""
    if meta.error:
        ctx.log_failure(f"topic {meta.name}", f"{ErrorCode(meta.error).name}: {meta.error_message}")
        return MetadataResponseTopic(error_code=meta.error, name=meta.name)
    try:
        return _topic_metadata(ctx, meta)
    except Exception as e:  # a bug costs this topic's answer, not the others'
        log.exception("metadata: topic %s", meta.name)
        ctx.log_failure(f"topic {meta.name}", repr(e))
        return MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, name=meta.name)


def _topic_metadata(ctx: BrokerContext, meta: TopicMeta) -> MetadataResponseTopic:
    partitions = [_partition_metadata_or_error(ctx, meta, index) for index in range(meta.partitions)]
    return MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=meta.name, is_internal=meta.name in INTERNAL_TOPICS,
        partitions=partitions,
    )


def _partition_metadata_or_error(
    ctx: BrokerContext, meta: TopicMeta, index: int
) -> MetadataResponsePartition:
    try:
        return _partition_metadata(ctx, meta, index)
    except Exception as e:  # this partition's answer only
        storage = isinstance(e, OSError | ApplianceError)
        code = ErrorCode.KAFKA_STORAGE_ERROR if storage else ErrorCode.UNKNOWN_SERVER_ERROR
        if code == ErrorCode.UNKNOWN_SERVER_ERROR:
            log.exception("metadata: partition %s-%d", meta.name, index)
        ctx.log_failure(f"partition {meta.name}-{index}", f"{code.name}: {e}")
        return MetadataResponsePartition(error_code=code, partition_index=index, leader_id=-1,
                                         leader_epoch=-1, replica_nodes=[], isr_nodes=[],
                                         offline_replicas=[])  # fmt: skip


def _partition_metadata(ctx: BrokerContext, meta: TopicMeta, index: int) -> MetadataResponsePartition:
    table = ctx.table
    leader = table.leader(meta, index)
    code = ErrorCode.NONE
    epoch = 0
    offline_replicas: list[int] = []
    if index in meta.offline:  # as Kafka lists a partition whose leader's log dir is offline
        code, offline_replicas, leader = ErrorCode.LEADER_NOT_AVAILABLE, [leader], -1
    elif leader == ctx.node_id:
        handle, lookup_code = table.lookup(meta.name, index)
        if handle is None:
            code, leader = ErrorCode.LEADER_NOT_AVAILABLE, -1
            log.debug("metadata: %s-%d: %s", meta.name, index, lookup_code.name)
        else:
            epoch = handle.leader_epoch()
    return MetadataResponsePartition(
        error_code=code,
        partition_index=index,
        leader_id=leader,
        leader_epoch=epoch,
        replica_nodes=list(table.replicas(meta, index)),
        isr_nodes=list(_isr(ctx, meta, index)),
        offline_replicas=offline_replicas,
    )


def _isr(ctx: BrokerContext, meta: TopicMeta, index: int) -> tuple[int, ...]:
    """In-sync replicas, leader first: the replication layer's for a partition it leads, else the table's."""
    known = ctx.replication.isr(meta.name, index) if ctx.replication is not None else None
    if known is None:
        return ctx.table.isr(meta, index)
    return (ctx.node_id, *(r for r in known if r != ctx.node_id))


def _auto_create(ctx: BrokerContext, name: str) -> ErrorCode:
    """Have the supervisor create ``name`` (``num.partitions``, ``default.replication.factor``) without
    waiting, through the path CreateTopics takes (:meth:`Cluster.submit`); the answer for it in this
    response: LEADER_NOT_AVAILABLE (retriable) while it is being created, as Kafka answers, or the error of
    a creation refused."""
    change = ctx.auto_creating.get(name)
    if change is None:
        change = TopicChange("create", name, 0)  # timeout 0: answered once recorded
        ctx.auto_creating[name] = change
        ctx.cluster.submit(change)
        log.info("topic %r: auto-creating it for Metadata (auto.create.topics.enable)", name)
    if not change.done:
        return ErrorCode.LEADER_NOT_AVAILABLE
    del ctx.auto_creating[name]  # answered, and the topic list did not show it yet
    if change.error is not None and change.error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
        log.info("topic %r not auto-created by Metadata: %s", name, change.error)
        return change.error.code
    return ErrorCode.LEADER_NOT_AVAILABLE  # created: the next refresh lists it


# -- ListOffsets -----------------------------------------------------------------------------------------


def list_offsets(ctx: BrokerContext, header: RequestHeader, body: ListOffsetsRequest) -> ListOffsetsResponse:
    follower = body.replica_id >= 0 or body.replica_id == DEBUGGING_REPLICA_ID
    topics = []
    for topic in body.topics:
        partitions = []
        for part in topic.partitions:
            out = ListOffsetsPartitionResponse(
                partition_index=part.partition_index, error_code=ErrorCode.NONE
            )
            partitions.append(out)
            handle, code = ctx.lookup(topic.name, part.partition_index)
            if handle is None:
                out.error_code = code
                continue
            code = handle.check_epoch(part.current_leader_epoch)
            if code == ErrorCode.NONE and part.timestamp < MAX_TIMESTAMP:
                log.info("list offsets %s: timestamp %d is neither >= 0 nor one of -1, -2, -3",
                         handle.name, part.timestamp)
                code = ErrorCode.INVALID_TIMESTAMP
            if code != ErrorCode.NONE:
                out.error_code = code
                continue
            try:
                out.offset, out.timestamp = _offset_for(handle, part.timestamp, follower)
                out.leader_epoch = handle.leader_epoch()
            except (ApplianceError, OSError) as e:
                log.error("list offsets %s (timestamp %d): %s", handle.name, part.timestamp, e)
                out.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        topics.append(ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
    return ListOffsetsResponse(topics=topics)


def _offset_for(handle: PartitionHandle, timestamp: int, follower: bool) -> tuple[int, int]:
    """(offset, timestamp) for a ListOffsets query; (-1, -1) when no record qualifies."""
    bound = handle.log_end_offset if follower else handle.high_watermark
    if timestamp == EARLIEST_TIMESTAMP:
        return handle.log_start_offset, -1
    if timestamp == LATEST_TIMESTAMP:
        return bound, -1
    found = handle.reader.offset_for_timestamp(timestamp)
    if found is None or found.offset >= bound:
        return -1, -1
    return found.offset, found.timestamp


# -- InitProducerId --------------------------------------------------------------------------------------


def init_producer_id(
    ctx: BrokerContext, header: RequestHeader, body: InitProducerIdRequest
) -> InitProducerIdResponse:
    if body.transactional_id is not None:
        # Transactions are not implemented: say so rather than hand out an id that promises them.
        return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST)
    try:
        producer_id, producer_epoch = ctx.cluster.init_producer_id()
    except ClusterError as e:
        log.warning("init producer id: %s", e)
        return InitProducerIdResponse(error_code=e.code)
    return InitProducerIdResponse(
        error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=producer_epoch
    )


# -- OffsetForLeaderEpoch (followers) --------------------------------------------------------------------


def offset_for_leader_epoch(
    ctx: BrokerContext, header: RequestHeader, body: OffsetForLeaderEpochRequest
) -> OffsetForLeaderEpochResponse:
    topics = []
    for topic in body.topics:
        partitions = []
        for part in topic.partitions:
            out = EpochEndOffset(error_code=ErrorCode.NONE, partition=part.partition)
            partitions.append(out)
            handle, code = ctx.lookup(topic.topic, part.partition)
            if handle is None:
                out.error_code = code
                continue
            try:
                answer = answer_offset_for_leader_epoch(
                    partition=part.partition, requested_epoch=part.leader_epoch,
                    current_leader_epoch=part.current_leader_epoch, leader_epoch=handle.leader_epoch(),
                    end_offset_for=handle.reader.end_offset_for_epoch,
                )
            except (ApplianceError, OSError) as e:
                log.error("offset for leader epoch %s (epoch %d): %s", handle.name, part.leader_epoch, e)
                out.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                continue
            partitions[-1] = answer
        topics.append(OffsetForLeaderTopicResult(topic=topic.topic, partitions=partitions))
    return OffsetForLeaderEpochResponse(topics=topics)


# -- DescribeLogDirs: bytes on disk per partition --------------------------------------------------------


def describe_log_dirs(
    ctx: BrokerContext, header: RequestHeader, body: DescribeLogDirsRequest
) -> DescribeLogDirsResponse:
    ctx.refresh_topics()
    return log_dirs.describe_log_dirs(ctx.table, body)


# -- SASL on the client listener: not offered ------------------------------------------------------------


def sasl_handshake(ctx: BrokerContext, header: RequestHeader, body: Any) -> SaslHandshakeResponse:
    return SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=[])


def sasl_authenticate(ctx: BrokerContext, header: RequestHeader, body: Any) -> SaslAuthenticateResponse:
    return SaslAuthenticateResponse(
        error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message="this listener is PLAINTEXT", auth_bytes=b""
    )


# Every API answered without waiting.  Produce, Fetch, CreateTopics and DeleteTopics are dispatched by the
# broker loop itself; Metadata is too (it needs the listener the request came through), and the group
# requests (appliance.broker.group_requests).
HANDLERS: dict[int, Handler] = {
    ApiKey.API_VERSIONS: api_versions,
    ApiKey.LIST_OFFSETS: list_offsets,
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch,
    ApiKey.DESCRIBE_LOG_DIRS: describe_log_dirs,
    ApiKey.SASL_HANDSHAKE: sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: sasl_authenticate,
}
