"""Committed offsets per (group, topic, partition): the coordinator's picture of them, in memory.

The durable copy is the compacted internal topic ``__consumer_offsets`` (``appliance.broker.offsets_topic``
writes it and loads it back at start-up): a commit reaches this store only once its records are in that log
(:meth:`OffsetStore.put` after the append is acknowledged), so what the store holds survives a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipc.kafka import ErrorCode

__all__ = ["CommittedOffset", "OffsetStore"]

# Kafka's offset.metadata.max.bytes: a commit whose metadata string is longer is OFFSET_METADATA_TOO_LARGE.
OFFSET_METADATA_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One partition's commit.  ``expire_timestamp_ms``: when it expires, as an OffsetCommit v2-v4 with a
    ``retention_time_ms`` asks (the broker's time at the commit plus it); -1: none asked, the offset expires
    by ``offsets.retention.minutes`` (``GroupCoordinator.plan_expiry``)."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int = -1


@dataclass(slots=True)
class OffsetStore:
    """group -> topic -> partition -> the last commit."""

    commits: dict[str, dict[str, dict[int, CommittedOffset]]] = field(default_factory=dict)

    @staticmethod
    def check(topic: str, partition: int, metadata: str | None) -> ErrorCode:
        """Whether one partition's commit may be stored: NONE, or the error for that partition."""
        if len((metadata or "").encode()) > OFFSET_METADATA_MAX_BYTES:
            return ErrorCode.OFFSET_METADATA_TOO_LARGE
        if partition < 0 or not topic:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NONE

    def put(self, group_id: str, topic: str, partition: int, entry: CommittedOffset | None) -> None:
        """Keep ``entry`` as the commit of (group, topic, partition); None (a tombstone) forgets it."""
        if entry is not None:
            self.commits.setdefault(group_id, {}).setdefault(topic, {})[partition] = entry
            return
        topics = self.commits.get(group_id, {})
        topics.get(topic, {}).pop(partition, None)
        if topic in topics and not topics[topic]:
            del topics[topic]
        if group_id in self.commits and not topics:
            del self.commits[group_id]

    def commit(self, group_id: str, topic: str, partition: int, offset: int, leader_epoch: int,
               metadata: str | None, now_ms: int) -> ErrorCode:
        """Check and store one partition's commit; the error for that partition (NONE when stored)."""
        error = self.check(topic, partition, metadata)
        if error == ErrorCode.NONE:
            entry = CommittedOffset(offset, leader_epoch, metadata or "", now_ms)
            self.put(group_id, topic, partition, entry)
        return error

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.commits.get(group_id, {}).get(topic, {}).get(partition)

    def topics_of(self, group_id: str) -> dict[str, list[int]]:
        return {t: sorted(parts) for t, parts in self.commits.get(group_id, {}).items()}

    def has_group(self, group_id: str) -> bool:
        return group_id in self.commits

    def groups(self) -> list[str]:
        return list(self.commits)
