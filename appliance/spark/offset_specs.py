"""Where a read starts and ends, as Spark's Kafka source options say it: parsed from their text.

Three families of options name a starting point, and Spark prefers them in this order (the first one given
wins, the others are not read); the ending point has the same three, for batch reads::

    startingTimestamp            "1700000000000"                  one timestamp (ms) for every partition
    startingOffsetsByTimestamp   {"topic": {"0": 1700000000000}}  a timestamp per partition (all of them)
    startingOffsets              earliest | latest | {"topic": {"0": 23, "1": -2}}  (-2 earliest, -1 latest)

A timestamp becomes, per partition, the offset of the first record whose timestamp is >= it (Kafka's
ListOffsets by timestamp, ``planning.ClusterView.offsets_for_times``).  Where no record is that late, an
ending point is the high watermark, and a starting point follows ``startingOffsetsByTimestampStrategy``:
``error`` (the default) fails the query naming the partition, ``latest`` starts at the high watermark.

``assign`` (``{"topic": [0, 1]}``) names partitions to read instead of subscribing to topics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from storage.errors import ConfigError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "parse_assign",
    "parse_offsets",
    "parse_time_ms",
    "parse_timestamp",
    "parse_timestamps",
]

EARLIEST: Final = -2  # in an offset map: the log start offset (Spark's and Kafka's convention)
LATEST: Final = -1  # in an offset map: the high watermark
_WHERE: Final = "appliance data source: option"
_TIME_UNITS: Final = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                      "d": 86_400_000}
_TIME: Final = re.compile(r"(\d+)\s*([a-z]*)")


@dataclass(frozen=True)
class OffsetSpec:
    """A starting or ending point: ``earliest``/``latest``, an offset map ``{topic: {partition: offset}}``
    (offset -2 / -1 = the log start offset / high watermark; partitions it leaves out take ``default``),
    one timestamp for every partition, or a timestamp per partition.  ``option`` names where it came from."""

    default: int  # EARLIEST or LATEST
    specific: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    timestamp: int | None = None  # startingTimestamp / endingTimestamp
    timestamps: Mapping[str, Mapping[int, int]] | None = None  # *OffsetsByTimestamp
    option: str = ""

    @property
    def by_time(self) -> bool:
        return self.timestamp is not None or self.timestamps is not None

    def offset_for(self, topic: str, partition: int) -> int:
        return self.specific.get(topic, {}).get(partition, self.default)

    def topics(self) -> list[str]:
        """The topics an offset or timestamp map names."""
        return list(self.timestamps or self.specific)

    def describe(self) -> str:
        if self.timestamp is not None:
            return f"{self.option}={self.timestamp}"
        if self.timestamps is not None:
            return f"{self.option}={_dump(self.timestamps)}"
        if not self.specific:
            return "earliest" if self.default == EARLIEST else "latest"
        return _dump(self.specific)


def _dump(spec: Mapping[str, Mapping[int, int]]) -> str:
    return json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in spec.items()})


def parse_offsets(text: str, name: str = "startingOffsets") -> OffsetSpec:
    """``earliest``, ``latest`` or a JSON map ``{"topic": {"0": 23, "1": -2}}``; ConfigError otherwise,
    naming the line and column of a JSON syntax error."""
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST, option=name)
    if word == "latest":
        return OffsetSpec(LATEST, option=name)
    example = '{"topicA": {"0": 23, "1": -2}, "topicB": {"0": -2}}'
    specific = _partition_map(text, name, example, "earliest, latest or ", _offset)
    return OffsetSpec(LATEST if name.startswith("ending") else EARLIEST, specific, option=name)


def parse_timestamps(text: str, name: str) -> OffsetSpec:
    """A JSON map ``{"topic": {"0": 1700000000000}}`` of timestamps (ms) per partition."""
    example = '{"topicA": {"0": 1700000000000, "1": 1700000000000}}'
    timestamps = _partition_map(text, name, example, "", _timestamp)
    default = LATEST if name.startswith("ending") else EARLIEST
    return OffsetSpec(default, timestamps=timestamps, option=name)


def parse_timestamp(text: str, name: str) -> OffsetSpec:
    """One timestamp (ms, a whole number >= 0) for every partition."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{_WHERE} {name}={text!r}: expected a single long value (a timestamp in "
                          "milliseconds since the epoch)") from None
    if value < 0:
        raise ConfigError(f"{_WHERE} {name}={text!r}: a timestamp is >= 0 (milliseconds since the epoch)")
    return OffsetSpec(LATEST if name.startswith("ending") else EARLIEST, timestamp=value, option=name)


def parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    """``assign``: ``{"topicA": [0, 1], "topicB": [2]}`` -> topic -> sorted partitions."""
    example = 'expected e.g. {"topicA": [0, 1], "topicB": [2, 4]}'
    if not text.strip().startswith("{"):
        raise ConfigError(f"{_WHERE} assign={text!r}: no topic partitions to assign; {example}")
    parsed = _json(text, "assign", example)
    out: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions):
            raise ConfigError(f"{_WHERE} assign: topic {topic!r}: expected a list of partition numbers, got "
                              f"{json.dumps(partitions)}")
        if partitions:
            out[topic] = tuple(sorted(set(partitions)))
    if not out:
        raise ConfigError(f"{_WHERE} assign={text!r}: no topic partitions to assign; {example}")
    return out


def parse_time_ms(text: str, name: str) -> int:
    """A duration as Spark writes one (``15m``, ``30s``, ``500ms``, ``1h``, ``2d``; a bare number is ms)."""
    match = _TIME.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in ("", *_TIME_UNITS):
        raise ConfigError(f"{_WHERE} {name}={text!r}: expected a duration such as 15m, 30s, 500ms, 1h or 2d")
    return int(int(match.group(1)) * _TIME_UNITS.get(match.group(2), 1))


def _json(text: str, name: str, example: str, words: str = "") -> dict[str, object]:
    """The option's JSON object of topics (``words``: what else the option accepts, for the message)."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_WHERE} {name}: {text!r} is not {words}valid JSON ({exc.msg} at line "
                          f"{exc.lineno} column {exc.colno}); expected e.g. {example}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{_WHERE} {name}: expected a JSON object of topics, e.g. {example}, got {text!r}")
    return parsed


def _partition_map(text: str, name: str, example: str, words: str,
                   check: Callable[[str, str, str, object], int]) -> dict[str, dict[int, int]]:
    parsed = _json(text, name, example, words)
    out: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(f"{_WHERE} {name}: topic {topic!r}: expected an object of partition -> value, "
                              f"got {json.dumps(partitions)}")
        values: dict[int, int] = {}
        for key, value in partitions.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise ConfigError(f"{_WHERE} {name}: topic {topic!r}: partition {key!r} is not a partition "
                                  "number")
            values[int(key)] = check(name, topic, key, value)
        out[topic] = dict(sorted(values.items()))
    return out


def _offset(name: str, topic: str, partition: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
        raise ConfigError(f"{_WHERE} {name}: topic {topic!r} partition {partition}: offset "
                          f"{json.dumps(value)} is not an offset (>= 0, or -2 earliest, -1 latest)")
    return value


def _timestamp(name: str, topic: str, partition: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{_WHERE} {name}: topic {topic!r} partition {partition}: {json.dumps(value)} is "
                          "not a timestamp (milliseconds since the epoch, >= 0)")
    return value
