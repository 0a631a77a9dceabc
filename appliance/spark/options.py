"""The data source's options: parsed and checked once, on the driver, before anything runs.

Spark hands a data source its options as strings with lower-cased keys.  They are declared once, in
``_OPTIONS``, with the kit of ``appliance.config.settings`` (matched in any case, numbers and switches read
from their text).  :func:`parse_options` turns them into a :class:`SourceOptions` (picklable: it travels to
the executors inside the reader and writer), and every mistake a user can make in them is a
:class:`storage.errors.ConfigError` naming the option, the value and what was expected, raised while Spark
plans the query (``load()``, ``collect()``, ``save()``, ``start()``) -- never later, in an executor.

Options, modelled on Spark's Kafka source and sink (``kafka.``-prefixed spellings are accepted too)::

    bootstrap.servers       HOST:PORT[,...] of the appliance's broker                    (required)
    subscribe               topics to read, comma separated             \\ exactly one, to read
    subscribePattern        a Python regular expression over topic names /
    startingOffsets         earliest | latest | {"topic": {"0": 23, "1": -2}}  (-2 earliest, -1 latest)
                            default: earliest for batch reads, latest for streams
    endingOffsets           latest | {"topic": {"0": 50, "1": -1}}               batch reads only
    maxRecordsPerTrigger    records per micro-batch, at most                      streams only
    maxBytesPerTrigger      record-batch bytes per micro-batch, about             streams only
    minPartitions           split offset ranges until there are at least this many Spark tasks
    maxRecordsPerPartition  split offset ranges so no task reads more than this (default 1000000)
    failOnDataLoss          true | false: offsets lost to retention (or a deleted topic) fail the query
    topic                   where rows without a ``topic`` column go                   writes
    compression.type        none | gzip | snappy | lz4 | zstd for written batches     writes
    commitLogTopic          the sink's commit log (default appliance-spark-commits)    streaming writes
    txnAppId, txnVersion    exactly-once for batch writes inside foreachBatch: a stable id and the batchId
                            (one write per pair: a second write with the same pair is taken for a replay)

A JSON offset map names topics and, for each, partitions (as strings) with offsets; partitions it leaves out
take the default (earliest for batch reads, latest for streams -- as the words would).  Spark's own options
``path``, ``queryName`` and ``checkpointLocation`` are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    did_you_mean,
    integer,
    optional,
    read_settings,
    text,
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

EARLIEST: Final = -2  # in an offset map: the log start offset (Spark's and Kafka's convention)
LATEST: Final = -1  # in an offset map: the high watermark
DEFAULT_COMMIT_LOG_TOPIC: Final = "appliance-spark-commits"
DEFAULT_MAX_RECORDS_PER_PARTITION: Final = 1_000_000

_SPARK_OWN: Final = frozenset({"path", "queryname", "checkpointlocation"})
_WRITE_COLUMNS: Final = ("key", "value", "topic", "partition", "headers")
_FAULT_POINT: Final = re.compile(r"(commit|kill):(\d+)")
_ORIGIN: Final = Origin("appliance data source: option")


def _fault_point(value: object) -> object:
    match = _FAULT_POINT.fullmatch(text(value))
    if match is None:
        raise Invalid("expected commit:<batchId> or kill:<batchId>")
    return (match.group(1), int(match.group(2)))


def _option(name: str, default: object, convert: Convert, doc: str) -> Setting:
    """An option, also accepted as ``kafka.NAME``, as Spark's Kafka source names its Kafka client settings."""
    return Setting(name, default, convert, doc, (Alias(f"kafka.{name}"),))


