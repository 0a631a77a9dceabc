"""The driver's side of a read: which partitions, which offsets, which ranges become which Spark tasks.

Everything here runs on the driver while Spark plans a query (``collect()`` of a batch read, each trigger of
a stream), so a mistake -- an unknown topic, an offset past the end of a partition, records lost to
retention -- is raised there, with a message naming the option, the partition and both offsets, instead of
failing a task on an executor.

:class:`ClusterView` asks the broker over the Kafka protocol (Metadata, ListOffsets, one small Fetch to
estimate record sizes) through ``appliance.client.remote_fetch.RemoteCluster``.  :func:`split_ranges` turns
per-partition offset ranges into :class:`OffsetRange` tasks: ranges longer than ``maxRecordsPerPartition``
are cut into equal pieces, then the longest pieces are halved until there are ``minPartitions`` tasks, so a
large partition is read by several executors at once.  The result depends only on its input, so a
micro-batch planned again after a restart gets the very same tasks.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from appliance.client.consumer import Consumer
from appliance.client.remote_fetch import FetchSettings, RemoteCluster
from appliance.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions
from ipc.kafka import MetadataRequest, MetadataResponse
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.errors import ConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError

__all__ = ["ClusterView", "OffsetRange", "TopicPartitionKey", "plan_batch", "split_ranges"]

TopicPartitionKey = tuple[str, int]
_SAMPLE_RECORDS = 2000


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark task: records ``from_offset`` (inclusive) to ``until_offset`` (exclusive) of one partition,
    and what the executor needs to fetch them (it has nothing else: the task travels pickled)."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    bootstrap_servers: str
    fail_on_data_loss: bool = True

    @property
    def record_count(self) -> int:
        return self.until_offset - self.from_offset


class ClusterView:
    """Topics, partitions and offsets as the broker sees them now (driver side).  Not thread-safe."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._cluster = RemoteCluster(bootstrap_servers, FetchSettings(client_id="appliance-spark-driver"))

    def all_topics(self) -> dict[str, int]:
        """Every topic (internal ones excepted) -> its partition count."""
        errors = []
        for host, port in parse_bootstrap_servers(self.bootstrap_servers):
            try:
                with KafkaConnection(host, port, client_id="appliance-spark-driver") as connection:
                    response = connection.request(
                        MetadataRequest(topics=None, allow_auto_topic_creation=False))
            except BrokerConnectionError as exc:
                errors.append(str(exc))
                continue
            assert isinstance(response, MetadataResponse)
            return {t.name: len(t.partitions) for t in response.topics if not t.is_internal and t.partitions}
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    def subscribed(self, options: SourceOptions) -> dict[str, int]:
        """The topics ``subscribe`` names (UnknownTopicOrPartitionError for a missing one) or
        ``subscribePattern`` matches (possibly none) -> partition counts, sorted by name."""
        if options.subscribe_pattern is not None:
            pattern = re.compile(options.subscribe_pattern)
            return {t: n for t, n in sorted(self.all_topics().items()) if pattern.fullmatch(t)}
        found = {}
        for topic in sorted(options.subscribe):
            try:
                found[topic] = len(self._cluster.partitions_for(topic))
            except UnknownTopicOrPartitionError:
                known = sorted(self.all_topics())
                raise UnknownTopicOrPartitionError(
                    f"appliance data source: option subscribe: topic {topic!r} does not exist on the "
                    f"appliance at {self.bootstrap_servers} (its topics: {', '.join(known) or 'none'})"
                ) from None
        return found

    def offsets(self, partitions: Iterable[TopicPartitionKey], which: int) -> dict[TopicPartitionKey, int]:
        """Log start offsets (``EARLIEST``) or high watermarks (``LATEST``) of ``partitions``."""
        wanted = list(partitions)
        if not wanted:
            return {}
        found = self._cluster.list_offsets(wanted, which)
        return {tp: found[tp] for tp in wanted}

    def payload_bytes_per_record(self, topic: str, partition: int, offset: int) -> float | None:
        """Key and value bytes per record, averaged over up to 2000 records from ``offset`` (None if there
        are none)."""
        settings = {"bootstrap.servers": self.bootstrap_servers, "auto.offset.reset": "earliest",
                    "max.partition.fetch.bytes": 262_144, "client.id": "appliance-spark-driver"}
        with Consumer(settings) as consumer:
            consumer.assign([(topic, partition)])
            consumer.seek((topic, partition), offset)
            chunks = consumer.poll_batch(timeout_ms=2000, max_records=_SAMPLE_RECORDS)
        count = sum(len(c) for c in chunks)
        if count == 0:
            return None
        total = sum(int(c.key_lengths.clip(0).sum()) + int(c.value_lengths.clip(0).sum()) for c in chunks)
        return max(total / count, 1.0)

    def close(self) -> None:
        self._cluster.close()


