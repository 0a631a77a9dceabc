"""The data source's options: Spark's Kafka source options, parsed and checked on the driver before anything
runs.

Spark hands a data source its options as strings with lower-cased keys.  The source's own options are
declared once, in ``_OPTIONS``, with the kit of ``appliance.config.settings`` (matched in any case, numbers
and switches read from their text); ``kafka.``-prefixed ones are Kafka client settings, as in Spark's
source.  :func:`parse_options` turns them into a :class:`SourceOptions` (picklable: it travels to the
executors inside the reader and writer), and every mistake a user can make in them is a
:class:`storage.errors.ConfigError` naming the option, the value and what was expected, raised while Spark
plans the query (``load()``, ``collect()``, ``save()``, ``start()``) -- never later, in an executor.

Options (Spark's names, meanings and defaults; ``docs/spark.md`` has the table beside Spark's)::

    kafka.bootstrap.servers   HOST:PORT[,...] of the appliance's broker (also bootstrap.servers) (required)
    assign | subscribe | subscribePattern   exactly one, to read: {"t": [0, 1]} | t1,t2 | a regex
    startingTimestamp > startingOffsetsByTimestamp > startingOffsets     where a read starts (the first
    endingTimestamp > endingOffsetsByTimestamp > endingOffsets           given wins; offset_specs.py)
    startingOffsetsByTimestampStrategy   error | latest: a starting timestamp no record reaches
    failOnDataLoss            true | false: offsets lost to retention (or a deleted topic) fail the query
    minPartitions, maxRecordsPerPartition   split offset ranges into at least / at most so many
    maxOffsetsPerTrigger      records per micro-batch, at most (alias: maxRecordsPerTrigger)   streams
    minOffsetsPerTrigger      records a micro-batch waits for, up to maxTriggerDelay (15m)      streams
    includeHeaders            true: the headers column is in the schema (default false)
    groupIdPrefix, kafka.group.id   accepted, unused: reads use no consumer group
    kafkaConsumer.pollTimeoutMs     a task fails after this long without records it expects (120000)
    fetchOffset.numRetries, fetchOffset.retryIntervalMs   the driver's retries of offset look-ups (3, 10)
    topic                     writes: the topic of every row (overrides a topic column)
    kafka.*                   passed to the consumers (reads) and producers (writes); refused as Spark
                              refuses them: auto.offset.reset, key/value.(de)serializer,
                              enable.auto.commit, interceptor.classes; isolation.level=read_committed
    -- the appliance's own --
    maxBytesPerTrigger        record bytes per micro-batch, about                                streams
    compression.type          none | gzip | snappy | lz4 | zstd for written batches            writes
    commitLogTopic            the sink's commit log (default appliance-spark-commits)    streaming writes
    txnAppId, txnVersion      exactly-once batch writes inside foreachBatch: a stable id and the batchId

Spark's own options ``path``, ``queryName`` and ``checkpointLocation`` are ignored.  Options that do not
apply to a query's kind are ignored with a warning where Spark ignores them (``maxOffsetsPerTrigger`` in a
batch read) and refused where Spark refuses them (``endingOffsets`` in a stream).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from appliance.config.settings import (
    Alias,
    Convert,
    Invalid,
    Origin,
    Setting,
    SettingTable,
    boolean,
    choice,
    convert,
    did_you_mean,
    integer,
    optional,
    read_settings,
    text,
)
from appliance.spark.offset_specs import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    parse_assign,
    parse_offsets,
    parse_time_ms,
    parse_timestamp,
    parse_timestamps,
)
from ipc.kafka_client import parse_bootstrap_servers
from storage.errors import ConfigError

__all__ = [
    "DEFAULT_COMMIT_LOG_TOPIC",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "SourceOptions",
    "parse_offsets",
    "parse_options",
]

log = logging.getLogger(__name__)

DEFAULT_COMMIT_LOG_TOPIC: Final = "appliance-spark-commits"
DEFAULT_MAX_RECORDS_PER_PARTITION: Final = 1_000_000
DEFAULT_MAX_TRIGGER_DELAY: Final = "15m"

_SPARK_OWN: Final = frozenset({"path", "queryname", "checkpointlocation"})
_FAULT_POINT: Final = re.compile(r"(commit|kill):(\d+)")
_ORIGIN: Final = Origin("appliance data source: option")
_WHERE: Final = "appliance data source: option"
_STRATEGIES: Final = ("assign", "subscribe", "subscribePattern")
# Kafka client settings Spark's source refuses, with what to do instead (as Spark words it)
_REFUSED: Final = {
    "auto.offset.reset": "set the source option startingOffsets to earliest or latest to say where to "
                         "start; Structured Streaming manages which offsets are consumed itself",
    "key.deserializer": "keys are read as byte arrays; use DataFrame operations to deserialize them",
    "value.deserializer": "values are read as byte arrays; use DataFrame operations to deserialize them",
    "key.serializer": "keys are written from string or binary columns; use DataFrame operations to "
                      "serialize them",
    "value.serializer": "values are written from string or binary columns; use DataFrame operations to "
                        "serialize them",
    "enable.auto.commit": "the source commits no offsets (Spark's checkpoint holds them)",
    "interceptor.classes": "interceptors could change what is read",
}
# consumer or producer settings a kafka.* option may not set: the data source sets them itself
_NOT_PASSED: Final = frozenset({"bootstrap.servers", "log.dirs", "group.instance.id",
                                "partition.assignment.strategy", "auto.commit.interval.ms"})


def _fault_point(value: object) -> object:
    match = _FAULT_POINT.fullmatch(text(value))
    if match is None:
        raise Invalid("expected commit:<batchId> or kill:<batchId>")
    return (match.group(1), int(match.group(2)))


def _option(name: str, default: object, convert: Convert, doc: str, *aliases: str) -> Setting:
    return Setting(name, default, convert, doc, tuple(Alias(a) for a in aliases))


_COUNT: Final = integer(1, text=True)
_OPTIONS: Final = SettingTable((
    _option("bootstrap.servers", None, optional(text), "HOST:PORT[,...] of the broker",
            "kafka.bootstrap.servers"),
    _option("assign", None, optional(text), 'partitions to read: {"topic": [0, 1]}'),
    _option("subscribe", None, optional(text), "topics to read, comma separated"),
    _option("subscribePattern", None, optional(text), "a regular expression over topic names"),
    _option("startingOffsets", None, optional(text), "earliest, latest or a JSON offset map"),
    _option("endingOffsets", None, optional(text), "latest or a JSON offset map (batch reads)"),
    _option("startingOffsetsByTimestamp", None, optional(text), "a JSON map of timestamps per partition"),
    _option("endingOffsetsByTimestamp", None, optional(text), "a JSON map of timestamps per partition"),
    _option("startingTimestamp", None, optional(text), "one timestamp (ms) for every partition"),
    _option("endingTimestamp", None, optional(text), "one timestamp (ms) for every partition"),
    _option("startingOffsetsByTimestampStrategy", "error", choice(("error", "latest")),
            "a starting timestamp no record reaches: fail, or start at the latest offset"),
    _option("maxOffsetsPerTrigger", None, optional(_COUNT), "records per micro-batch",
            "maxRecordsPerTrigger"),
    _option("minOffsetsPerTrigger", None, optional(_COUNT), "records a micro-batch waits for"),
    _option("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY, text, "longest wait for minOffsetsPerTrigger"),
    _option("maxBytesPerTrigger", None, optional(_COUNT), "batch bytes per micro-batch"),
    _option("minPartitions", None, optional(_COUNT), "at least this many Spark tasks"),
    _option("maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION, _COUNT,
            "records one Spark task reads at most"),
    _option("failOnDataLoss", True, boolean(text=True), "offsets lost to retention fail the query"),
    _option("includeHeaders", False, boolean(text=True), "the headers column is in the schema"),
    _option("groupIdPrefix", None, optional(text), "accepted, unused (reads use no consumer group)"),
    _option("kafkaConsumer.pollTimeoutMs", None, optional(_COUNT), "a task's longest wait for records"),
    _option("fetchOffset.numRetries", 3, integer(0, text=True), "the driver's offset look-up retries"),
    _option("fetchOffset.retryIntervalMs", 10, integer(0, text=True), "pause between those retries"),
    _option("topic", None, optional(text), "the topic of every written row (writes)"),
    _option("compression.type", "none", choice(("none", "gzip", "snappy", "lz4", "zstd")),
            "codec of written batches", "kafka.compression.type"),
    _option("commitLogTopic", "", text, "the streaming sink's commit log (default appliance-spark-commits)"),
    _option("txnAppId", "", text, "a stable id of the writing job (exactly-once batch writes)"),
    _option("txnVersion", None, optional(integer(0, text=True)), "the foreachBatch batchId"),
    _option("appliance.test.faultPoint", None, optional(_fault_point), "tests: commit:N or kill:N"),
), case_blind=True)


@dataclass(frozen=True)
class SourceOptions:
    """Every option, checked.  Fields that do not apply to a query's kind keep their defaults."""

    bootstrap_servers: str
    assign: Mapping[str, tuple[int, ...]] | None = None
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    starting_offsets: OffsetSpec | None = None  # None: the kind's default
    ending_offsets: OffsetSpec | None = None
    ending_options: tuple[str, ...] = ()  # every ending option given (a stream refuses them)
    starting_strategy: str = "error"  # startingOffsetsByTimestampStrategy
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int | None = None
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    kafka_params: tuple[tuple[str, str], ...] = ()  # kafka.* for the clients, prefix removed
    topic: str | None = None
    compression: str = "none"
    commit_log_topic: str = DEFAULT_COMMIT_LOG_TOPIC
    txn_app_id: str | None = None
    txn_version: int | None = None
    fault_point: tuple[str, int] | None = None  # tests: ("commit" | "kill", batch id), see writer.py

    # -- the checks that depend on what the query does ----------------------------------------------------

    def for_batch_read(self) -> SourceOptions:
        self._check_subscription()
        for name, value in (("maxOffsetsPerTrigger", self.max_offsets_per_trigger),
                            ("minOffsetsPerTrigger", self.min_offsets_per_trigger),
                            ("maxBytesPerTrigger", self.max_bytes_per_trigger)):
            if value is not None:
                log.warning("appliance data source: option %s is ignored in batch queries", name)
        start = self.starting_offsets or OffsetSpec(EARLIEST, option="startingOffsets")
        if not start.by_time:
            if start.default == LATEST and not start.specific:
                raise ConfigError(f"{_WHERE} startingOffsets=latest: starting offset can't be latest for "
                                  "batch queries (the read would be empty); use earliest or a JSON map")
            start = replace(start, default=EARLIEST)
        for topic, partitions in start.specific.items():
            for partition, offset in partitions.items():
                if offset == LATEST:
                    raise ConfigError(f"{_WHERE} startingOffsets: topic {topic!r} partition {partition}: -1 "
                                      "(latest) can't be a starting offset for batch queries")
        end = self.ending_offsets or OffsetSpec(LATEST, option="endingOffsets")
        for topic, partitions in end.specific.items():
            for partition, offset in partitions.items():
                if offset == EARLIEST:
                    raise ConfigError(f"{_WHERE} endingOffsets: topic {topic!r} partition {partition}: -2 "
                                      "(earliest) can't be an ending offset for batch queries")
        if end.default == EARLIEST:
            raise ConfigError(f"{_WHERE} endingOffsets=earliest: ending offset can't be earliest for batch "
                              "queries; use latest or a JSON map")
        self._check_offset_topics(start)
        self._check_offset_topics(end)
        self.consumer_settings()
        return replace(self, starting_offsets=start, ending_offsets=end)

    def for_stream_read(self) -> SourceOptions:
        self._check_subscription()
        if self.ending_options:
            raise ConfigError(f"{_WHERE} {self.ending_options[0]}: an ending offset or timestamp is not "
                              "valid in streaming queries (a stream reads on; use Trigger.AvailableNow to "
                              "stop at the end of what is there)")
        if (self.min_offsets_per_trigger is not None and self.max_offsets_per_trigger is not None
                and self.min_offsets_per_trigger > self.max_offsets_per_trigger):
            raise ConfigError(f"{_WHERE} minOffsetsPerTrigger: its value ({self.min_offsets_per_trigger}) is "
                              f"higher than maxOffsetsPerTrigger ({self.max_offsets_per_trigger})")
        start = self.starting_offsets or OffsetSpec(LATEST, option="startingOffsets")
        if not start.by_time and start.specific:
            start = replace(start, default=LATEST)
        self._check_offset_topics(start)
        self.consumer_settings()
        return replace(self, starting_offsets=start)

    def for_write(self, columns: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Checks ``columns`` (name -> Spark type, ``simpleString``) as Spark's Kafka sink does."""
        from appliance.spark.schema import check_write_columns

        check_write_columns(columns, self.topic)
        if (self.txn_app_id is None) != (self.txn_version is None):
            raise ConfigError("appliance data source: options txnAppId and txnVersion go together (a stable "
                              "id of the writing job and the foreachBatch batchId)")
        if streaming and self.txn_app_id is not None:
            raise ConfigError("appliance data source: txnAppId/txnVersion are for batch writes inside "
                              "foreachBatch; a streaming write is exactly-once by its query id and batchId")
        self.producer_settings()
        return self

    # -- kafka.* settings, checked against the appliance's own clients -------------------------------------

    def consumer_settings(self) -> dict[str, object]:
        """The ``kafka.*`` options the reading consumers take (producer-only ones are ignored, as Kafka's
        consumer ignores them); ConfigError for one neither client knows or a bad value."""
        return _client_settings(self.kafka_params, reading=True)

    def producer_settings(self) -> dict[str, object]:
        """The ``kafka.*`` options the writing producers take (consumer-only ones are ignored).  The sink
        needs acknowledged writes from the idempotent producer: ``acks=0`` and ``enable.idempotence=false``
        are refused."""
        settings = _client_settings(self.kafka_params, reading=False)
        if settings.get("enable.idempotence") is False:
            raise ConfigError(f"{_WHERE} kafka.enable.idempotence=false: the sink writes with the idempotent "
                              "producer (its exactly-once commit log relies on producer ids); leave it true")
        if settings.get("acks") == 0:
            raise ConfigError(f"{_WHERE} kafka.acks=0: the sink must know its records were appended (a task "
                              "fails with the first delivery error); use 1 or all")
        return settings

    # -- helpers -------------------------------------------------------------------------------------------

    def _check_subscription(self) -> None:
        given = [name for name, value in (("assign", self.assign), ("subscribe", self.subscribe),
                                          ("subscribePattern", self.subscribe_pattern)) if value]
        if not given:
            raise ConfigError("appliance data source: one of the options assign, subscribe, subscribePattern "
                              "must be set (partitions, topics, or a regular expression over topic names)")
        if len(given) > 1:
            raise ConfigError(f"appliance data source: only one of the options assign, subscribe, "
                              f"subscribePattern can be set; got {' and '.join(given)}")

    def _check_offset_topics(self, spec: OffsetSpec) -> None:
        for topic in spec.topics():
            if self.subscribe and topic not in self.subscribe:
                raise ConfigError(f"{_WHERE} {spec.option} names topic {topic!r}, which is not subscribed "
                                  f"(subscribe={','.join(self.subscribe)})")
            if self.assign is not None and topic not in self.assign:
                raise ConfigError(f"{_WHERE} {spec.option} names topic {topic!r}, which assign does not name")
            if self.subscribe_pattern is not None and not re.fullmatch(self.subscribe_pattern, topic):
                raise ConfigError(f"{_WHERE} {spec.option} names topic {topic!r}, which does not match "
                                  f"subscribePattern {self.subscribe_pattern!r}")


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check every option Spark passed (keys in any case).  ConfigError names the first bad one."""
    pairs, kafka = [], []
    for key, value in options.items():
        if key.lower() in _SPARK_OWN:
            continue
        if key.lower().startswith("kafka.") and _OPTIONS.find(key) is None:
            kafka.append((key[len("kafka."):].lower(), str(value)))
        else:
            pairs.append((key, str(value)))
    values: dict[str, Any] = {**_OPTIONS.defaults(), **read_settings(_OPTIONS, pairs, _ORIGIN, _unknown)}
    servers = values["bootstrap.servers"]
    if not servers:
        raise ConfigError("appliance data source: option 'kafka.bootstrap.servers' must be set (HOST:PORT of "
                          "the appliance's broker, e.g. 127.0.0.1:9092)")
    try:
        parse_bootstrap_servers(str(servers))
    except ValueError as exc:
        raise ConfigError(f"{_WHERE} kafka.bootstrap.servers: {exc}") from None
    given = {name for name, value in values.items() if value is not None}
    return SourceOptions(
        bootstrap_servers=str(servers),
        assign=None if values["assign"] is None else parse_assign(values["assign"]),
        subscribe=_subscription(values["subscribe"]),
        subscribe_pattern=_pattern(values["subscribePattern"]),
        starting_offsets=_point(values, "starting"),
        ending_offsets=_point(values, "ending"),
        ending_options=tuple(n for n in ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
                             if n in given),
        starting_strategy=values["startingOffsetsByTimestampStrategy"],
        max_offsets_per_trigger=values["maxOffsetsPerTrigger"],
        min_offsets_per_trigger=values["minOffsetsPerTrigger"],
        max_trigger_delay_ms=parse_time_ms(values["maxTriggerDelay"], "maxTriggerDelay"),
        max_bytes_per_trigger=values["maxBytesPerTrigger"],
        min_partitions=values["minPartitions"],
        max_records_per_partition=values["maxRecordsPerPartition"],
        fail_on_data_loss=values["failOnDataLoss"],
        include_headers=values["includeHeaders"],
        poll_timeout_ms=values["kafkaConsumer.pollTimeoutMs"],
        fetch_offset_retries=values["fetchOffset.numRetries"],
        fetch_offset_retry_interval_ms=values["fetchOffset.retryIntervalMs"],
        kafka_params=_kafka_params(kafka),
        topic=values["topic"].strip() if values["topic"] is not None else None,
        compression=values["compression.type"],
        commit_log_topic=values["commitLogTopic"] or DEFAULT_COMMIT_LOG_TOPIC,
        txn_app_id=values["txnAppId"] or None,
        txn_version=values["txnVersion"],
        fault_point=values["appliance.test.faultPoint"],
    )


def _unknown(key: str) -> ConfigError:
    near = _OPTIONS.nearest(key)
    return ConfigError(f"appliance data source: unknown option {key!r}{did_you_mean(near)}")


def _point(values: Mapping[str, Any], which: str) -> OffsetSpec | None:
    """The starting or ending point from the first of its three options given (Spark's precedence)."""
    name = f"{which}Timestamp"
    if values[name] is not None:
        return parse_timestamp(values[name], name)
    name = f"{which}OffsetsByTimestamp"
    if values[name] is not None:
        return parse_timestamps(values[name], name)
    name = f"{which}Offsets"
    return None if values[name] is None else parse_offsets(values[name], name)


def _subscription(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    subscribe = tuple(dict.fromkeys(t.strip() for t in str(value).split(",") if t.strip()))
    if not subscribe:
        raise ConfigError(f"{_WHERE} subscribe={value!r}: no topics to subscribe to")
    return subscribe


def _pattern(value: object) -> str | None:
    if value is None:
        return None
    pattern = str(value).strip()
    if not pattern:
        raise ConfigError(f"{_WHERE} subscribePattern={value!r}: the pattern to subscribe to is empty")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{_WHERE} subscribePattern {value!r} is not a regular expression: {exc}") from None
    return pattern


def _kafka_params(pairs: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``kafka.*`` options (prefix removed) Spark's refusals checked; group.id and the like dropped."""
    out = []
    for key, value in pairs:
        if key in _REFUSED:
            raise ConfigError(f"{_WHERE} 'kafka.{key}' is not supported: {_REFUSED[key]}")
        if key == "group.id":
            continue  # accepted, unused: reads join no consumer group
        if key == "isolation.level":
            if value.strip().lower() == "read_uncommitted":
                continue
            if value.strip().lower() == "read_committed":
                raise ConfigError(f"{_WHERE} kafka.isolation.level=read_committed: transactions are not "
                                  "built yet (every record is readable once acknowledged); use "
                                  "read_uncommitted, the default")
            raise ConfigError(f"{_WHERE} kafka.isolation.level={value!r}: expected read_uncommitted")
        if key == "security.protocol":
            if value.strip().upper() != "PLAINTEXT":
                raise ConfigError(f"{_WHERE} kafka.security.protocol={value!r}: the appliance's listener "
                                  "speaks PLAINTEXT only")
            continue
        out.append((key, value))
    return tuple(out)


def _client_settings(params: tuple[tuple[str, str], ...], *, reading: bool) -> dict[str, object]:
    from appliance.client.consumer import SETTINGS as CONSUMER
    from appliance.client.producer_config import SETTINGS as PRODUCER

    mine, other = (CONSUMER, PRODUCER) if reading else (PRODUCER, CONSUMER)
    kept = []
    for key, value in params:
        known = mine.find(key) is not None and key not in _NOT_PASSED and not key.startswith("appliance.")
        if known:
            kept.append((key, value))
        elif other.find(key) is None or key in _NOT_PASSED or key.startswith("appliance."):
            near = CONSUMER.nearest(key) or PRODUCER.nearest(key)
            raise ConfigError(f"{_WHERE} 'kafka.{key}' is not a consumer or producer setting the "
                              f"appliance's clients take{did_you_mean(near and 'kafka.' + near)}")
    out = {}
    for key, value in kept:
        found = mine.find(key)
        assert found is not None
        out[found.setting.name] = convert(found, f"kafka.{key}", value, _ORIGIN)
    return out
