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

from ipc.kafka.consumer_protocol import decode_subscription
from storage.errors import ProtocolError

__all__ = ["CONSUMER_PROTOCOL_TYPE", "subscribed_topics"]

CONSUMER_PROTOCOL_TYPE = "consumer"


def subscribed_topics(metadatas: Iterable[bytes]) -> set[str] | None:
    """The union of a consumer group's members' subscribed topics; None when unknown (a member's metadata
    that does not parse)."""
    topics: set[str] = set()
    try:
        for metadata in metadatas:
            topics.update(decode_subscription(metadata).topics)
    except ProtocolError:
        return None
    return topics
