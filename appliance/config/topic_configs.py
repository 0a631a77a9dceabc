"""The catalog of every topic-level setting Kafka documents, and what the appliance does with each.

Theory of operation
-------------------
Kafka documents one set of topic settings (``LogConfig`` and ``TopicConfig``: ``cleanup.policy`` ...
``unclean.leader.election.enable``).  Clients, admin tools and provisioning scripts send any of them in
CreateTopics and AlterConfigs and read all of them back with DescribeConfigs, so the appliance knows every
one by name.  Each :class:`TopicSetting` row says, once:

* Kafka's facts: the name, the :class:`~ipc.kafka.admin_messages.ConfigType`, the valid values, Kafka's
  default (as Kafka's documentation writes it) and the broker setting it falls back to (Kafka's ``log.*``
  synonym; none for the few Kafka keeps per topic only);
* the appliance's :class:`Behaviour`: **implemented** (it takes effect as in Kafka), **different** (it is
  accepted and what the appliance does instead is said in ``note``), or **refused** for some or all values
  (``refuse`` says why and what to use instead).

**Validation is one step.** The settings the appliance implements are the per-topic rows of
:data:`appliance.config.server_settings.TOPIC_SETTINGS`; the catalog reuses their converters (so a range
is declared once).  Every other row gets a converter built here from the settings kit: Kafka's type and
range, then the row's refusal.  :data:`ALL_TOPIC_SETTINGS` is the one table of both, and the server's
configuration reads every topic setting through it: ``[topics.NAME]``, ``--override topics.NAME.KEY=V``,
CreateTopics' configs and ``appliance topics create --topic-config``.  A bad value is the kit's
:class:`ConfigError` naming the key and the value (``INVALID_CONFIG`` on the wire); a refused value says why.

``docs/configuration.md`` has the table :func:`markdown_table` writes; a test keeps the two equal.
"""

from __future__ import annotations

import enum
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from appliance.config.server_settings import TOPIC_SETTINGS
from appliance.config.settings import (
    Convert,
    Invalid,
    Setting,
    SettingTable,
    boolean,
    choice,
    integer,
    string_list,
    text,
)
from ipc.kafka.admin_messages import ConfigType

__all__ = [
    "ALL_TOPIC_SETTINGS",
    "CATALOG",
    "Behaviour",
    "TopicSetting",
    "find_topic_setting",
    "kafka_value",
    "markdown_table",
]


class Behaviour(enum.Enum):
    IMPLEMENTED = "implemented"
    DIFFERENT = "implemented differently"
    REFUSED = "refused"  # every value but those the row's note names after "unless"


Refuse = Callable[[object], str | None]  # the converted value -> why it is refused, or None


@dataclass(frozen=True, slots=True)
class TopicSetting:
    """One topic-level setting: Kafka's facts and the appliance's behaviour."""

    name: str
    type: ConfigType
    valid: str  # Kafka's valid values, as its documentation writes them
    kafka_default: str  # Kafka's default, as its documentation writes it
    broker: str | None  # the broker setting it falls back to (Kafka's synonym); None: per topic only
    behaviour: Behaviour
    note: str  # what the appliance does (implemented differently) or why it refuses
    convert: Convert  # type and range, then the refusal: the one validation
    sensitive: bool = False  # no topic setting is a password in Kafka
    read_only: bool = False  # every topic setting may be altered in Kafka


# -------------------------------------------------------------------------------------- converters


_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?(-IV[0-9]+)?")


def _version(value: object) -> object:
    word = text(value).strip()
    if not _VERSION.fullmatch(word):
        raise Invalid("expected a Kafka version such as 3.0-IV1")
    return word


def _replica_list(value: object) -> object:
    """Kafka's throttled-replicas list: empty, ``*``, or ``PARTITION:BROKER`` pairs."""
    items = [item for item in string_list(value) if item]
    for item in items:
        if item != "*" and not re.fullmatch(r"[0-9]+:[0-9]+", item):
            raise Invalid(f"{item!r}: expected PARTITION:BROKER pairs or *")
    return ",".join(items)


def _level(low: int, high: int, default: int) -> Convert:
    def convert(value: object) -> object:
        level = integer(min(low, default), high)(value)
        if level != default and not low <= level <= high:  # type: ignore[operator]
            raise Invalid(f"must be between {low} and {high} or equal to {default}")
        return level

    return convert


