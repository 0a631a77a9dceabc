"""The driver's side of a read: which partitions, which offsets, which ranges become which Spark tasks.

Everything here runs on the driver while Spark plans a query (``collect()`` of a batch read, each trigger of
a stream), so a mistake -- an unknown topic, an offset past the end of a partition, records lost to
retention -- is raised there, with a message naming the option, the partition and both offsets, instead of
failing a task on an executor.

:class:`ClusterView` asks the broker over the Kafka protocol (Metadata, ListOffsets by position and by
timestamp, one small Fetch to estimate record sizes) through ``appliance.client.remote_fetch.RemoteCluster``.
A read covers the partitions of the subscribed topics, or those ``assign`` names.  :func:`resolve` turns a
starting or ending point (``appliance.spark.offset_specs``) into an offset per partition: an offset map
directly, a timestamp through ListOffsets -- the first record at or after it; where none is that late, the
high watermark for an ending point and, for a starting point, an error or the high watermark as
``startingOffsetsByTimestampStrategy`` says.

:func:`split_ranges` turns per-partition offset ranges into :class:`OffsetRange` tasks: ranges longer than
``maxRecordsPerPartition`` are cut into equal pieces, then the longest pieces are halved until there are
``minPartitions`` tasks, so a large partition is read by several executors at once.  The result depends
only on its input, so a micro-batch planned again after a restart gets the very same tasks.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from pyspark.sql.datasource import InputPartition

from appliance.client.consumer import Consumer
from appliance.client.remote_fetch import FetchSettings, RemoteCluster
from appliance.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions
from ipc.kafka import MetadataRequest, MetadataResponse
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.errors import ConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError

__all__ = ["ClusterView", "OffsetRange", "TopicPartitionKey", "plan_batch", "resolve", "split_ranges", "task"]

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
    include_headers: bool = False
    consumer_settings: tuple[tuple[str, object], ...] = ()  # kafka.* options the consumer takes
    poll_timeout_ms: int | None = None  # kafkaConsumer.pollTimeoutMs

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
        """The topics ``subscribe`` or ``assign`` names (UnknownTopicOrPartitionError for a missing one) or
        ``subscribePattern`` matches (possibly none) -> partition counts, sorted by name."""
        if options.subscribe_pattern is not None:
            pattern = re.compile(options.subscribe_pattern)
            return {t: n for t, n in sorted(self.all_topics().items()) if pattern.fullmatch(t)}
        option, topics = ("assign", options.assign) if options.assign is not None else (
            "subscribe", options.subscribe)
        found = {}
        for topic in sorted(topics):
            try:
                found[topic] = len(self._cluster.partitions_for(topic))
            except UnknownTopicOrPartitionError:
                known = sorted(self.all_topics())
                raise UnknownTopicOrPartitionError(
                    f"appliance data source: option {option}: topic {topic!r} does not exist on the "
                    f"appliance at {self.bootstrap_servers} (its topics: {', '.join(known) or 'none'})"
                ) from None
        return found

    def read_partitions(self, options: SourceOptions) -> list[TopicPartitionKey]:
        """The partitions a read covers, sorted: every partition of the subscribed topics, or those
        ``assign`` names (UnknownTopicOrPartitionError for one the topic does not have)."""
        counts = self.subscribed(options)
        if options.assign is None:
            return [(t, p) for t, n in counts.items() for p in range(n)]
        for topic, partitions in options.assign.items():
            missing = [p for p in partitions if p >= counts[topic]]
            if missing:
                raise UnknownTopicOrPartitionError(
                    f"appliance data source: option assign: topic {topic!r} has no partition "
                    f"{', '.join(map(str, missing))} (it has {counts[topic]}: 0..{counts[topic] - 1})")
        return sorted((t, p) for t, ps in options.assign.items() for p in ps)

    def offsets_for_times(self, timestamps: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey,
                                                                                     int | None]:
        """Per partition, the offset of the first record whose timestamp is >= the one given (ms), or None
        if none is: Kafka's ListOffsets by timestamp, as ``Consumer.offsets_for_times`` asks it."""
        by_time: dict[int, list[TopicPartitionKey]] = {}
        for tp, timestamp in timestamps.items():
            by_time.setdefault(timestamp, []).append(tp)
        out: dict[TopicPartitionKey, int | None] = {}
        for timestamp, tps in sorted(by_time.items()):
            found = self._cluster.list_offsets(tps, timestamp)
            out.update({tp: None if found[tp] < 0 else found[tp] for tp in tps})
        return out

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


TimesLookup = Callable[[Mapping[TopicPartitionKey, int]], Mapping[TopicPartitionKey, int | None]]


