"""The topics a consumer group's members subscribe to, read from their opaque protocol metadata.

The coordinator never interprets a member's metadata to run the group; it reads it in one case only, as
Kafka does: OffsetDelete refuses to delete the offsets of a topic the (non-empty) group still consumes
(GROUP_SUBSCRIBED_TO_TOPIC).  For protocol type ``consumer`` every assignor's metadata begins with
Kafka's ``ConsumerProtocolSubscription``::

    version int16, topics [string], ...   (user data, owned partitions, rack: not read here)

When any member's metadata cannot be read, or no protocol is chosen yet, the subscribed topics are unknown
(None) and every topic counts as subscribed, Kafka's conservative answer (``isSubscribedToTopic``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ipc.kafka.primitives import read_array_length, read_int16, read_string
from storage.errors import ProtocolError

__all__ = ["CONSUMER_PROTOCOL_TYPE", "subscribed_topics"]

CONSUMER_PROTOCOL_TYPE = "consumer"


def _topics_of(metadata: bytes) -> list[str]:
    mv = memoryview(metadata)
    version, pos = read_int16(mv, 0)
    if version < 0:
        raise ProtocolError(f"consumer subscription version {version}")
    count, pos = read_array_length(mv, pos, 2, nullable=False)
    topics = []
    for _ in range(count):
        topic, pos = read_string(mv, pos)
        topics.append(topic)
    return topics


def subscribed_topics(metadatas: Iterable[bytes]) -> set[str] | None:
    """The union of a consumer group's members' subscribed topics; None when unknown (a member's metadata
    that does not parse)."""
    topics: set[str] = set()
    try:
        for metadata in metadatas:
            topics.update(_topics_of(metadata))
    except ProtocolError:
        return None
    return topics
