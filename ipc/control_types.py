"""What the supervisor's control replies become for a client: the topics, partitions and followers of a
``metadata`` reply, and a ring ``attach`` gives (``ipc.control_protocol`` is the protocol, ``ipc.control`` the
client that reads them; ``ipc.control_server`` the side that writes them).  Each is read from the reply's JSON
by its ``from_json``; a topic that cannot be read is listed as failed, the others stand (:func:`topic_info`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipc.kafka.errors import ErrorCode
from ipc.ring import RingNames, RingProducer
from ipc.wakeup import DEFAULT_SPIN_ITERATIONS

__all__ = ["Attachment", "ClusterMetadata", "FollowerInfo", "PartitionInfo", "TopicInfo", "attachment",
           "topic_info"]


def topic_info(raw: Any) -> TopicInfo:
    """One topic of a ``metadata`` reply; one that cannot be read is listed as failed, the others stand."""
    try:
        return TopicInfo.from_json(raw)
    except (KeyError, TypeError, ValueError) as exc:
        name = str(raw.get("name", "?")) if isinstance(raw, Mapping) else "?"
        return TopicInfo.failed(name, "", ErrorCode.UNKNOWN_SERVER_ERROR.name,
                                f"topic {name!r}: unreadable description in the metadata reply: {exc!r}")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: its state page (read offsets there, lock-free), its log dir and its writer."""

    topic: str
    partition: int
    state_page: str  # shared-memory name: ipc.state_page.StatePage.attach(state_page)
    doorbell: str  # the writer's semaphore (producers ring it; RingNames carry it too)
    directory: str  # the partition's log directory
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    writer_pid: int
    writer_uss_bytes: int  # unique memory of the writer process (Private_* of smaps_rollup); 0 if unknown
    writer_restarts: int
    leader: int = 0  # the node leading it (this appliance's node.id)
    isr: tuple[int, ...] = ()  # in-sync replicas, leader first (a partition of factor 1: the leader)
    replicas: tuple[int, ...] = ()  # its replicas in the order assigned; (): the topic's ``replicas``
    committed_high_watermark: int = -1  # replicated: the ISR's HW (acks=all); -1 not replicated
    followers: tuple[FollowerInfo, ...] = ()  # replicated: what the leader knows of each follower
    offline: str = ""  # why the partition cannot be served (damaged log, ...); empty: online

    @classmethod
    def from_json(cls, topic: str, raw: Mapping[str, Any]) -> PartitionInfo:
        return cls(
            topic=topic,
            partition=int(raw["partition"]),
            state_page=str(raw["state_page"]),
            doorbell=str(raw["doorbell"]),
            directory=str(raw["directory"]),
            leader_epoch=int(raw["leader_epoch"]),
            log_start_offset=int(raw["log_start_offset"]),
            log_end_offset=int(raw["log_end_offset"]),
            high_watermark=int(raw["high_watermark"]),
            writer_pid=int(raw["writer_pid"]),
            writer_uss_bytes=int(raw.get("writer_uss_bytes", 0)),
            writer_restarts=int(raw.get("writer_restarts", 0)),
            leader=int(raw.get("leader", 0)),
            isr=tuple(int(r) for r in raw.get("isr", ())),
            replicas=tuple(int(r) for r in raw.get("replicas", ())),
            committed_high_watermark=int(raw.get("committed_high_watermark", -1)),
            followers=tuple(FollowerInfo.from_json(f) for f in raw.get("followers", ())),
            offline=str(raw.get("offline", "")),
        )