def resolve(spec: OffsetSpec, tps: list[TopicPartitionKey], earliest: Mapping[TopicPartitionKey, int],
            latest: Mapping[TopicPartitionKey, int], times: TimesLookup | None = None,
            strategy: str = "error") -> dict[TopicPartitionKey, int]:
    """Concrete offsets for every partition of ``tps``: from an offset map (ConfigError for a partition it
    names that the read does not cover) or from timestamps through ``times`` (see :func:`_by_time`)."""
    if spec.by_time:
        assert times is not None
        return _by_time(spec, tps, latest, times, strategy)
    counts: dict[str, int] = {}
    for topic, partition in tps:
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    covered = set(tps)
    for topic, partitions in spec.specific.items():
        for partition in partitions:
            if (topic, partition) not in covered and topic in counts:
                raise ConfigError(f"appliance data source: option {spec.option}: partition {partition} of "
                                  f"topic {topic!r} is not read (the read covers partitions "
                                  f"{', '.join(str(p) for t, p in tps if t == topic)})")
    out = {}
    for tp in tps:
        offset = spec.offset_for(*tp)
        out[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return out


def _by_time(spec: OffsetSpec, tps: list[TopicPartitionKey], latest: Mapping[TopicPartitionKey, int],
             times: TimesLookup, strategy: str) -> dict[TopicPartitionKey, int]:
    """Offsets from timestamps, as Spark's Kafka source resolves them: a per-partition map must name every
    partition read; where no record is that late, an ending point is the high watermark and a starting
    point follows ``startingOffsetsByTimestampStrategy`` (``error`` or ``latest``)."""
    if spec.timestamps is not None:
        named = {(t, p) for t, ps in spec.timestamps.items() for p in ps}
        if named != set(tps):
            raise ConfigError(
                f"appliance data source: option {spec.option}: the partitions it names don't match the "
                f"partitions read; name every one. Named: {_names(named)}; read: {_names(tps)}")
        wanted = {tp: spec.timestamps[tp[0]][tp[1]] for tp in tps}
    else:
        assert spec.timestamp is not None
        wanted = {tp: spec.timestamp for tp in tps}
    found = times(wanted) if wanted else {}
    out = {}
    for tp in tps:
        offset = found[tp]
        if offset is None and spec.option.startswith("starting") and strategy == "error":
            raise ConfigError(
                f"appliance data source: option {spec.option}: no offset matched: no record of partition "
                f"{tp[0]}-{tp[1]} has a timestamp >= {wanted[tp]} (high watermark {latest[tp]}); set "
                "startingOffsetsByTimestampStrategy=latest to start at the latest offset there")
        out[tp] = latest[tp] if offset is None else offset
    return out


def _names(tps: Iterable[TopicPartitionKey]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "none"


def plan_batch(options: SourceOptions) -> list[OffsetRange]:
    """A batch read's tasks: the starting..ending offsets of every partition read, checked."""
    start_spec, end_spec = options.starting_offsets, options.ending_offsets
    assert start_spec is not None and end_spec is not None
    view = ClusterView(options.bootstrap_servers)
    try:
        tps = view.read_partitions(options)
        earliest, latest = view.offsets(tps, EARLIEST), view.offsets(tps, LATEST)
        starts = resolve(start_spec, tps, earliest, latest, view.offsets_for_times, options.starting_strategy)
        ends = resolve(end_spec, tps, earliest, latest, view.offsets_for_times)
    finally:
        view.close()
    ranges = []
    for tp in tps:
        name = f"partition {tp[0]}-{tp[1]}"
        bounds = f"log start offset {earliest[tp]}, high watermark {latest[tp]}"
        start, end = starts[tp], ends[tp]
        if start > latest[tp]:
            raise OffsetOutOfRangeError(f"appliance data source: option {start_spec.option}: {name} offset "
                                        f"{start} is past the end of the partition ({bounds})")
        if end > latest[tp]:
            raise OffsetOutOfRangeError(f"appliance data source: option {end_spec.option}: {name} offset "
                                        f"{end} is past the end of the partition ({bounds})")
        if start < earliest[tp]:
            if options.fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"appliance data source: option {start_spec.option}: {name} offset {start} is below the "
                    f"log start offset {earliest[tp]}: records {start}..{earliest[tp] - 1} were deleted "
                    f"(retention); set failOnDataLoss=false to read from {earliest[tp]}")
            start = earliest[tp]
        if end < start:
            raise OffsetOutOfRangeError(
                f"appliance data source: {name}: the resolved start offset {start} ({start_spec.option}) is "
                f"greater than the resolved end offset {end} ({end_spec.option}) ({bounds})")
        ranges.append(task(options, tp, start, end))
    return split_ranges(ranges, options.min_partitions, options.max_records_per_partition)


def task(options: SourceOptions, tp: TopicPartitionKey, start: int, end: int) -> OffsetRange:
    """The task reading offsets ``start`` to ``end`` of ``tp``, with what its executor needs."""
    return OffsetRange(tp[0], tp[1], start, end, options.bootstrap_servers, options.fail_on_data_loss,
                       options.include_headers, tuple(sorted(options.consumer_settings().items())),
                       options.poll_timeout_ms)


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
    return [replace(r, from_offset=a, until_offset=b) for a, b in itertools.pairwise(bounds) if b > a]