_OPTIONS: Final = SettingTable((
    _option("bootstrap.servers", None, optional(text), "HOST:PORT[,...] of the appliance's broker"),
    _option("subscribe", None, optional(text), "topics to read, comma separated"),
    _option("subscribePattern", None, optional(text), "a Python regular expression over topic names"),
    _option("startingOffsets", None, optional(text), "earliest, latest or a JSON offset map"),
    _option("endingOffsets", None, optional(text), "latest or a JSON offset map (batch reads)"),
    _option("maxRecordsPerTrigger", None, optional(integer(1, text=True)), "records per micro-batch"),
    _option("maxBytesPerTrigger", None, optional(integer(1, text=True)), "batch bytes per micro-batch"),
    _option("minPartitions", None, optional(integer(1, text=True)), "at least this many Spark tasks"),
    _option("maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION, integer(1, text=True),
           "records one Spark task reads at most"),
    _option("failOnDataLoss", True, boolean(text=True), "offsets lost to retention fail the query"),
    _option("topic", "", text, "where rows without a topic column go (writes)"),
    _option("compression.type", "none", choice(("none", "gzip", "snappy", "lz4", "zstd")),
            "codec of written batches"),
    _option("commitLogTopic", "", text, "the streaming sink's commit log (default appliance-spark-commits)"),
    _option("txnAppId", "", text, "a stable id of the writing job (exactly-once batch writes)"),
    _option("txnVersion", None, optional(integer(0, text=True)), "the foreachBatch batchId"),
    _option("appliance.test.faultPoint", None, optional(_fault_point), "tests: commit:N or kill:N"),
), case_blind=True)


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest`` or an explicit map ``{topic: {partition: offset}}`` (offset -2 / -1 = the
    log start offset / high watermark) with a default for partitions the map leaves out."""

    default: int  # EARLIEST or LATEST
    specific: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def offset_for(self, topic: str, partition: int) -> int:
        return self.specific.get(topic, {}).get(partition, self.default)

    def describe(self) -> str:
        if not self.specific:
            return "earliest" if self.default == EARLIEST else "latest"
        return json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in self.specific.items()})


@dataclass(frozen=True)
class SourceOptions:
    """Every option, checked.  Fields that do not apply to a query's kind keep their defaults."""

    bootstrap_servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    starting_offsets: OffsetSpec | None = None  # None: the kind's default
    ending_offsets: OffsetSpec | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    fail_on_data_loss: bool = True
    topic: str | None = None
    compression: str = "none"
    commit_log_topic: str = DEFAULT_COMMIT_LOG_TOPIC
    txn_app_id: str | None = None
    txn_version: int | None = None
    fault_point: tuple[str, int] | None = None  # tests: ("commit" | "kill", batch id), see writer.py

    # -- the checks that depend on what the query does ----------------------------------------------------

    def for_batch_read(self) -> SourceOptions:
        self._check_subscription()
        for name, value in (("maxRecordsPerTrigger", self.max_records_per_trigger),
                            ("maxBytesPerTrigger", self.max_bytes_per_trigger)):
            if value is not None:
                raise ConfigError(f"appliance data source: option {name} applies to streaming reads "
                                  "(spark.readStream); a batch read takes startingOffsets..endingOffsets")
        start = self.starting_offsets or OffsetSpec(EARLIEST)
        if start.specific:
            start = OffsetSpec(EARLIEST, start.specific)
        if start.default == LATEST and not start.specific:
            raise ConfigError("appliance data source: option startingOffsets=latest makes a batch read "
                              "empty; use earliest or a JSON offset map")
        for topic, partitions in start.specific.items():
            for partition, offset in partitions.items():
                if offset == LATEST:
                    raise ConfigError(
                        f"appliance data source: option startingOffsets: topic {topic!r} partition "
                        f"{partition}: -1 (latest) is not allowed for a batch read")
        end = self.ending_offsets or OffsetSpec(LATEST)
        for topic, partitions in end.specific.items():
            for partition, offset in partitions.items():
                if offset == EARLIEST:
                    raise ConfigError(
                        f"appliance data source: option endingOffsets: topic {topic!r} partition "
                        f"{partition}: -2 (earliest) is not allowed as an ending offset")
        self._check_offset_topics(start, "startingOffsets")
        self._check_offset_topics(end, "endingOffsets")
        return SourceOptions(**{**self.__dict__, "starting_offsets": start, "ending_offsets": end})

    def for_stream_read(self) -> SourceOptions:
        self._check_subscription()
        if self.ending_offsets is not None:
            raise ConfigError("appliance data source: option endingOffsets applies to batch reads; a stream "
                              "reads on (use Trigger.AvailableNow to stop at the end of what is there)")
        start = self.starting_offsets or OffsetSpec(LATEST)
        if start.specific:
            start = OffsetSpec(LATEST, start.specific)
        self._check_offset_topics(start, "startingOffsets")
        return SourceOptions(**{**self.__dict__, "starting_offsets": start})

    def for_write(self, column_names: list[str], *, streaming: bool) -> SourceOptions:
        names = [n.lower() for n in column_names]
        if "value" not in names:
            raise ConfigError(f"appliance data source: a write needs a 'value' column (binary or string); "
                              f"the DataFrame has {column_names}")
        unknown = [n for n in column_names if n.lower() not in _WRITE_COLUMNS]
        if unknown:
            raise ConfigError(f"appliance data source: columns {unknown} cannot be written; a write takes "
                              "key, value, and optionally topic, partition and headers")
        if self.topic is None and "topic" not in names:
            raise ConfigError("appliance data source: set option topic, or give the DataFrame a 'topic' "
                              "column")
        if (self.txn_app_id is None) != (self.txn_version is None):
            raise ConfigError("appliance data source: options txnAppId and txnVersion go together (a stable "
                              "id of the writing job and the foreachBatch batchId)")
        if streaming and self.txn_app_id is not None:
            raise ConfigError("appliance data source: txnAppId/txnVersion are for batch writes inside "
                              "foreachBatch; a streaming write is exactly-once by its query id and batchId")
        return self

    def _check_subscription(self) -> None:
        if bool(self.subscribe) == (self.subscribe_pattern is not None):
            raise ConfigError("appliance data source: set exactly one of the options subscribe (topics, "
                              "comma separated) and subscribePattern (a regular expression)")

    def _check_offset_topics(self, spec: OffsetSpec, name: str) -> None:
        for topic in spec.specific:
            if self.subscribe and topic not in self.subscribe:
                raise ConfigError(f"appliance data source: option {name} names topic {topic!r}, which is not "
                                  f"subscribed (subscribe={','.join(self.subscribe)})")
            if self.subscribe_pattern is not None and not re.fullmatch(self.subscribe_pattern, topic):
                raise ConfigError(f"appliance data source: option {name} names topic {topic!r}, which does "
                                  f"not match subscribePattern {self.subscribe_pattern!r}")


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check every option Spark passed (keys in any case).  ConfigError names the first bad one."""
    pairs = [(key, str(value)) for key, value in options.items()
             if key.lower().removeprefix("kafka.") not in _SPARK_OWN]
    values: dict[str, Any] = {**_OPTIONS.defaults(), **read_settings(_OPTIONS, pairs, _ORIGIN, _unknown)}
    servers = values["bootstrap.servers"]
    if not servers:
        raise ConfigError("appliance data source: set option bootstrap.servers (HOST:PORT of the appliance's "
                          "broker, e.g. 127.0.0.1:9092)")
    try:
        parse_bootstrap_servers(str(servers))
    except ValueError as exc:
        raise ConfigError(f"appliance data source: option bootstrap.servers: {exc}") from None
    return SourceOptions(
        bootstrap_servers=str(servers),
        subscribe=_subscription(values["subscribe"]),
        subscribe_pattern=_pattern(values["subscribePattern"]),
        starting_offsets=_offsets(values["startingOffsets"], "startingOffsets"),
        ending_offsets=_offsets(values["endingOffsets"], "endingOffsets"),
        max_records_per_trigger=values["maxRecordsPerTrigger"],
        max_bytes_per_trigger=values["maxBytesPerTrigger"],
        min_partitions=values["minPartitions"],
        max_records_per_partition=values["maxRecordsPerPartition"],
        fail_on_data_loss=values["failOnDataLoss"],
        topic=values["topic"] or None,
        compression=values["compression.type"],
        commit_log_topic=values["commitLogTopic"] or DEFAULT_COMMIT_LOG_TOPIC,
        txn_app_id=values["txnAppId"] or None,
        txn_version=values["txnVersion"],
        fault_point=values["appliance.test.faultPoint"],
    )


def _unknown(key: str) -> ConfigError:
    near = _OPTIONS.nearest(key.lower().removeprefix("kafka."))
    return ConfigError(f"appliance data source: unknown option {key!r}{did_you_mean(near)}")


def _subscription(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    subscribe = tuple(dict.fromkeys(t.strip() for t in str(value).split(",") if t.strip()))
    if not subscribe:
        raise ConfigError("appliance data source: option subscribe names no topic")
    return subscribe


def _pattern(value: object) -> str | None:
    if value is None:
        return None
    try:
        re.compile(str(value))
    except re.error as exc:
        raise ConfigError(f"appliance data source: option subscribePattern {value!r} is not a regular "
                          f"expression: {exc}") from None
    return str(value)


def _offsets(value: object, name: str) -> OffsetSpec | None:
    return None if value is None else parse_offsets(str(value), name)


def parse_offsets(text: str, name: str = "startingOffsets") -> OffsetSpec:
    """``earliest``, ``latest`` or a JSON map ``{"topic": {"0": 23, "1": -2}}``; ConfigError otherwise,
    naming the line and column of a JSON syntax error."""
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    where = f"appliance data source: option {name}"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: {text!r} is not earliest, latest or valid JSON ({exc.msg} at line "
                          f"{exc.lineno} column {exc.colno}); expected e.g. "
                          '{"topic": {"0": 23, "1": -2}}') from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{where}: expected a JSON object of topics, e.g. "
                          f'{{"topic": {{"0": 23, "1": -2}}}}, got {text!r}')
    specific: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(f"{where}: topic {topic!r}: expected an object of partition -> offset, got "
                              f"{json.dumps(partitions)}")
        offsets: dict[int, int] = {}
        for key, offset in partitions.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise ConfigError(f"{where}: topic {topic!r}: partition {key!r} is not a partition number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ConfigError(f"{where}: topic {topic!r} partition {key}: offset {json.dumps(offset)} is "
                                  "not an offset (>= 0, or -2 earliest, -1 latest)")
            offsets[int(key)] = offset
        specific[topic] = dict(sorted(offsets.items()))
    return OffsetSpec(LATEST if name == "endingOffsets" else EARLIEST, specific)
