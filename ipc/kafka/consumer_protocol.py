"""The consumer protocol's bytes: what a member says it subscribes to, and what the leader assigns it.

Theory of operation
-------------------
The group coordinator never reads a member's protocol metadata or its assignment: both are opaque bytes in
JoinGroup and SyncGroup (``appliance.coordinator.group``).  Consumers agree on their meaning among
themselves, in Kafka's ``ConsumerProtocol`` format (``ConsumerProtocolSubscription.json`` and
``ConsumerProtocolAssignment.json``), so members of this library, confluent-kafka (librdkafka) and
kafka-python can share one group and any of them can be the leader that assigns::

    Subscription                                   Assignment
    version            int16                        version              int16
    topics             [string]                     assigned_partitions  [topic string, partitions [int32]]
    user_data          nullable bytes               user_data            nullable bytes
    owned_partitions   [topic, [int32]]    v1+
    generation_id      int32 (-1)          v2+
    rack_id            nullable string     v3+

Both start with their own ``int16`` version, outside the struct.  A reader decodes the fields of the
version it knows best, at most its own (Kafka's rule: a newer version only adds fields at the end, so the
bytes after the known ones are left unread).  This library writes Subscription v2 (the owned partitions
and the generation are what ``cooperative-sticky`` needs) and Assignment v0.

Decoding raises :class:`~storage.errors.ProtocolError` for bytes that are not such a message; the leader
treats a member whose metadata does not decode as subscribed to nothing (garbage from one member breaks
nobody else).
"""

# ruff: noqa: RUF009 -- ``wire()`` returns a dataclasses.field(); a field specifier, not a shared default.

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from ipc.kafka.schema import ARRAY, BYTES, INT32, STRING, Struct, Writer, decoder_for, encoder_for, wire
from storage.errors import ProtocolError

__all__ = [
    "ASSIGNMENT_VERSION",
    "SUBSCRIPTION_VERSION",
    "Assignment",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

SUBSCRIPTION_VERSION: Final = 2  # written by this library
_SUBSCRIPTION_MAX_VERSION: Final = 3  # read by this library
ASSIGNMENT_VERSION: Final = 0
_ASSIGNMENT_MAX_VERSION: Final = 3
_VERSION: Final = struct.Struct(">h")


@dataclass(slots=True)
class TopicPartitions(Struct):
    topic: str = wire(STRING)
    partitions: list[int] = wire(ARRAY(INT32))


@dataclass(slots=True)
class _SubscriptionWire(Struct):
    topics: list[str] = wire(ARRAY(STRING))
    user_data: bytes | None = wire(BYTES, nullable="0+", default=None)
    owned_partitions: list[TopicPartitions] = wire(ARRAY(TopicPartitions), "1+")
    generation_id: int = wire(INT32, "2+", default=-1)
    rack_id: str | None = wire(STRING, "3+", nullable="3+", default=None)


@dataclass(slots=True)
class _AssignmentWire(Struct):
    assigned_partitions: list[TopicPartitions] = wire(ARRAY(TopicPartitions))
    user_data: bytes | None = wire(BYTES, nullable="0+", default=None)


@dataclass(frozen=True)
class Subscription:
    """A member's protocol metadata: the topics it subscribes to and, for cooperative assignors, the
    partitions it owns now and the generation it owned them in."""

    topics: tuple[str, ...]
    owned_partitions: tuple[tuple[str, int], ...] = ()
    generation_id: int = -1
    user_data: bytes | None = None
    version: int = SUBSCRIPTION_VERSION


@dataclass(frozen=True)
class Assignment:
    """The partitions the leader gave one member."""

    partitions: tuple[tuple[str, int], ...] = field(default=())
    user_data: bytes | None = None


def _grouped(partitions: tuple[tuple[str, int], ...]) -> list[TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [TopicPartitions(topic, numbers) for topic, numbers in by_topic.items()]


def _flat(grouped: list[TopicPartitions]) -> tuple[tuple[str, int], ...]:
    return tuple((g.topic, p) for g in grouped for p in g.partitions)


def _encode(version: int, cls: type[Struct], body: Struct) -> bytes:
    w = Writer()
    encoder_for(cls, version, False)(w, body)
    return _VERSION.pack(version) + b"".join(bytes(part) for part in w.all_parts())


def _decode(data: bytes, what: str, cls: type[Struct], max_version: int) -> tuple[int, Struct]:
    view = memoryview(data)
    if len(view) < _VERSION.size:
        raise ProtocolError(f"consumer protocol {what}: {len(view)} bytes, too short for its version")
    (version,) = _VERSION.unpack_from(view, 0)
    if version < 0:
        raise ProtocolError(f"consumer protocol {what}: version {version} is negative")
    body, _end = decoder_for(cls, min(version, max_version), False)(view, _VERSION.size)
    return version, body


def encode_subscription(subscription: Subscription) -> bytes:
    return _encode(subscription.version, _SubscriptionWire, _SubscriptionWire(
        topics=list(subscription.topics), user_data=subscription.user_data,
        owned_partitions=_grouped(subscription.owned_partitions), generation_id=subscription.generation_id,
    ))


def decode_subscription(data: bytes) -> Subscription:
    version, body = _decode(data, "subscription", _SubscriptionWire, _SUBSCRIPTION_MAX_VERSION)
    assert isinstance(body, _SubscriptionWire)
    return Subscription(tuple(body.topics), _flat(body.owned_partitions), body.generation_id, body.user_data,
                        version)


def encode_assignment(assignment: Assignment) -> bytes:
    return _encode(ASSIGNMENT_VERSION, _AssignmentWire, _AssignmentWire(
        assigned_partitions=_grouped(assignment.partitions), user_data=assignment.user_data))


def decode_assignment(data: bytes) -> Assignment:
    """An empty byte string is an empty assignment (what a coordinator answers a member the leader left
    out)."""
    if not data:
        return Assignment()
    _version, body = _decode(data, "assignment", _AssignmentWire, _ASSIGNMENT_MAX_VERSION)
    assert isinstance(body, _AssignmentWire)
    return Assignment(_flat(body.assigned_partitions), body.user_data)