def _checked(convert: Convert, refuse: Refuse | None) -> Convert:
    if refuse is None:
        return convert

    def checked(value: object) -> object:
        converted = convert(value)
        reason = refuse(converted)
        if reason is not None:
            raise Invalid(reason)
        return converted

    return checked


def _unless(allowed: object, reason: str) -> Refuse:
    return lambda value: None if value == allowed else reason


# -------------------------------------------------------------------------------------- the catalog

_NO_TIERED = "the appliance has no tiered storage: every segment stays in log.dirs"
_NO_THROTTLE = (
    "replication throttling is not built: followers fetch at full speed; leave it empty and "
    "bound a follower with replica.fetch.max.bytes"
)
_NO_RECOMPRESSION = (
    "the appliance never recompresses: each batch is kept as its producer compressed it; "
    "set compression.type on the producer (zstd, lz4, gzip, snappy or none) and keep the "
    "topic's compression.type=producer"
)


def _implemented(
    name: str,
    kafka_type: ConfigType,
    valid: str,
    kafka_default: str,
    broker: str | None,
    note: str = "",
    behaviour: Behaviour = Behaviour.IMPLEMENTED,
) -> TopicSetting:
    found = TOPIC_SETTINGS.find(name)
    assert found is not None and found.setting.name == name, name
    return TopicSetting(
        name, kafka_type, valid, kafka_default, broker, behaviour, note, found.setting.convert
    )


def _other(
    name: str,
    kafka_type: ConfigType,
    valid: str,
    kafka_default: str,
    broker: str | None,
    behaviour: Behaviour,
    note: str,
    convert: Convert,
    refuse: Refuse | None = None,
) -> TopicSetting:
    return TopicSetting(
        name, kafka_type, valid, kafka_default, broker, behaviour, note, _checked(convert, refuse)
    )


