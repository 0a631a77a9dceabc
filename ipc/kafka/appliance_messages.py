"""The appliance's own messages: APIs Apache Kafka does not have, spoken only between its processes.

Each has an api key outside Kafka's range (:data:`DESCRIBE_SEGMENTS_KEY`), is never listed in ApiVersions
(``ApiSpec.advertised`` is False) and is documented in docs/protocol.md, "The appliance's own APIs".  The
encodings are Kafka's classic (non-flexible) ones, declared as :mod:`ipc.kafka.messages` declares Kafka's.

**DescribeSegments** (v0): a replica asks its leader for the closed segments of partitions it follows, so
it can adopt the leader's cleaned bytes (``appliance.follower.adoption``).  Each segment is its base
offset, the base offset of the segment after it (``next_offset``), its size and, when asked for
(``checksums``), the CRC-32C of its whole ``.log`` file (-1 when not asked).  ``active_base_offset`` is
the base offset of the leader's active segment (the segments listed all lie below it).
"""

# ruff: noqa: RUF009 -- ``wire()`` returns a dataclasses.field(); a field specifier, not a shared default.

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ipc.kafka.schema import ARRAY, BOOL, INT16, INT32, INT64, STRING, Struct, wire

__all__ = [
    "DESCRIBE_SEGMENTS_KEY",
    "DescribeSegmentsPartition",
    "DescribeSegmentsRequest",
    "DescribeSegmentsResponse",
    "DescribeSegmentsTopic",
    "DescribeSegmentsTopicResult",
    "SegmentDescription",
]

DESCRIBE_SEGMENTS_KEY: Final = 30_000  # Kafka's keys are below 100; int16 leaves room


@dataclass(slots=True)
class DescribeSegmentsTopic(Struct):
    name: str = wire(STRING)
    partitions: list[int] = wire(ARRAY(INT32))


@dataclass(slots=True)
class DescribeSegmentsRequest(Struct):
    replica_id: int = wire(INT32)  # the asking replica's node.id (>= 0; a client's -1 is refused)
    checksums: bool = wire(BOOL)  # compute each segment's CRC-32C (else -1)
    topics: list[DescribeSegmentsTopic] = wire(ARRAY(DescribeSegmentsTopic))


@dataclass(slots=True)
class SegmentDescription(Struct):
    base_offset: int = wire(INT64)
    next_offset: int = wire(INT64)  # the next segment's base offset
    size_bytes: int = wire(INT64)
    checksum: int = wire(INT64)  # CRC-32C of the whole .log file; -1 when not asked


@dataclass(slots=True)
class DescribeSegmentsPartition(Struct):
    partition_index: int = wire(INT32)
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, nullable="0+", default=None)
    log_start_offset: int = wire(INT64, default=-1)
    active_base_offset: int = wire(INT64, default=-1)
    segments: list[SegmentDescription] = wire(ARRAY(SegmentDescription))


@dataclass(slots=True)
class DescribeSegmentsTopicResult(Struct):
    name: str = wire(STRING)
    partitions: list[DescribeSegmentsPartition] = wire(ARRAY(DescribeSegmentsPartition))


@dataclass(slots=True)
class DescribeSegmentsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    error_code: int = wire(INT16)  # for the whole request (CLUSTER_AUTHORIZATION_FAILED)
    error_message: str | None = wire(STRING, nullable="0+", default=None)
    topics: list[DescribeSegmentsTopicResult] = wire(ARRAY(DescribeSegmentsTopicResult))