@dataclass(frozen=True, slots=True)
class FollowerInfo:
    """One follower of a replicated partition, as its leader sees it (from the follower's fetches)."""

    replica_id: int
    in_isr: bool
    log_end_offset: int  # -1: it has not fetched from this leader yet
    lag_records: int  # the leader's log end offset minus the follower's (-1 unknown)
    lag_ms: int  # since it was last caught up (0: caught up now; -1 never)
    last_fetch_ms_ago: int  # -1 never

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FollowerInfo:
        return cls(int(raw["replica_id"]), bool(raw["in_isr"]), int(raw["log_end_offset"]),
                   int(raw["lag_records"]), int(raw["lag_ms"]), int(raw["last_fetch_ms_ago"]))


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    replication_factor: int
    configs: Mapping[str, Any]  # overrides given at creation
    partitions: tuple[PartitionInfo, ...]
    max_message_bytes: int
    replicas: tuple[int, ...] = ()  # node ids holding a copy, leader first (factor 1: the leader alone)
    min_insync_replicas: int = 1
    cleanup_policy: tuple[str, ...] = ("delete",)  # the effective cleanup.policy: "compact" needs keys
    # a topic the supervisor could not describe: the Kafka error name and why (no partitions then)
    error: str = ""
    message: str = ""

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @classmethod
    def failed(cls, name: str, topic_id: str, error: str, message: str) -> TopicInfo:
        """A topic listed with an error instead of its description."""
        return cls(name=name, topic_id=topic_id, replication_factor=0, configs={}, partitions=(),
                   max_message_bytes=0, error=error, message=message)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TopicInfo:
        name = str(raw["name"])
        if raw.get("error"):
            topic_id, error = str(raw.get("topic_id", "")), str(raw["error"])
            return cls.failed(name, topic_id, error, str(raw.get("message", "")))
        return cls(
            name=name,
            topic_id=str(raw["topic_id"]),
            replication_factor=int(raw["replication_factor"]),
            configs=dict(raw.get("configs", {})),
            partitions=tuple(PartitionInfo.from_json(name, p) for p in raw["partitions"]),
            max_message_bytes=int(raw["max_message_bytes"]),
            replicas=tuple(int(r) for r in raw.get("replicas", ())),
            min_insync_replicas=int(raw.get("min_insync_replicas", 1)),
            cleanup_policy=tuple(str(p) for p in raw.get("cleanup_policy", ("delete",))),
        )


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    instance_id: str  # appliance.instance.id
    shm_prefix: str  # every shared-memory name of this appliance starts with it
    node_id: int
    topics: Mapping[str, TopicInfo]


@dataclass(frozen=True, slots=True)
class Attachment:
    """A ring the supervisor created for this client and handed to the partition's writer.

    Open it with :meth:`open` (or ``RingProducer.attach(attachment.names, ...)``); publish RecordBatch v2
    frames; read acks (base offset, or minus a Kafka error code).  Detach with ``ControlClient.detach`` or by
    closing the client connection.
    """

    topic: str
    partition: int
    session: int  # this ring's number among the supervisor's rings
    names: RingNames
    state_page: str
    ring_bytes: int
    ack_slots: int
    max_message_bytes: int  # the topic's max.message.bytes: larger batches are refused (MESSAGE_TOO_LARGE)
    ring_bytes_max: int = 0  # the largest ring the supervisor gives (appliance.ring.bytes); 0: ring_bytes

    @property
    def ring(self) -> str:
        return self.names.ring

    def open(
        self,
        *,
        max_block_ms: int = 60_000,
        track_acks: bool = True,
        spin_iterations: int = DEFAULT_SPIN_ITERATIONS,
    ) -> RingProducer:
        return RingProducer.attach(
            self.names, max_block_ms=max_block_ms, track_acks=track_acks, spin_iterations=spin_iterations
        )


def attachment(topic: str, partition: int, reply: Mapping[str, Any]) -> Attachment:
    """The ring an ``attach`` reply (or one ``attach_many`` result) describes."""
    return Attachment(
        topic=topic,
        partition=partition,
        session=int(reply["session"]),
        names=RingNames(ring=str(reply["ring"]), space=str(reply["space"]), doorbell=str(reply["doorbell"])),
        state_page=str(reply["state_page"]),
        ring_bytes=int(reply["ring_bytes"]),
        ack_slots=int(reply["ack_slots"]),
        max_message_bytes=int(reply["max_message_bytes"]),
        ring_bytes_max=int(reply.get("ring_bytes_max", reply["ring_bytes"])),
    )