_T = ConfigType
_B = Behaviour
CATALOG: Final[tuple[TopicSetting, ...]] = (
    _implemented(
        "cleanup.policy",
        _T.LIST,
        "[compact, delete]",
        "delete",
        "log.cleanup.policy",
        "compact: the cleaner process (appliance.cleaner); compact,delete: retention applies as well",
    ),
    _other(
        "compression.gzip.level",
        _T.INT,
        "[1,...,9] or -1",
        "-1",
        "compression.gzip.level",
        _B.DIFFERENT,
        "accepted and kept; no effect, as in Kafka with compression.type=producer (never recompressed)",
        _level(1, 9, -1),
    ),
    _other(
        "compression.lz4.level",
        _T.INT,
        "[1,...,17]",
        "9",
        "compression.lz4.level",
        _B.DIFFERENT,
        "accepted and kept; no effect, as in Kafka with compression.type=producer (never recompressed)",
        integer(1, 17),
    ),
    _other(
        "compression.type",
        _T.STRING,
        "[uncompressed, zstd, lz4, snappy, gzip, producer]",
        "producer",
        "compression.type",
        _B.REFUSED,
        "unless producer: " + _NO_RECOMPRESSION,
        choice(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        _unless("producer", _NO_RECOMPRESSION),
    ),
    _other(
        "compression.zstd.level",
        _T.INT,
        "[-131072,...,22]",
        "3",
        "compression.zstd.level",
        _B.DIFFERENT,
        "accepted and kept; no effect, as in Kafka with compression.type=producer (never recompressed)",
        integer(-131072, 22),
    ),
    _implemented(
        "delete.retention.ms",
        _T.LONG,
        "[0,...]",
        "86400000 (1 day)",
        "log.cleaner.delete.retention.ms",
    ),
    _implemented(
        "file.delete.delay.ms",
        _T.LONG,
        "[0,...]",
        "60000 (1 minute)",
        "log.segment.delete.delay.ms",
        "a deleted or replaced segment's files are unlinked at once and its descriptors closed this long "
        "after, on a thread; default 1000 here (docs/storage.md)",
        _B.DIFFERENT,
    ),
    _implemented("flush.messages", _T.LONG, "[1,...]", "9223372036854775807", "log.flush.interval.messages"),
    _implemented("flush.ms", _T.LONG, "[0,...]", "9223372036854775807", "log.flush.interval.ms"),
    _other(
        "follower.replication.throttled.replicas",
        _T.LIST,
        "[partitionId]:[brokerId],... or *",
        "",
        None,
        _B.REFUSED,
        "unless empty: " + _NO_THROTTLE,
        _replica_list,
        _unless("", _NO_THROTTLE),
    ),
    _implemented("index.interval.bytes", _T.INT, "[0,...]", "4096 (4 KiB)", "log.index.interval.bytes"),
    _other(
        "leader.replication.throttled.replicas",
        _T.LIST,
        "[partitionId]:[brokerId],... or *",
        "",
        None,
        _B.REFUSED,
        "unless empty: " + _NO_THROTTLE,
        _replica_list,
        _unless("", _NO_THROTTLE),
    ),
    _other(
        "local.retention.bytes",
        _T.LONG,
        "[-2,...]",
        "-2",
        "log.local.retention.bytes",
        _B.REFUSED,
        "unless -2 (follow retention.bytes): " + _NO_TIERED,
        integer(-2),
        _unless(-2, _NO_TIERED + "; set retention.bytes"),
    ),
    _other(
        "local.retention.ms",
        _T.LONG,
        "[-2,...]",
        "-2",
        "log.local.retention.ms",
        _B.REFUSED,
        "unless -2 (follow retention.ms): " + _NO_TIERED,
        integer(-2),
        _unless(-2, _NO_TIERED + "; set retention.ms"),
    ),
    _implemented(
        "max.compaction.lag.ms",
        _T.LONG,
        "[1,...]",
        "9223372036854775807",
        "log.cleaner.max.compaction.lag.ms",
    ),
    _implemented("max.message.bytes", _T.INT, "[0,...]", "1048588", "message.max.bytes"),
    _other(
        "message.downconversion.enable",
        _T.BOOLEAN,
        "",
        "true",
        "log.message.downconversion.enable",
        _B.DIFFERENT,
        "accepted and kept; the appliance never down-converts: it speaks Fetch v4 and later "
        "and keeps RecordBatch v2 only",
        boolean(),
    ),
    _other(
        "message.format.version",
        _T.STRING,
        "[0.8.0, ..., 3.0-IV1, ...]",
        "3.0-IV1",
        "log.message.format.version",
        _B.DIFFERENT,
        "accepted and ignored, as Kafka 3.x ignores it (deprecated; removed in Kafka 4.0): records are "
        "always RecordBatch v2",
        _version,
    ),
    _implemented(
        "message.timestamp.after.max.ms",
        _T.LONG,
        "[0,...]",
        "9223372036854775807",
        "log.message.timestamp.after.max.ms",
        "CreateTime topics only, as in Kafka",
    ),
    _implemented(
        "message.timestamp.before.max.ms",
        _T.LONG,
        "[0,...]",
        "9223372036854775807",
        "log.message.timestamp.before.max.ms",
        "CreateTime topics only, as in Kafka",
    ),
    _implemented(
        "message.timestamp.difference.max.ms",
        _T.LONG,
        "[0,...]",
        "9223372036854775807",
        "log.message.timestamp.difference.max.ms",
        "deprecated in Kafka 3.6 (removed in 4.0): before/after left at their default take its value",
    ),
    _implemented(
        "message.timestamp.type",
        _T.STRING,
        "[CreateTime, LogAppendTime]",
        "CreateTime",
        "log.message.timestamp.type",
    ),
    _implemented(
        "min.cleanable.dirty.ratio",
        _T.DOUBLE,
        "[0,...,1]",
        "0.5",
        "log.cleaner.min.cleanable.ratio",
    ),
    _implemented(
        "min.compaction.lag.ms",
        _T.LONG,
        "[0,...]",
        "0",
        "log.cleaner.min.compaction.lag.ms",
    ),
    _implemented(
        "min.insync.replicas",
        _T.INT,
        "[1,...]",
        "1",
        "min.insync.replicas",
        "at most 100, the appliance's largest replication factor",
        _B.DIFFERENT,
    ),
    _implemented(
        "preallocate",
        _T.BOOLEAN,
        "",
        "false",
        "log.preallocate",
        "the appliance's default is true (fallocate ahead of appends): see docs/storage.md",
        _B.DIFFERENT,
    ),
    _other(
        "remote.log.copy.disable",
        _T.BOOLEAN,
        "",
        "false",
        None,
        _B.REFUSED,
        "unless false: " + _NO_TIERED,
        boolean(),
        _unless(False, _NO_TIERED),
    ),
    _other(
        "remote.log.delete.on.disable",
        _T.BOOLEAN,
        "",
        "false",
        None,
        _B.REFUSED,
        "unless false: " + _NO_TIERED,
        boolean(),
        _unless(False, _NO_TIERED),
    ),
    _other(
        "remote.storage.enable",
        _T.BOOLEAN,
        "",
        "false",
        None,
        _B.REFUSED,
        "unless false: " + _NO_TIERED,
        boolean(),
        _unless(False, _NO_TIERED + "; size the topic with retention.ms and retention.bytes"),
    ),
    _implemented(
        "retention.bytes",
        _T.LONG,
        "",
        "-1",
        "log.retention.bytes",
        "-1 is no limit; below -1 is refused (Kafka reads any negative value as no limit)",
        _B.DIFFERENT,
    ),
    _implemented("retention.ms", _T.LONG, "[-1,...]", "604800000 (7 days)", "log.retention.ms"),
    _implemented("segment.bytes", _T.INT, "[14,...]", "1073741824 (1 GiB)", "log.segment.bytes"),
    _implemented("segment.index.bytes", _T.INT, "[4,...]", "10485760 (10 MiB)", "log.index.size.max.bytes"),
    _other(
        "segment.jitter.ms",
        _T.LONG,
        "[0,...]",
        "0",
        "log.roll.jitter.ms",
        _B.REFUSED,
        "unless 0: segments roll at exactly segment.ms",
        integer(0),
        _unless(0, "segments roll at exactly segment.ms (no jitter); leave segment.jitter.ms at 0"),
    ),
    _implemented("segment.ms", _T.LONG, "[1,...]", "604800000 (7 days)", "log.roll.ms"),
    _other(
        "unclean.leader.election.enable",
        _T.BOOLEAN,
        "",
        "false",
        "unclean.leader.election.enable",
        _B.REFUSED,
        "unless false: a leader is never elected automatically from out-of-sync replicas; a "
        "person promotes one with `appliance replicas promote --unclean` (docs/replication.md)",
        boolean(),
        _unless(
            False,
            "a leader is never elected automatically from out-of-sync replicas; promote one by "
            "hand with `appliance replicas promote --unclean` (docs/replication.md)",
        ),
    ),
)

_BY_NAME: Final = {row.name: row for row in CATALOG}
assert len(_BY_NAME) == len(CATALOG)
assert all(s.name in _BY_NAME for s in TOPIC_SETTINGS if s.name not in ("partitions", "replication.factor"))


def _default(row: TopicSetting) -> object:
    """Kafka's default of ``row`` as a value its converter takes (the number before a "(7 days)" remark)."""
    word = row.kafka_default.split(" (")[0]
    try:
        return tomllib.loads(f"v = {word}")["v"]
    except tomllib.TOMLDecodeError:
        return word


# Every topic setting in one table: the implemented ones with their aliases, then the others by name.  The
# defaults go through the converters, so Kafka's default is never refused.
ALL_TOPIC_SETTINGS: Final = SettingTable(
    (
        *TOPIC_SETTINGS,
        *(
            Setting(row.name, _default(row), row.convert, row.note)
            for row in CATALOG
            if TOPIC_SETTINGS.find(row.name) is None
        ),
    )
)
assert all(s.convert(s.default) is not None for s in ALL_TOPIC_SETTINGS if s.name in _BY_NAME and not s.attr)


def find_topic_setting(name: str) -> TopicSetting | None:
    """The catalog row of a topic setting by its Kafka name, or None."""
    return _BY_NAME.get(name)


def kafka_value(value: object) -> str:
    """A value as Kafka writes it in DescribeConfigs and CreateTopics: lists comma-separated, booleans in
    lower case, numbers in decimal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(kafka_value(item) for item in value)
    return str(value)


def markdown_table() -> str:
    """The table of docs/configuration.md: every topic setting, Kafka's facts, the appliance's behaviour."""
    lines = [
        "| setting | type | valid values | Kafka's default | broker setting | the appliance |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in CATALOG:
        separator = " " if row.behaviour is Behaviour.REFUSED else ": "
        what = row.behaviour.value + (separator + row.note if row.note else "")
        valid = row.valid or "true, false" if row.type == ConfigType.BOOLEAN else row.valid or "any"
        broker = f"`{row.broker}`" if row.broker else "(per topic only)"
        lines.append(
            f"| `{row.name}` | {row.type.name.lower()} | {valid} | {row.kafka_default or '(empty)'} "
            f"| {broker} | {what} |"
        )
    return "\n".join(lines) + "\n"