def resolve(spec: OffsetSpec, partition_counts: Mapping[str, int], earliest: Mapping[TopicPartitionKey, int],
            latest: Mapping[TopicPartitionKey, int], name: str) -> dict[TopicPartitionKey, int]:
    """Concrete offsets for every partition of ``partition_counts``.  ConfigError for a partition the offset
    map names that the topic does not have."""
    for topic, partitions in spec.specific.items():
        count = partition_counts.get(topic)
        for partition in partitions:
            if count is not None and partition >= count:
                raise ConfigError(f"appliance data source: option {name}: partition {partition} of topic "
                                  f"{topic!r} does not exist (the topic has {count} partitions)")
    out = {}
    for topic, count in partition_counts.items():
        for partition in range(count):
            tp = (topic, partition)
            offset = spec.offset_for(topic, partition)
            out[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return out


def plan_batch(options: SourceOptions) -> list[OffsetRange]:
    """A batch read's tasks: startingOffsets..endingOffsets of every subscribed partition, checked."""
    assert options.starting_offsets is not None and options.ending_offsets is not None
    view = ClusterView(options.bootstrap_servers)
    try:
        counts = view.subscribed(options)
        tps = [(t, p) for t, n in counts.items() for p in range(n)]
        earliest, latest = view.offsets(tps, EARLIEST), view.offsets(tps, LATEST)
    finally:
        view.close()
    starts = resolve(options.starting_offsets, counts, earliest, latest, "startingOffsets")
    ends = resolve(options.ending_offsets, counts, earliest, latest, "endingOffsets")
    ranges = []
    for tp in tps:
        name = f"partition {tp[0]}-{tp[1]}"
        bounds = f"log start offset {earliest[tp]}, high watermark {latest[tp]}"
        start, end = starts[tp], ends[tp]
        if start > latest[tp]:
            raise OffsetOutOfRangeError(f"appliance data source: option startingOffsets: {name} offset "
                                        f"{start} is past the end of the partition ({bounds})")
        if end > latest[tp]:
            raise OffsetOutOfRangeError(f"appliance data source: option endingOffsets: {name} offset "
                                        f"{end} is past the end of the partition ({bounds})")
        if start < earliest[tp]:
            if options.fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"appliance data source: option startingOffsets: {name} offset {start} is below the log "
                    f"start offset {earliest[tp]}: records {start}..{earliest[tp] - 1} were deleted "
                    f"(retention); set failOnDataLoss=false to read from {earliest[tp]}")
            start = earliest[tp]
        if end < start:
            raise OffsetOutOfRangeError(f"appliance data source: {name}: endingOffsets {end} is before "
                                        f"startingOffsets {start} ({bounds})")
        ranges.append(OffsetRange(tp[0], tp[1], start, end, options.bootstrap_servers,
                                  options.fail_on_data_loss))
    return split_ranges(ranges, options.min_partitions, options.max_records_per_partition)


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None,
                 max_records_per_partition: int) -> list[OffsetRange]:
    """Cut ranges into tasks (see the module doc); empty ranges are dropped.  Deterministic."""
    pieces: list[OffsetRange] = []
    for r in ranges:
        count = r.record_count
        if count <= 0:
            continue
        parts = -(-count // max_records_per_partition)
        pieces += _cut(r, parts)
    if min_partitions is not None:
        while len(pieces) < min_partitions:
            largest = max(range(len(pieces)), key=lambda i: pieces[i].record_count, default=None)
            if largest is None or pieces[largest].record_count < 2:
                break
            pieces[largest : largest + 1] = _cut(pieces[largest], 2)
    return pieces


def _cut(r: OffsetRange, parts: int) -> list[OffsetRange]:
    count = r.record_count
    bounds = [r.from_offset + count * i // parts for i in range(parts + 1)]
    return [OffsetRange(r.topic, r.partition, a, b, r.bootstrap_servers, r.fail_on_data_loss)
            for a, b in itertools.pairwise(bounds) if b > a]
