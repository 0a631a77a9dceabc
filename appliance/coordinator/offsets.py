"""Committed offsets per (group, topic, partition), kept in the broker's memory.

**Not durable.**  These commits live in the broker process only: a broker restart (or an ``appliance serve``
restart) forgets them, and a consumer group then starts from ``auto.offset.reset``.  Kafka keeps them in the
compacted internal topic ``__consumer_offsets``; doing the same here is the next step of issue 19 (see
docs/protocol.md, "Consumer groups").  Until then an acknowledged commit survives only as long as the
broker process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipc.kafka import ErrorCode

__all__ = ["CommittedOffset", "OffsetStore"]

# Kafka's offset.metadata.max.bytes: a commit whose metadata string is longer is OFFSET_METADATA_TOO_LARGE.
OFFSET_METADATA_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(slots=True)
class OffsetStore:
    """group -> topic -> partition -> the last commit."""

    commits: dict[str, dict[str, dict[int, CommittedOffset]]] = field(default_factory=dict)

    def commit(self, group_id: str, topic: str, partition: int, offset: int, leader_epoch: int,
               metadata: str | None, now_ms: int) -> ErrorCode:
        """Store one partition's commit; the error for that partition (NONE when stored)."""
        text = metadata or ""
        if len(text.encode()) > OFFSET_METADATA_MAX_BYTES:
            return ErrorCode.OFFSET_METADATA_TOO_LARGE
        if partition < 0 or not topic:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        entry = CommittedOffset(offset, leader_epoch, text, now_ms)
        self.commits.setdefault(group_id, {}).setdefault(topic, {})[partition] = entry
        return ErrorCode.NONE

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.commits.get(group_id, {}).get(topic, {}).get(partition)

    def topics_of(self, group_id: str) -> dict[str, list[int]]:
        return {t: sorted(parts) for t, parts in self.commits.get(group_id, {}).items()}

    def has_group(self, group_id: str) -> bool:
        return group_id in self.commits

    def groups(self) -> list[str]:
        return list(self.commits)
