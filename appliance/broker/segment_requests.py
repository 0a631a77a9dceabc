"""DescribeSegments: the appliance's own API through which a replica learns its leader's closed segments.

A replica of a compacted topic adopts its leader's cleaned bytes (``appliance.follower.adoption``); to
know what to copy it asks, for the partitions it follows, the leader's closed segments: base offset, next
segment's base offset, size and (when ``checksums``) the CRC-32C of the ``.log`` file
(``replicas.segment_match.closed_segments``, read from the partition's directory as it is now).  The API
key is outside Kafka's range and never advertised in ApiVersions (``ipc.kafka.appliance_messages``;
docs/protocol.md, "The appliance's own APIs").

Who is answered, and what else:

* only a replica: a request whose ``replica_id`` is below 0 (a client) is refused as a whole with
  CLUSTER_AUTHORIZATION_FAILED and a message saying so; with ``appliance.cluster.secret.file`` set, the
  broker loop refuses it the same way (:func:`unauthorized`) on a connection that did not authenticate as
  a replica (SASL/PLAIN, ``replicas.cluster_auth``), as it refuses a follower Fetch;
* per partition: UNKNOWN_TOPIC_OR_PARTITION or NOT_LEADER_OR_FOLLOWER as Fetch answers them,
  KAFKA_STORAGE_ERROR (retriable) while a clean's swap is between its renames or when the directory cannot
  be read, each with a message naming the partition.

Nothing is changed by a request.  Checksums are computed in the broker's loop, once per segment file (the
cache of ``replicas.segment_match``): a replica asks for them only for compacted topics.
"""

from __future__ import annotations

import logging
from typing import Any

from appliance.broker.handlers import BrokerContext, Handler
from ipc.kafka import ApiKey, ErrorCode, RequestHeader
from ipc.kafka.appliance_messages import (
    DescribeSegmentsPartition,
    DescribeSegmentsRequest,
    DescribeSegmentsResponse,
    DescribeSegmentsTopicResult,
    SegmentDescription,
)
from replicas.segment_match import closed_segments
from storage.errors import ApplianceError

__all__ = ["SEGMENT_HANDLERS", "describe_segments", "unauthorized"]

log = logging.getLogger("appliance.broker")


def describe_segments(ctx: BrokerContext, header: RequestHeader, body: DescribeSegmentsRequest) -> Any:
    if body.replica_id < 0:
        return _refused(f"DescribeSegments is the appliance's own API for its replicas (replica_id >= 0); "
                        f"replica_id {body.replica_id} is a client's.  Clients read segments with Fetch")
    topics = []
    for topic in body.topics:
        partitions = [_describe(ctx, topic.name, index, body.checksums) for index in topic.partitions]
        topics.append(DescribeSegmentsTopicResult(name=topic.name, partitions=partitions))
    return DescribeSegmentsResponse(error_code=ErrorCode.NONE, topics=topics)


def unauthorized(body: Any) -> DescribeSegmentsResponse:
    """The answer to a request on a connection that did not authenticate as a replica."""
    return _refused("DescribeSegments is answered only on connections authenticated as a replica "
                    "(appliance.cluster.secret.file is set: authenticate with SASL/PLAIN first)")


def _refused(message: str) -> DescribeSegmentsResponse:
    return DescribeSegmentsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=message)


def _describe(ctx: BrokerContext, topic: str, index: int, checksums: bool) -> DescribeSegmentsPartition:
    out = DescribeSegmentsPartition(partition_index=index, error_code=ErrorCode.NONE)
    handle, code = ctx.lookup(topic, index)
    if handle is None:
        out.error_code = code
        out.error_message = f"partition {topic}-{index}: {ErrorCode(code).name}"
        return out
    try:
        listing = closed_segments(handle.directory, checksums=checksums)
    except (OSError, ApplianceError) as e:
        log.error("describe segments %s: %s", handle.name, e)
        out.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        out.error_message = f"partition {handle.name}: reading {handle.directory}: {e}"
        return out
    if listing.swapping:
        out.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        out.error_message = (f"partition {handle.name}: a cleaned segment is being swapped in "
                             f"({handle.directory}); ask again")
        return out
    out.log_start_offset = handle.log_start_offset
    out.active_base_offset = listing.active_base_offset
    out.segments = [SegmentDescription(s.base_offset, s.next_offset, s.size_bytes, s.checksum)
                    for s in listing.segments]
    return out


SEGMENT_HANDLERS: dict[int, Handler] = {ApiKey.DESCRIBE_SEGMENTS: describe_segments}
