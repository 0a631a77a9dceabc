"""What the broker asks of whoever owns cluster metadata (the supervisor), as one small interface.

The broker never decides which topics exist or which producer ids are free: the supervisor does, and the
broker asks it over the control socket.  :class:`Cluster` is the whole of what the broker needs; the broker
is written against it, and :class:`ControlCluster` implements it with the supervisor's ``ControlClient``.
Keeping the seam this narrow is what lets the replication issue put a different owner behind it (a
metadata quorum kept in ZooKeeper) without touching the request handlers.

Errors: each call raises :class:`ClusterError` carrying the Kafka error code to answer with, and a message
for the client (``error_message`` fields) and for the log.

**Changes answered later.**  Creating a topic of a thousand partitions takes the owner seconds, and the
broker serves every other client meanwhile: a :class:`TopicChange` is *submitted* (:meth:`Cluster.submit`)
and finished when the owner's answer arrives; ring attaches and detaches are sent the same way
(:meth:`Cluster.attach_later`, :meth:`Cluster.detach_later`).  The broker puts :meth:`Cluster.selectables`
in its selector (readable: answers arrived) and calls :meth:`Cluster.poll` when one is readable or at
:meth:`Cluster.next_timer_s`; ``poll`` finishes the changes answered and hands attach answers to their
callbacks.  A change the broker stops waiting
for (its request's ``timeout_ms`` ran out) is withdrawn (:meth:`Cluster.withdraw`): its late answer is
dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from appliance.broker.partitions import TopicMeta
from ipc.kafka import ErrorCode
from storage.errors import ApplianceError

if TYPE_CHECKING:
    from ipc.control import Attachment

__all__ = ["Cluster", "ClusterError", "TopicChange"]


class ClusterError(ApplianceError):
    """The metadata owner refused or failed an operation.  ``code`` is the Kafka error code to answer."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class TopicChange:
    """A topic creation or deletion submitted to the metadata owner, finished when it answers.

    ``timeout_ms`` is the Kafka request's own: for a creation, ``<= 0`` means "answer once it is recorded"
    (Kafka's "do not wait").  Once :attr:`done`, :attr:`error` is None (it happened) or why not."""

    op: Literal["create", "delete"]
    name: str
    timeout_ms: int
    partitions: int | None = None  # create: None is num.partitions
    replication_factor: int | None = None  # create: None is default.replication.factor
    configs: Mapping[str, object] = field(default_factory=dict)  # create: the topic's overrides
    replicas: tuple[int, ...] | None = None  # create: the replicas of every partition; None: assigned
    # create: an explicit assignment, each partition's replicas (appliance.config.replica_assignment)
    assignments: tuple[tuple[int, ...], ...] | None = None
    internal: bool = False  # create: the appliance's own topic (``__consumer_offsets``)
    done: bool = False
    error: ClusterError | None = None
    topic: TopicMeta | None = None  # a creation done: the topic as recorded, when the answer describes it

    def finish(self, error: ClusterError | None = None) -> None:
        """Mark it answered: done, or refused with ``error``."""
        self.done, self.error = True, error


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
        internal: bool = False,
    ) -> TopicMeta:
        """Create a topic (None: the broker defaults) and return it once its partitions are being served,
        waiting up to ``timeout_ms`` (CreateTopics' own; REQUEST_TIMED_OUT after it, the creation goes on).
        ClusterError: TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS,
        INVALID_REPLICATION_FACTOR, INVALID_CONFIG, ...  ``internal``: the appliance's own topic
        (``__consumer_offsets``), whose name may begin with ``__``."""
        ...

    def alter_topic_configs(self, name: str, set_configs: Mapping[str, str], delete: Sequence[str], *,
                            replace: bool, validate_only: bool) -> None:  # fmt: skip
        """Change a topic's settings: set some, reset ``delete`` (``replace``: reset every other too); the
        whole set validated first.  ClusterError: INVALID_CONFIG naming the key (nothing changed),
        UNKNOWN_TOPIC_OR_PARTITION, ..."""
        ...

    def create_partitions(self, name: str, count: int, *, validate_only: bool, timeout_ms: int,
                          assignments: tuple[tuple[int, ...], ...] | None = None) -> None:  # fmt: skip
        """Grow a topic to ``count`` partitions (``assignments``: each new one's replicas), returning once
        they are served.  ClusterError:
        INVALID_PARTITIONS, UNKNOWN_TOPIC_OR_PARTITION, REQUEST_TIMED_OUT (it goes on), ..."""
        ...

    def delete_records(self, topic: str, partition: int, offset: int, *, timeout_ms: int) -> int:
        """Move the partition's log start offset to ``offset``; the log start offset after it.
        ClusterError: OFFSET_OUT_OF_RANGE (above the high watermark), KAFKA_STORAGE_ERROR, ..."""
        ...

    def init_producer_id(self) -> tuple[int, int]:
        """A fresh (producer id, producer epoch) for an idempotent producer."""
        ...

    def attach(self, topic: str, partition: int, *, ring_bytes: int | None = None) -> Attachment:
        """A new ring into the partition's writer, for the broker's Produce requests (``ring_bytes``: the
        capacity wanted, to grow a partition's ring; default ``appliance.ring.initial.bytes``)."""
        ...

    def attach_many(
        self, partitions: Sequence[tuple[str, int]], *, ahead: Sequence[tuple[str, int]] = ()
    ) -> list[Attachment | ClusterError]:
        """Rings to many partitions in one call: per partition its Attachment or error.  Those also in
        ``ahead`` are attached ahead of need: their writers start at the first batch published."""
        ...

    def detach(self, ring: str) -> None:
        """Have the writer drain ``ring``, then unlink it."""
        ...

    def detach_many(self, rings: Sequence[str]) -> None:
        """:meth:`detach` for each of ``rings`` in one call."""
        ...

    def submit(self, change: TopicChange) -> None:
        """Send ``change`` to the owner without waiting; :meth:`poll` finishes it (or it is finished at once:
        refused, or the owner cannot be reached)."""
        ...

    def withdraw(self, change: TopicChange) -> None:
        """Stop waiting for ``change`` (its request timed out): its answer, when it comes, is dropped."""
        ...

    def attach_later(self, partitions: Sequence[tuple[str, int]], *, ahead: Sequence[tuple[str, int]] = (),
                     on_reply: Callable[[list[Attachment | ClusterError]], None]) -> None:  # fmt: skip
        """:meth:`attach_many` without waiting: ``on_reply`` gets per partition its Attachment or error, from
        :meth:`poll` (or at once, all errors, if the owner cannot be reached)."""
        ...

    def topics_later(self, on_reply: Callable[[Mapping[str, TopicMeta] | ApplianceError], None]) -> None:
        """:meth:`topics` without waiting: ``on_reply`` gets the topic list or the error, from :meth:`poll`
        (or at once, if the owner cannot be reached)."""
        ...

    def detach_later(self, rings: Sequence[str]) -> None:
        """:meth:`detach_many` without waiting for the answer."""
        ...

    def selectables(self) -> tuple[Any, ...]:
        """What to put in the broker's selector: readable when answers to submitted changes or to calls made
        without waiting arrive (empty: nothing now).  New objects after each reconnection: the broker swaps
        its registrations."""
        ...

    def poll(self, now_s: float) -> None:
        """Take the answers that arrived (never blocks) and run what is due (reopening a lost connection)."""
        ...

    def next_timer_s(self) -> float | None:
        """When (``time.monotonic()`` seconds) :meth:`poll` is due though nothing is readable; None: never."""
        ...

    def close(self) -> None: ...
