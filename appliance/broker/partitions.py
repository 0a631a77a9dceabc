"""The broker's picture of the topics and, for each partition it serves, a read handle on the log.

Theory of operation
-------------------
The supervisor owns cluster metadata (topics, partition counts, replication); the broker keeps a copy, a
:class:`PartitionTable`, refreshed by :meth:`PartitionTable.update` whenever the broker asks the
supervisor for fresh metadata (on Metadata requests, after CreateTopics/DeleteTopics, and when a request
names a topic the copy does not know).  It is refreshed topic by topic: a topic the supervisor lists with
an error (it could not describe it) keeps the picture the broker had of it, with the error attached
(``TopicMeta.error``), so its open handles stay and the other topics refresh as usual.

For each partition a request touches, the table opens a :class:`PartitionHandle` lazily and keeps it:

* a :class:`storage.log_reader.LogReader` on the partition directory ``<log dir>/<topic>-<partition>``,
  found in whichever of ``log.dirs`` holds it -- read-only, no lock, safe while the writer appends;
* the partition's :class:`ipc.state_page.StatePage`, mapped read-only in spirit: the broker never writes it.
  It gives the log end offset (the writer publishes it after the bytes are in the file) and the high
  watermark (the replica-state owner publishes it; with replication factor 1 the writer publishes HW = LEO).

Reads are bounded by what the state page says, never by what the file holds: bytes past the high watermark
may be on disk already and are still invisible to consumers.

A partition the supervisor reports *offline* (``TopicMeta.offline``: its log is damaged and was not opened)
gets no handle: every request for it is answered KAFKA_STORAGE_ERROR, as Kafka answers for a partition on
an offline log directory.

A handle that cannot be opened -- no directory yet, no state page yet (the supervisor is still creating the
partition, or this appliance is not its leader) -- is not kept; the caller answers NOT_LEADER_OR_FOLLOWER
(retriable: the client refreshes metadata and tries again) and the next request tries to open it again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from appliance.coordinator.offset_records import OFFSETS_TOPIC
from ipc.kafka import ErrorCode
from ipc.shm import ShmNames
from ipc.state_page import StatePage
from storage.log_config import LogConfig
from storage.log_reader import LogReader

__all__ = ["INTERNAL_TOPICS", "PartitionHandle", "PartitionTable", "TopicMeta", "listed_replicas"]

log = logging.getLogger("appliance.broker")

# How long a read waits for a clean's swap to finish before it gives up (SwapInProgressError): the broker's
# one loop serves every connection, so it waits briefly; Fetch then answers the partition empty (no error)
# and the client fetches again (appliance.broker.fetch_session).
SWAP_WAIT_S = 0.2

# the appliance's own topics: Metadata marks them internal and clients may not produce to them (Kafka's
# Topic.isInternal is by name too)
INTERNAL_TOPICS: frozenset[str] = frozenset({OFFSETS_TOPIC})


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """One topic as the supervisor describes it."""

    name: str
    partitions: int
    replication_factor: int = 1
    topic_id: str = ""  # changes when a topic is deleted and created again under the same name
    max_message_bytes: int = 1_048_588  # the topic's max.message.bytes: larger batches are refused
    # partition -> its log directory / its state page's shared-memory name; absent: looked for in log.dirs /
    # named by ipc.shm.ShmNames
    directories: Mapping[int, str] = field(default_factory=dict)
    state_pages: Mapping[int, str] = field(default_factory=dict)
    # partition -> replica node ids in the order assigned (the first is Kafka's preferred leader); a
    # partition absent here is held by this node alone
    replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # partition -> the node leading it; absent: the first of its replicas
    leaders: Mapping[int, int] = field(default_factory=dict)
    # partition -> in-sync replica node ids; absent: equal to replicas (the broker's replication layer knows
    # better for the partitions it leads: appliance.broker.replication)
    isr: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    min_insync_replicas: int = 1  # the topic's min.insync.replicas
    cleanup_policy: tuple[str, ...] = ("delete",)  # the topic's effective cleanup.policy
    configs: Mapping[str, object] = field(default_factory=dict)  # the topic's own settings (overrides)
    # partition -> why it is offline (a damaged log the supervisor would not open); absent: online
    offline: Mapping[int, str] = field(default_factory=dict)
    # the supervisor could not describe the topic: the Kafka error code for it and why (0: none)
    error: int = 0
    error_message: str = ""


def listed_replicas(table: PartitionTable) -> Iterator[tuple[int, ...]]:
    """The replicas of every partition of every topic the table knows (the nodes that exist)."""
    for meta in table.topics.values():
        yield from meta.replicas.values()


class PartitionHandle:
    """Read access to one partition: its log (read-only) and its state page."""

    __slots__ = ("closed", "directory", "name", "page", "partition", "reader", "topic")

    def __init__(
        self, topic: str, partition: int, directory: str, reader: LogReader, page: StatePage
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.directory = directory
        self.reader = reader
        self.page = page
        self.closed = False

    @property
    def high_watermark(self) -> int:
        return self.page.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.page.log_end_offset

    @property
    def log_start_offset(self) -> int:
        """The first offset a reader may ask for: the later of what retention published and the disk."""
        return max(self.page.log_start_offset, self.reader.log_start_offset)

    def leader_epoch(self) -> int:
        """The leader epoch clients see (0 until a leadership owner publishes one)."""
        epoch, _ = self.page.leader_epoch()
        return max(epoch, 0)

    def check_epoch(self, client_epoch: int) -> ErrorCode:
        """FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH if a client's ``current_leader_epoch`` (-1: none given)
        is older / newer than ours, else NONE (Kafka's rule for Fetch, ListOffsets, OffsetsForLeaderEpoch)."""
        if client_epoch < 0:
            return ErrorCode.NONE
        epoch = self.leader_epoch()
        if client_epoch < epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if client_epoch > epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    def close(self) -> None:
        self.closed = True
        self.reader.close()
        self.page.close()


class PartitionTable:
    """Topic metadata and lazily opened partition handles.  One per broker process; not thread-safe."""

    def __init__(
        self,
        log_dirs: tuple[str, ...],
        names: ShmNames,
        node_id: int,
        log_configs: Callable[[str], LogConfig] | None = None,
    ) -> None:
        self.log_dirs = log_dirs
        self.names = names
        self.node_id = node_id
        self._log_configs = log_configs
        self.topics: dict[str, TopicMeta] = {}
        self._handles: dict[tuple[str, int], PartitionHandle] = {}

    # -- metadata -----------------------------------------------------------------------------------------

    def update(self, topics: Mapping[str, TopicMeta]) -> None:
        """Take the new topic list, topic by topic (module docstring); handles of topics that are gone (or
        were re-created), and of partitions now led by another node or gone offline, are closed: the next
        request for such a partition is answered as :meth:`lookup` finds it."""
        merged = {}
        for name, fresh in topics.items():
            known = self.topics.get(name)
            if fresh.error and known is not None and known.topic_id == fresh.topic_id:
                fresh = dataclasses.replace(known, error=fresh.error, error_message=fresh.error_message)
            merged[name] = fresh
        topics = merged
        for key, handle in list(self._handles.items()):
            topic, partition = key
            new = topics.get(topic)
            old = self.topics.get(topic)
            if (
                new is None
                or partition >= new.partitions
                or (old is not None and old.topic_id != new.topic_id)
                or partition in new.offline
                or self.leader(new, partition) != self.node_id
            ):
                handle.close()
                del self._handles[key]
        self.topics = dict(topics)

    def replicas(self, topic: TopicMeta, partition: int) -> tuple[int, ...]:
        return topic.replicas.get(partition, (self.node_id,))

    def isr(self, topic: TopicMeta, partition: int) -> tuple[int, ...]:
        return topic.isr.get(partition, self.replicas(topic, partition))

    def leader(self, topic: TopicMeta, partition: int) -> int:
        leader = topic.leaders.get(partition)
        return self.replicas(topic, partition)[0] if leader is None else leader

    def offline_reason(self, topic: str, partition: int) -> str | None:
        """Why the partition is offline (the supervisor did not open its damaged log), or None."""
        meta = self.topics.get(topic)
        return None if meta is None else meta.offline.get(partition)

    # -- handles ------------------------------------------------------------------------------------------

    def lookup(self, topic: str, partition: int) -> tuple[PartitionHandle | None, ErrorCode]:
        """The handle of a partition this broker leads, or None and the error code Kafka answers with:
        UNKNOWN_TOPIC_OR_PARTITION (no such topic or partition), NOT_LEADER_OR_FOLLOWER (led elsewhere, or
        not ready here yet), KAFKA_STORAGE_ERROR (offline: its log is damaged, :meth:`offline_reason`)."""
        handle = self._handles.get((topic, partition))
        if handle is not None:
            return handle, ErrorCode.NONE
        meta = self.topics.get(topic)
        if meta is None or not 0 <= partition < meta.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if partition in meta.offline:
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        if self.leader(meta, partition) != self.node_id:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        handle = self._open(meta, partition)
        if handle is None:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        self._handles[(topic, partition)] = handle
        return handle, ErrorCode.NONE

    def _open(self, meta: TopicMeta, partition: int) -> PartitionHandle | None:
        topic = meta.name
        directory = meta.directories.get(partition) or self._find_directory(topic, partition)
        if directory is None or not os.path.isdir(directory):
            return None
        try:
            page = StatePage.attach(
                meta.state_pages.get(partition) or self.names.state_page(topic, partition)
            )
        except Exception as e:  # no page yet (posix_ipc.ExistentialError), or not one
            log.warning("partition %s-%d: state page not available (answering NOT_LEADER_OR_FOLLOWER): %s",
                        topic, partition, e)
            return None
        try:
            config = self._log_configs(topic) if self._log_configs is not None else LogConfig()
            reader = LogReader(directory, config, topic_partition=(topic, partition),
                               swap_wait_s=SWAP_WAIT_S)
        except Exception as e:
            page.close()
            log.warning("partition %s-%d: cannot read %s: %s", topic, partition, directory, e)
            return None
        return PartitionHandle(topic, partition, directory, reader, page)

    def _find_directory(self, topic: str, partition: int) -> str | None:
        leaf = f"{topic}-{partition}"
        for log_dir in self.log_dirs:
            path = os.path.join(log_dir, leaf)
            if os.path.isdir(path):
                return path
        return None

    def handles(self) -> Iterator[PartitionHandle]:
        return iter(list(self._handles.values()))

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
