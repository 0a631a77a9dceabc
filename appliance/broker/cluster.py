"""What the broker asks of whoever owns cluster metadata (the supervisor), as one small interface.

The broker never decides which topics exist or which producer ids are free: the supervisor does, and the
broker asks it over the control socket.  :class:`Cluster` is the whole of what the broker needs; the broker
is written against it, and :class:`ControlCluster` implements it with the supervisor's ``ControlClient``.
Keeping the seam this narrow is what lets the replication issue put a different owner behind it (a
metadata quorum kept in ZooKeeper) without touching the request handlers.

Errors: each call raises :class:`ClusterError` carrying the Kafka error code to answer with, and a message
for the client (``error_message`` fields) and for the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from appliance.broker.partitions import TopicMeta
from ipc.kafka import ErrorCode
from storage.errors import ApplianceError

if TYPE_CHECKING:
    from ipc.control import Attachment

__all__ = ["Cluster", "ClusterError"]


class ClusterError(ApplianceError):
    """The metadata owner refused or failed an operation.  ``code`` is the Kafka error code to answer."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


class Cluster(Protocol):
    """The metadata owner, as the broker sees it."""

    # Numbers the broker's sessions with the owner; when it changes, the rings attached earlier are gone.
    session: int

    def topics(self) -> Mapping[str, TopicMeta]:
        """Every topic now, by name."""
        ...

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        replication_factor: int | None,
        configs: Mapping[str, str],
        *,
        timeout_ms: int | None = None,
    ) -> TopicMeta:
        """Create a topic (None: the broker defaults) and return it once its partitions are being served,
        waiting up to ``timeout_ms`` (CreateTopics' own; REQUEST_TIMED_OUT after it, the creation goes on).
        ClusterError: TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS,
        INVALID_REPLICATION_FACTOR, INVALID_CONFIG, ..."""
        ...

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        """Delete a topic.  ClusterError: UNKNOWN_TOPIC_OR_PARTITION, TOPIC_DELETION_DISABLED, ..."""
        ...

    def init_producer_id(self) -> tuple[int, int]:
        """A fresh (producer id, producer epoch) for an idempotent producer."""
        ...

    def attach(self, topic: str, partition: int, *, ring_bytes: int | None = None) -> Attachment:
        """A new ring into the partition's writer, for the broker's Produce requests (``ring_bytes``: the
        capacity wanted, to grow a partition's ring; default ``appliance.ring.initial.bytes``)."""
        ...

    def attach_many(self, partitions: Sequence[tuple[str, int]]) -> list[Attachment | ClusterError]:
        """Rings to many partitions in one call: per partition its Attachment or error."""
        ...

    def detach(self, ring: str) -> None:
        """Have the writer drain ``ring``, then unlink it."""
        ...

    def close(self) -> None: ...
