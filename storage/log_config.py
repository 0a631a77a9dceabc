"""Per-log settings, with Kafka's topic-level names and defaults.

A :class:`LogConfig` is a frozen dataclass; ``appliance.config`` builds one per topic from the
configuration file (``Config.log_config``), tests build them directly::

    LogConfig(segment_bytes=4096, index_interval_bytes=256)
    LogConfig.from_properties({"segment.bytes": "4096", "retention.ms": -1})

Every field carries its unit; values are checked on construction and a bad one raises
:class:`~storage.errors.ConfigError` naming the Kafka setting, the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from storage.errors import ConfigError

__all__ = ["INT32_MAX", "LONG_MAX", "LogConfig"]

LONG_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1
_DAY_MS: Final = 24 * 60 * 60 * 1000

# Kafka's topic-level name -> (field, minimum, maximum)
_SETTINGS: Final[dict[str, tuple[str, int, int]]] = {
    "segment.bytes": ("segment_bytes", 14, INT32_MAX),
    "segment.ms": ("segment_ms", 1, LONG_MAX),
    "segment.index.bytes": ("segment_index_bytes", 4, INT32_MAX),
    "index.interval.bytes": ("index_interval_bytes", 0, INT32_MAX),
    "retention.ms": ("retention_ms", -1, LONG_MAX),
    "retention.bytes": ("retention_bytes", -1, LONG_MAX),
    "flush.messages": ("flush_messages", 1, LONG_MAX),
    "flush.ms": ("flush_ms", 0, LONG_MAX),
    "max.message.bytes": ("max_message_bytes", 0, INT32_MAX),
    "message.timestamp.difference.max.ms": ("message_timestamp_difference_max_ms", 0, LONG_MAX),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", 0, LONG_MAX),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", 0, LONG_MAX),
    "file.delete.delay.ms": ("file_delete_delay_ms", 0, LONG_MAX),
}
# Kafka's topic-level name -> field, for the true/false settings
_BOOL_SETTINGS: Final[dict[str, str]] = {
    "preallocate": "preallocate",
}
# Kafka's topic-level name -> (field, the allowed values), for the settings that take one of a few names
_CHOICE_SETTINGS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "message.timestamp.type": ("message_timestamp_type", ("CreateTime", "LogAppendTime")),
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log.  Names are Kafka's with ``.`` spelled ``_``.

    * ``segment_bytes``: roll when the active segment would grow past this (a single larger batch still
      goes into an empty segment).
    * ``segment_ms``: roll when the incoming batch's max timestamp is this much newer than the active
      segment's first batch (or, without timestamps, when the segment is this old).
    * ``segment_index_bytes``: the most each ``.index``/``.timeindex`` file may hold (its blocks are
      allocated as entries need them); a full index rolls the segment.
    * ``index_interval_bytes``: bytes of log between two sparse index entries.
    * ``retention_ms`` / ``retention_bytes``: delete closed segments older / beyond this; -1 = never.
    * ``flush_messages`` / ``flush_ms``: fsync after this many records / this long; the default
      (``LONG_MAX``) never fsyncs on a count or timer and leaves durability to replication and the page
      cache (segments are still fsynced in the background when they are rolled, and on close).
    * ``max_message_bytes``: the largest batch a leader append accepts.
    * ``preallocate``: reserve the active segment's disk blocks ahead of the appends, in chunks, without
      changing its size (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``); the unused reservation is released
      when the segment is rolled or closed.  Kafka's default is false (it preallocates the whole segment
      and was added for Windows); here it is true because appending into reserved blocks costs ext4 less
      per write (docs/storage.md).  A file system without ``fallocate`` just skips it.
    * ``message_timestamp_type``: ``CreateTime`` keeps the producer's timestamps, ``LogAppendTime`` has a
      leader stamp each batch with the append time (``storage.timestamp_rules``).
    * ``message_timestamp_difference_max_ms`` / ``..._before_max_ms`` / ``..._after_max_ms``: how far a
      CreateTime record's timestamp may lie before / after the leader's clock (``LONG_MAX``: no limit;
      ``storage.timestamp_rules.effective_limits``).
    * ``file_delete_delay_ms``: how long a segment that retention deleted or a clean replaced stays open
      after its files are unlinked (``storage.segment_deleter``).  Kafka's default is 60000; here 1000,
      because only this process's own readers need it (readers elsewhere hold their own descriptors) and
      the unlinked files' disk blocks come back only when it ends.
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * _DAY_MS
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * _DAY_MS
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    max_message_bytes: int = 1_048_588
    preallocate: bool = True
    message_timestamp_type: str = "CreateTime"
    message_timestamp_difference_max_ms: int = LONG_MAX
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    file_delete_delay_ms: int = 1000

    def __post_init__(self) -> None:
        for name, (attr, low, high) in _SETTINGS.items():
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"log setting {name}: {value!r} is not an integer")
            if not low <= value <= high:
                raise ConfigError(f"log setting {name}: {value} is out of range [{low}, {high}]")
        for name, attr in _BOOL_SETTINGS.items():
            value = getattr(self, attr)
            if not isinstance(value, bool):
                raise ConfigError(f"log setting {name}: {value!r} is not true or false")
        for name, (attr, allowed) in _CHOICE_SETTINGS.items():
            value = getattr(self, attr)
            if value not in allowed:
                raise ConfigError(f"log setting {name}: {value!r} is not one of {', '.join(allowed)}")

    @classmethod
    def from_properties(cls, properties: Mapping[str, object]) -> LogConfig:
        """Build from Kafka topic-config names (``{"segment.bytes": "1048576"}``); unknown names raise."""
        values: dict[str, Any] = {}  # int settings and bool settings
        for name, raw in properties.items():
            if name in _BOOL_SETTINGS:
                values[_BOOL_SETTINGS[name]] = _parse_bool(name, raw)
                continue
            if name in _CHOICE_SETTINGS:
                values[_CHOICE_SETTINGS[name][0]] = str(raw)
                continue
            if name not in _SETTINGS:
                known = ", ".join(sorted([*_SETTINGS, *_BOOL_SETTINGS, *_CHOICE_SETTINGS]))
                raise ConfigError(f"unknown log setting {name!r}; known: {known}")
            try:
                value = int(str(raw), 10) if not isinstance(raw, int) else raw
            except ValueError:
                raise ConfigError(f"log setting {name}: {raw!r} is not an integer") from None
            values[_SETTINGS[name][0]] = value
        return cls(**values)

    def to_properties(self) -> dict[str, int | str]:
        """The settings under Kafka's names (``preallocate`` as a bool, ``message.timestamp.type`` as its
        name)."""
        properties: dict[str, int | str] = {
            name: getattr(self, attr) for name, (attr, _, _) in _SETTINGS.items()}
        properties.update((name, getattr(self, attr)) for name, attr in _BOOL_SETTINGS.items())
        properties.update((name, getattr(self, attr)) for name, (attr, _) in _CHOICE_SETTINGS.items())
        return properties

    def replace(self, **changes: Any) -> LogConfig:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)


def _parse_bool(name: str, raw: object) -> bool:
    """Kafka spells booleans ``true``/``false`` (any case); a Python bool is taken as is."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(f"log setting {name}: {raw!r} is not true or false")
