"""The appliance's configuration: Kafka's setting names in a TOML file, every one defaulted.

Theory of operation
-------------------
A configuration is built from up to three layers, later layers winning setting by setting:

1. the defaults below (Kafka's where Kafka has the setting), so ``appliance serve`` runs with no file;
2. a TOML file (``--config FILE``);
3. ``--override KEY=VALUE`` arguments, in the order given.

**Canonical form.** Settings are top-level keys with Kafka's dotted names quoted, as they read in Kafka's
``server.properties``::

    "log.dirs" = ["/var/lib/log-appliance"]
    "retention.ms" = 86400000

The same key may also be spelled with TOML tables or unquoted dotted keys (``[log]`` then ``dirs = [...]``,
or ``log.dirs = [...]``): tables are flattened by joining their keys with ``.``.  A setting given twice in one
layer (also under two of its names, e.g. ``retention.ms`` and ``log.retention.hours``) is an error, not a
silent precedence rule.

**Names.** Each setting has one canonical name and may have aliases: Kafka's broker-level names of settings
that also exist per topic (``log.segment.bytes`` for ``segment.bytes``; ``log.retention.hours`` for
``retention.ms``, scaled to milliseconds) and Kafka's older names (``broker.id`` for ``node.id``).  The
appliance's own settings start with ``appliance.``.  An unknown key is a :class:`ConfigError` naming the key
and the nearest known one.

**Topics.** ``[topics.NAME]`` tables declare topics the appliance creates at start: ``partitions``,
``replication.factor`` and any per-topic setting (``retention.ms``, ``segment.bytes``, ...) overriding the
broker default for that topic only.  On the command line: ``--override topics.NAME.KEY=VALUE``.

Relative paths (``log.dirs``, sockets, files) are made absolute against the working directory at load time,
so a process that changes directory later still finds them.  The result is a frozen :class:`Config`; nothing
below ``appliance`` reads files or the command line, so the supervisor passes values (or a storage
``LogConfig`` from :meth:`Config.log_config`) down.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import grp
import ipaddress
import os
import re
import socket
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ipc.shm import instance_id as shm_instance_id
from storage.errors import ConfigError

if TYPE_CHECKING:
    from storage.log_config import LogConfig

__all__ = [
    "SETTINGS",
    "TOPIC_SETTINGS",
    "Config",
    "ConfigError",
    "FrozenMap",
    "Listener",
    "Setting",
    "TopicConfig",
    "add_config_arguments",
    "check_topic_name",
    "config_from_args",
    "config_from_mapping",
    "load_config",
    "main",
    "parse_listener",
    "parse_override",
]

LONG_MAX: Final = 2**63 - 1
INT_MAX: Final = 2**31 - 1
SOCKET_PATH_MAX_BYTES: Final = 107  # sizeof(sockaddr_un.sun_path) - 1 for the terminating NUL on Linux
SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES: Final = ("delete", "compact")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DERIVED: Final = object()  # default of a setting computed from others after loading


class _Invalid(ValueError):
    """A value failed its converter; the message says what was expected."""


_V = TypeVar("_V")


class FrozenMap(Mapping[str, _V]):
    """A read-only dict that, unlike ``types.MappingProxyType``, pickles (a Config may cross to a child)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, _V] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> _V:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


# -------------------------------------------------------------------------------------- value converters


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", str: "a string", list: "an array", dict: "a table"}.get(
        type(value), type(value).__name__
    )


def _int(minimum: int, maximum: int = LONG_MAX) -> Callable[[object], object]:
    def convert(value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            quoted = isinstance(value, str) and value.strip().lstrip("-").isdigit()
            hint = "; write it without quotes" if quoted else ""
            raise _Invalid(f"expected an integer, got {_type_name(value)}{hint}")
        if not minimum <= value <= maximum:
            raise _Invalid(f"must be between {minimum} and {maximum}")
        return value

    return convert


def _bool(value: object) -> object:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_type_name(value)}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_type_name(value)}")
    if "\x00" in value:
        raise _Invalid("contains a NUL character")
    return value


def _optional_text(value: object) -> object:
    return _text(value) or None  # "" unsets


def _group(value: object) -> object:
    """A group name, or a group id as a number or a string of digits; "" unsets."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return _optional_text(value)


def _choice(options: Sequence[str]) -> Callable[[object], object]:
    def convert(value: object) -> object:
        text = _text(value)
        for option in options:
            if text.lower() == option.lower():
                return option
        raise _Invalid(f"expected one of {', '.join(options)}")

    return convert


def _string_list(value: object) -> list[str]:
    """A TOML array of strings, or Kafka's comma-separated string."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")] if value.strip() else []
    elif isinstance(value, list):
        items = [_text(item) for item in value]
    else:
        raise _Invalid(f"expected an array of strings or a comma-separated string, got {_type_name(value)}")
    return items


def _path(value: object) -> str:
    text = _text(value)
    if not text:
        raise _Invalid("expected a path, got an empty string")
    return os.path.abspath(os.path.expanduser(text))


def _optional_path(value: object) -> object:
    return _path(value) if _text(value) else None


def _paths(allow_empty: bool) -> Callable[[object], object]:
    def convert(value: object) -> object:
        items = _string_list(value)
        if not items and not allow_empty:
            raise _Invalid("expected at least one directory")
        paths = tuple(_path(item) for item in items)
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise _Invalid(f"lists {duplicates[0]} twice")
        return paths

    return convert


def _policy(value: object) -> object:
    items = _string_list(value)
    if not items:
        raise _Invalid("expected delete, compact or both")
    result: list[str] = []
    for item in items:
        if item not in CLEANUP_POLICIES:
            raise _Invalid(f"unknown policy {item!r}: expected delete, compact or both")
        if item not in result:
            result.append(item)
    return tuple(sorted(result, key=CLEANUP_POLICIES.index))


def _ring_bytes(value: object) -> object:
    size = _int(64 * 1024, 2**40)(value)
    assert isinstance(size, int)
    if size % 4096:
        raise _Invalid("must be a multiple of 4096 (the page size)")
    return size


def _host_ports(value: object) -> object:
    """One or more HOST:PORT, an array or comma-separated; kept as their comma-separated text."""
    items = [item for item in _string_list(value) if item]
    if not items:
        return None
    for item in items:
        if not _split_host_port(item)[0]:
            raise _Invalid(f"{item!r}: expected HOST:PORT with a host")
    return ",".join(items)


def _listeners(value: object) -> object:
    listeners = tuple(parse_listener(item) for item in _string_list(value))
    if not listeners:
        raise _Invalid("expected at least one listener such as PLAINTEXT://127.0.0.1:9092")
    names = [listener.name for listener in listeners]
    for name in names:
        if names.count(name) > 1:
            raise _Invalid(f"names listener {name} twice: each name (security protocol) may appear once")
    ports = [listener.port for listener in listeners if listener.port]
    for port in ports:
        if ports.count(port) > 1:
            raise _Invalid(f"uses port {port} twice")
    return listeners


def _derivable(convert: Callable[[object], object]) -> Callable[[object], object]:
    """A converter for a setting whose default is derived: the sentinel passes through unchanged."""

    def wrapper(value: object) -> object:
        return value if value is _DERIVED else convert(value)

    return wrapper


# -------------------------------------------------------------------------------------- listeners


@dataclass(frozen=True, slots=True)
class Listener:
    """One ``NAME://HOST:PORT`` entry of ``listeners``.  The name is the security protocol."""

    name: str  # PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL
    host: str  # "" binds every interface, as in Kafka; IPv6 without brackets
    port: int  # 0 = an ephemeral port chosen at bind time (tests)

    @property
    def security_protocol(self) -> str:
        return self.name

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def address(self) -> tuple[str, int]:
        """What to pass to ``socket.bind``: every interface for an empty host."""
        return (self.host, self.port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


def _split_host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise _Invalid(f"{text!r}: expected [IPV6]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Invalid(f"{text!r}: {host!r} is not an IPv6 address") from None
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise _Invalid(f"{text!r}: expected HOST:PORT")
        if ":" in host:
            raise _Invalid(f"{text!r}: write an IPv6 host in brackets, [::1]:9092")
        if host and not _HOSTNAME.fullmatch(host):
            raise _Invalid(f"{text!r}: {host!r} is not a host name or address")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise _Invalid(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def parse_listener(text: str) -> Listener:
    """Parse ``NAME://HOST:PORT`` (a bare ``HOST:PORT`` means PLAINTEXT); ``ValueError`` if malformed."""
    text = _text(text).strip()
    name, sep, rest = text.partition("://")
    if not sep:
        name, rest = "PLAINTEXT", text
    name = name.upper()
    if name not in SECURITY_PROTOCOLS:
        known = ", ".join(SECURITY_PROTOCOLS)
        raise _Invalid(f"{text!r}: unknown listener name {name!r}: expected one of {known}")
    host, port = _split_host_port(rest)
    return Listener(name, host, port)


# -------------------------------------------------------------------------------------- the settings


@dataclass(frozen=True, slots=True)
class Setting:
    """One configuration key: canonical name, Config attribute, default (as TOML writes it), converter."""

    name: str
    attr: str
    default: object
    convert: Callable[[object], object]
    doc: str
    aliases: tuple[tuple[str, int], ...] = ()  # (other name, factor applied to an integer value)
    topic_level: bool = False  # may be overridden per topic in [topics.NAME]


def _s(name: str, attr: str, default: object, convert: Callable[[object], object], doc: str,
       *aliases: str | tuple[str, int], topic: bool = False) -> Setting:
    return Setting(name, attr, default, convert, doc,
                   tuple((a, 1) if isinstance(a, str) else a for a in aliases), topic)


_HOUR_MS: Final = 3_600_000
_MINUTE_MS: Final = 60_000

SETTINGS: Final[tuple[Setting, ...]] = (
    # --- where the data lives
    _s("log.dirs", "log_dirs", ["./data"], _paths(allow_empty=False),
       "directories holding partition logs (a partition lives in one of them)", "log.dir"),
    # --- topics created without explicit numbers
    _s("num.partitions", "num_partitions", 1, _int(1, 100_000),
       "partitions of a topic created without a count"),
    _s("default.replication.factor", "default_replication_factor", 1, _int(1, 100),
       "replicas of a topic created without a replication factor"),
    _s("auto.create.topics.enable", "auto_create_topics_enable", True, _bool,
       "create a topic on first produce or metadata request for it"),
    _s("delete.topic.enable", "delete_topic_enable", True, _bool,
       "allow DeleteTopics and `appliance topics delete`"),
    # --- network
    _s("listeners", "listeners", "PLAINTEXT://127.0.0.1:9092", _listeners,
       "TCP listeners of the broker, NAME://HOST:PORT, comma-separated or an array"),
    _s("advertised.listeners", "advertised_listeners", _DERIVED, _derivable(_listeners),
       "addresses given to clients in metadata; default: listeners (an empty host as this host's name)"),
    _s("node.id", "node_id", 0, _int(0, INT_MAX), "this appliance's broker id in metadata and replication",
       "broker.id"),
    _s("socket.request.max.bytes", "socket_request_max_bytes", 104_857_600, _int(1, INT_MAX),
       "largest request the broker accepts on a socket"),
    # --- per-topic log settings (broker defaults; each may be overridden in [topics.NAME])
    _s("segment.bytes", "segment_bytes", 1_073_741_824, _int(14, INT_MAX),
       "roll to a new segment file when the active one would exceed this size", "log.segment.bytes",
       topic=True),
    _s("segment.ms", "segment_ms", 604_800_000, _int(1), "roll the active segment after this age",
       "log.roll.ms", ("log.roll.hours", _HOUR_MS), topic=True),
    _s("index.interval.bytes", "index_interval_bytes", 4096, _int(0, INT_MAX),
       "bytes of log between two entries of the sparse offset and time indexes", "log.index.interval.bytes",
       topic=True),
    _s("segment.index.bytes", "segment_index_bytes", 10_485_760, _int(4, INT_MAX),
       "preallocated size of each segment's offset and time index", "log.index.size.max.bytes", topic=True),
    _s("retention.ms", "retention_ms", 604_800_000, _int(-1),
       "delete closed segments whose newest record is older than this; -1 keeps them forever",
       "log.retention.ms", ("log.retention.minutes", _MINUTE_MS), ("log.retention.hours", _HOUR_MS),
       topic=True),
    _s("retention.bytes", "retention_bytes", -1, _int(-1),
       "delete the oldest closed segments while a partition is larger than this; -1 = no limit",
       "log.retention.bytes", topic=True),
    _s("flush.messages", "flush_messages", LONG_MAX, _int(1),
       "fsync the log after this many records (default: never, rely on replication and the page cache)",
       "log.flush.interval.messages", topic=True),
    _s("flush.ms", "flush_ms", LONG_MAX, _int(0),
       "fsync the log when the oldest unflushed record is this old (default: never)", "log.flush.interval.ms",
       topic=True),
    _s("preallocate", "preallocate", True, _bool,
       "reserve the active segment's disk blocks ahead of the appends (fallocate, keeping the file size; "
       "given back on roll and close). Kafka's default is false: see docs/storage.md for why it is on here",
       "log.preallocate", topic=True),
    _s("max.message.bytes", "max_message_bytes", 1_048_588, _int(0, INT_MAX),
       "largest record batch accepted (after compression)", "message.max.bytes", topic=True),
    _s("message.timestamp.type", "message_timestamp_type", "CreateTime", _choice(TIMESTAMP_TYPES),
       "CreateTime keeps the producer's timestamps; LogAppendTime stamps the append time",
       "log.message.timestamp.type", topic=True),
    _s("cleanup.policy", "cleanup_policy", "delete", _policy,
       "delete (retention), compact (keep the latest record per key) or both", "log.cleanup.policy",
       topic=True),
    _s("min.insync.replicas", "min_insync_replicas", 1, _int(1, 100),
       "acks=all writes need this many in-sync replicas, else NotEnoughReplicas", topic=True),
    _s("log.retention.check.interval.ms", "retention_check_interval_ms", 300_000, _int(1),
       "how often the cleaner looks for segments to delete"),
    # --- replication
    _s("replica.lag.time.max.ms", "replica_lag_time_max_ms", 30_000, _int(1),
       "a follower that has not caught up for this long leaves the ISR"),
    _s("replica.fetch.max.bytes", "replica_fetch_max_bytes", 1_048_576, _int(1, INT_MAX),
       "bytes a follower asks for per partition in one fetch"),
    _s("replica.fetch.wait.max.ms", "replica_fetch_wait_max_ms", 500, _int(0, INT_MAX),
       "how long a caught-up follower's fetch waits at the leader for new records"),
    _s("replica.fetch.backoff.ms", "replica_fetch_backoff_ms", 1000, _int(0, INT_MAX),
       "how long a follower waits after a failed fetch before trying again"),
    _s("replica.socket.timeout.ms", "replica_socket_timeout_ms", 30_000, _int(1, INT_MAX),
       "a follower gives up on a leader's answer after this (plus replica.fetch.wait.max.ms) and reconnects"),
    # --- the appliance's own settings
    _s("appliance.ring.bytes", "ring_bytes", 16 * 1024 * 1024, _ring_bytes,
       "capacity of each producer ring (shared memory per producer and partition)"),
    _s("appliance.shm.group", "shm_group", "", _group,
       "group given access to shared memory and local sockets (mode 0660); unset: owner only (0600)"),
    _s("appliance.control.socket", "control_socket", _DERIVED, _derivable(_path),
       "Unix socket where local producers attach; default: <first log dir>/.appliance.sock"),
    _s("appliance.unix.listener", "unix_listener", _DERIVED, _derivable(_optional_path),
       "the broker's Unix socket (Kafka protocol); default: <first log dir>/.broker.sock; \"\" disables it"),
    _s("appliance.shutdown.timeout.ms", "shutdown_timeout_ms", 30_000, _int(0, INT_MAX),
       "on SIGTERM, how long the supervisor waits for rings to drain before killing children"),
    _s("appliance.log.level", "log_level", "INFO", _choice(LOG_LEVELS), "level of the service's log lines"),
    _s("appliance.replica.dirs", "replica_dirs", [], _paths(allow_empty=True),
       "log dirs on other local disks where `appliance serve` runs one replica each"),
    _s("appliance.replica.leader", "replica_leader", "", _host_ports,
       "HOST:PORT of the leader that `appliance replica` follows (several, comma-separated: it follows "
       "whichever of them leads, in the highest leader epoch)"),
    _s("appliance.cluster.secret.file", "cluster_secret_file", "", _optional_path,
       "file holding the shared secret replicas present to the leader"),
)

_TOPIC_OWN: Final[tuple[Setting, ...]] = (
    _s("partitions", "partitions", _DERIVED, _int(1, 100_000),
       "partitions of this topic (default num.partitions)", "num.partitions"),
    _s("replication.factor", "replication_factor", _DERIVED, _int(1, 100),
       "replicas of this topic (default default.replication.factor)", "default.replication.factor"),
)
TOPIC_SETTINGS: Final[tuple[Setting, ...]] = _TOPIC_OWN + tuple(s for s in SETTINGS if s.topic_level)


def _index(settings: Iterable[Setting]) -> dict[str, tuple[Setting, int]]:
    index: dict[str, tuple[Setting, int]] = {}
    for setting in settings:
        for name, factor in ((setting.name, 1), *setting.aliases):
            assert name not in index, name
            index[name] = (setting, factor)
    return index


_BY_NAME: Final = _index(SETTINGS)
_TOPIC_BY_NAME: Final = _index(TOPIC_SETTINGS)


def _suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else "; see docs/configuration.md for every setting"


# -------------------------------------------------------------------------------------- topics


def check_topic_name(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name, or ``None`` if it is (1-249 of ``[A-Za-z0-9._-]``)."""
    if not name:
        return "a topic name cannot be empty"
    if name in (".", ".."):
        return f"a topic name cannot be {name!r}"
    if len(name) > 249:
        return f"a topic name has at most 249 characters, got {len(name)}"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        return f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's effective settings: its own overrides on top of the broker defaults."""

    name: str
    partitions: int
    replication_factor: int
    segment_bytes: int
    segment_ms: int
    index_interval_bytes: int
    segment_index_bytes: int
    retention_ms: int
    retention_bytes: int
    flush_messages: int
    flush_ms: int
    preallocate: bool
    max_message_bytes: int
    message_timestamp_type: str
    cleanup_policy: tuple[str, ...]
    min_insync_replicas: int
    overrides: Mapping[str, object]  # canonical name -> value set for this topic (not inherited)


# -------------------------------------------------------------------------------------- the config


@dataclass(frozen=True, slots=True)
class Config:
    """The appliance's settings, resolved.  Build it with :func:`load_config`; see docs/configuration.md."""

    log_dirs: tuple[str, ...]
    num_partitions: int
    default_replication_factor: int
    auto_create_topics_enable: bool
    delete_topic_enable: bool
    listeners: tuple[Listener, ...]
    advertised_listeners: tuple[Listener, ...]
    node_id: int
    socket_request_max_bytes: int
    segment_bytes: int
    segment_ms: int
    index_interval_bytes: int
    segment_index_bytes: int
    retention_ms: int
    retention_bytes: int
    flush_messages: int
    flush_ms: int
    preallocate: bool
    max_message_bytes: int
    message_timestamp_type: str
    cleanup_policy: tuple[str, ...]
    min_insync_replicas: int
    retention_check_interval_ms: int
    replica_lag_time_max_ms: int
    replica_fetch_max_bytes: int
    replica_fetch_wait_max_ms: int
    replica_fetch_backoff_ms: int
    replica_socket_timeout_ms: int
    ring_bytes: int
    shm_group: str | None
    control_socket: str
    unix_listener: str | None
    shutdown_timeout_ms: int
    log_level: str
    replica_dirs: tuple[str, ...]
    replica_leader: str | None
    cluster_secret_file: str | None
    topics: Mapping[str, TopicConfig]  # declared in [topics.NAME], in file order
    shm_gid: int | None  # appliance.shm.group resolved to a group id
    source: str | None  # the file read, if any

    @property
    def instance_id(self) -> str:
        """The id naming this appliance's shared memory: :func:`ipc.shm.instance_id` of the first log dir.

        Derived, never configured: every process that finds the appliance by its data directory (a local
        consumer, a restarted supervisor reclaiming a crashed run's objects) must arrive at the same names.
        """
        return shm_instance_id(self.log_dirs[0])

    @property
    def broker_id(self) -> int:
        return self.node_id

    @property
    def shm_mode(self) -> int:
        """Permission bits for shared-memory objects and local sockets: 0600, or 0660 with a group."""
        return 0o600 if self.shm_group is None else 0o660

    def topic(self, name: str, overrides: Mapping[str, object] | None = None) -> TopicConfig:
        """The effective settings of topic ``name``: declared in the file or not, plus ``overrides``.

        ``overrides`` uses topic-level names (``retention.ms``, ``partitions``...), as CreateTopics or
        ``appliance topics create --config`` give them; they are validated like the file's.
        """
        reason = check_topic_name(name)
        if reason:
            raise ConfigError(f"topic {name!r}: {reason}")
        base = self.topics.get(name)
        merged: dict[str, object] = dict(base.overrides) if base else {}
        if overrides:
            merged.update(_topic_values(name, dict(overrides), f"topic {name!r} configs", _Seen()))
        return _build_topic(self, name, merged)

    def log_config(self, topic: str, overrides: Mapping[str, object] | None = None) -> LogConfig:
        """storage's per-log settings for ``topic``."""
        from storage.log_config import LogConfig

        t = self.topic(topic, overrides)
        return LogConfig(
            segment_bytes=t.segment_bytes,
            segment_ms=t.segment_ms,
            index_interval_bytes=t.index_interval_bytes,
            segment_index_bytes=t.segment_index_bytes,
            retention_ms=t.retention_ms,
            retention_bytes=t.retention_bytes,
            flush_messages=t.flush_messages,
            flush_ms=t.flush_ms,
            preallocate=t.preallocate,
            max_message_bytes=t.max_message_bytes,
        )

    def settings(self) -> dict[str, object]:
        """Every setting by canonical name, as TOML would spell it (listeners as strings)."""
        out: dict[str, object] = {}
        for setting in SETTINGS:
            value = getattr(self, setting.attr)
            if setting.attr in ("listeners", "advertised_listeners"):
                value = [str(listener) for listener in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[setting.name] = value
        return out

    def to_toml(self) -> str:
        """The effective configuration in canonical form; loading it back gives an equal Config."""
        lines = ["# effective configuration of the log appliance (canonical form)"]
        for name, value in self.settings().items():
            lines.append(f"{_toml_str(name)} = {_toml_value('' if value is None else value)}")  # "" unsets
        for topic in self.topics.values():
            lines += ["", f"[topics.{_toml_str(topic.name)}]"]
            lines += [f"{_toml_str(name)} = {_toml_value(value)}" for name, value in topic.overrides.items()]
        return "\n".join(lines) + "\n"


# Every setting has its field, and nothing else is a field.
assert {s.attr for s in SETTINGS} | {"topics", "shm_gid", "source"} == set(Config.__dataclass_fields__)
assert {s.attr for s in TOPIC_SETTINGS} | {"name", "overrides"} == set(TopicConfig.__dataclass_fields__)


def _toml_str(text: str) -> str:
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


# -------------------------------------------------------------------------------------- resolution


class _Seen:
    """Which setting each layer set, under which name: a second name for the same setting is an error."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def claim(self, key: str, canonical: str, source: str) -> None:
        previous = self.names.setdefault(canonical, key)
        if previous != key:
            raise ConfigError(f"{source}: {canonical!r} is given twice: as {previous!r} and {key!r}")


@dataclass(frozen=True, slots=True)
class _OverrideValue:
    """An override's value as TOML read it, and its text, tried when the setting wants a string (``id=7``)."""

    value: object
    text: str


def _convert(setting: Setting, factor: int, key: str, value: object, source: str) -> object:
    typed = value.value if isinstance(value, _OverrideValue) else value
    try:
        if factor != 1:
            count = _int(-1, LONG_MAX // factor)(typed)
            assert isinstance(count, int)
            return setting.convert(-1 if count == -1 else count * factor)
        return setting.convert(typed)
    except ValueError as exc:
        if isinstance(value, _OverrideValue) and value.text != typed:
            try:
                return setting.convert(value.text)
            except ValueError:
                pass
        raise ConfigError(f"{source}: {key} = {_shown(typed)}: {exc}") from None


def _shown(value: object) -> str:
    try:
        return _toml_value(value)
    except TypeError:
        return repr(value)


def _flatten(table: Mapping[str, Any], prefix: str, known: Mapping[str, object], source: str,
             out: dict[str, object]) -> None:
    for key, value in table.items():
        name = prefix + key
        if isinstance(value, dict) and name not in known:
            _flatten(value, name + ".", known, source, out)
        elif name in out:
            raise ConfigError(f"{source}: {name!r} is given twice")
        else:
            out[name] = value


def _topic_values(topic: str, raw: Mapping[str, object], source: str, seen: _Seen) -> dict[str, object]:
    flat: dict[str, object] = {}
    _flatten(raw, "", _TOPIC_BY_NAME, source, flat)
    values: dict[str, object] = {}
    for key, value in flat.items():
        found = _TOPIC_BY_NAME.get(key)
        if found is None:
            hint = _suggest(key, _TOPIC_BY_NAME)
            head, _, tail = key.partition(".")
            if tail in _TOPIC_BY_NAME:
                hint = f"; a topic name with a dot must be quoted: [topics.\"{topic}.{head}\"]"
            raise ConfigError(f"{source}: unknown topic setting {key!r} for topic {topic!r}{hint}")
        setting, factor = found
        seen.claim(key, setting.name, source)
        values[setting.name] = _convert(setting, factor, key, value, source)
    return values


def _build_topic(config: Config, name: str, overrides: Mapping[str, object]) -> TopicConfig:
    fields: dict[str, object] = {
        "partitions": config.num_partitions, "replication_factor": config.default_replication_factor,
    }
    for setting in TOPIC_SETTINGS:
        if setting.name in overrides:
            fields[setting.attr] = overrides[setting.name]
        elif setting.attr not in fields:
            fields[setting.attr] = getattr(config, setting.attr)
    return TopicConfig(name=name, overrides=FrozenMap(overrides), **fields)  # type: ignore[arg-type]


def _derive(values: dict[str, object]) -> None:
    """Fill the settings whose defaults depend on others."""
    first_dir = values["log_dirs"][0]  # type: ignore[index]
    if values["control_socket"] is _DERIVED:
        values["control_socket"] = os.path.join(first_dir, ".appliance.sock")
    if values["unix_listener"] is _DERIVED:
        values["unix_listener"] = os.path.join(first_dir, ".broker.sock")
    if values["advertised_listeners"] is _DERIVED:
        here = socket.gethostname()
        values["advertised_listeners"] = tuple(
            dataclasses.replace(listener, host=here) if listener.host in ("", "0.0.0.0", "::") else listener
            for listener in values["listeners"]  # type: ignore[attr-defined]
        )


def _check(values: dict[str, object], source: str) -> int | None:
    """Cross-setting rules; returns the resolved shm group id."""
    for key, attr in (("appliance.control.socket", "control_socket"),
                      ("appliance.unix.listener", "unix_listener")):
        path = values[attr]
        if isinstance(path, str) and len(os.fsencode(path)) > SOCKET_PATH_MAX_BYTES:
            raise ConfigError(
                f"{source}: {key} = {path!r} is {len(os.fsencode(path))} bytes long, over the "
                f"{SOCKET_PATH_MAX_BYTES}-byte limit of a Unix socket path; set {key} to a shorter path "
                "(for example under /run/log-appliance)"
            )
    listener_names = {listener.name for listener in values["listeners"]}  # type: ignore[attr-defined]
    for listener in values["advertised_listeners"]:  # type: ignore[attr-defined]
        if listener.name not in listener_names:
            raise ConfigError(f"{source}: advertised.listeners names {listener.name}, which listeners lacks")
        if listener.host in ("", "0.0.0.0", "::"):
            raise ConfigError(f"{source}: advertised.listeners: {listener} is no address a client can reach")
    overlap = set(values["log_dirs"]) & set(values["replica_dirs"])  # type: ignore[call-overload]
    if overlap:
        raise ConfigError(f"{source}: {sorted(overlap)[0]} is in both log.dirs and appliance.replica.dirs")
    group = values["shm_group"]
    if group is None:
        return None
    assert isinstance(group, str)
    try:
        return grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except (KeyError, OverflowError):
        raise ConfigError(f"{source}: appliance.shm.group = {group!r}: no such group on this host") from None


def _topics_layer(value: object, label: str, seen: dict[str, _Seen],
                  topic_values: dict[str, dict[str, object]]) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{label}: topics must hold tables, one per topic: [topics.NAME]")
    for topic, table in value.items():
        reason = check_topic_name(topic)
        if reason:
            raise ConfigError(f"{label}: [topics.{_toml_str(topic)}]: {reason}")
        if not isinstance(table, dict):
            raise ConfigError(f"{label}: topics.{topic} must be a table ([topics.{topic}])")
        found = _topic_values(topic, table, label, seen.setdefault(topic, _Seen()))
        topic_values.setdefault(topic, {}).update(found)


def _resolve(layers: Sequence[tuple[str, Mapping[str, object]]], source: str | None) -> Config:
    values: dict[str, object] = {s.attr: s.convert(s.default) for s in SETTINGS}
    topic_values: dict[str, dict[str, object]] = {}
    for label, flat in layers:
        seen = _Seen()
        topic_seen: dict[str, _Seen] = {}
        for key, value in flat.items():
            if key == "topics":
                _topics_layer(value, label, topic_seen, topic_values)
                continue
            found = _BY_NAME.get(key)
            if found is None:
                raise ConfigError(f"{label}: unknown setting {key!r}{_suggest(key, [*_BY_NAME, 'topics'])}")
            setting, factor = found
            seen.claim(key, setting.name, label)
            values[setting.attr] = _convert(setting, factor, key, value, label)
    _derive(values)
    shm_gid = _check(values, source or "configuration")
    config = Config(topics=FrozenMap(), shm_gid=shm_gid, source=source,
                    **values)  # type: ignore[arg-type]
    topics = {name: _build_topic(config, name, overrides) for name, overrides in topic_values.items()}
    return dataclasses.replace(config, topics=FrozenMap(topics))


# -------------------------------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[str, object]:
    """Split ``KEY=VALUE``; the value is read as a TOML value when it is one (``1000``, ``true``, ``["a"]``,
    ``"quoted"``), otherwise kept as the plain string (``PLAINTEXT://127.0.0.1:9092``, ``/var/lib/x``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--override {text!r}: expected KEY=VALUE")
    raw = raw.strip()
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return key, raw
    value = parsed.get("v")
    if len(parsed) != 1 or isinstance(value, float | datetime.date | datetime.time | dict):
        return key, raw  # dates, floats and inline tables are not setting values: keep the text
    return key, value


def _override_layers(overrides: Sequence[str]) -> list[tuple[str, Mapping[str, object]]]:
    layers: list[tuple[str, Mapping[str, object]]] = []
    for text in overrides:
        key, parsed = parse_override(text)
        value = _OverrideValue(parsed, text.partition("=")[2].strip())
        label = f"--override {text!r}"
        if key.startswith("topics."):
            rest = key[len("topics."):]
            for name in sorted(_TOPIC_BY_NAME, key=len, reverse=True):
                if rest.endswith("." + name) and len(rest) > len(name) + 1:
                    topic = rest[: -len(name) - 1]
                    layers.append((label, {"topics": {topic: {name: value}}}))
                    break
            else:
                raise ConfigError(f"{label}: expected topics.NAME.SETTING with a topic setting such as "
                                  f"partitions or retention.ms")
        else:
            layers.append((label, {key: value}))
    return layers


# -------------------------------------------------------------------------------------- entry points


def _read_file(path: str | os.PathLike[str]) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read the configuration file: {exc.strerror}") from None
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{os.fspath(path)}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{os.fspath(path)}: not valid TOML: {exc}") from None
    flat: dict[str, object] = {}
    _flatten(document, "", {**_BY_NAME, "topics": None}, os.fspath(path), flat)
    return flat


def load_config(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the TOML file at ``path`` (if given), then each ``KEY=VALUE`` in ``overrides``.

    Raises :class:`ConfigError` naming the file or override, the key and the problem.
    """
    layers: list[tuple[str, Mapping[str, object]]] = []
    source = None
    if path is not None:
        source = os.path.abspath(os.fspath(path))
        layers.append((os.fspath(path), _read_file(path)))
    layers += _override_layers(overrides)
    return _resolve(layers, source)


def config_from_mapping(settings: Mapping[str, object], *, label: str = "configuration") -> Config:
    """A Config from a dict shaped like a parsed TOML file (tests, embedding)."""
    flat: dict[str, object] = {}
    _flatten(settings, "", {**_BY_NAME, "topics": None}, label, flat)
    return _resolve([(label, flat)], None)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` and repeatable ``--override KEY=VALUE`` to a subcommand's parser."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (default: none, defaults)")
    parser.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                        help="set one setting, after the file (repeatable), e.g. --override num.partitions=8")


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config named by the arguments :func:`add_config_arguments` added."""
    return load_config(args.config, args.override)


def main(argv: list[str]) -> int:
    """``appliance config check|show [--config FILE] [--override KEY=VALUE]...``"""
    parser = argparse.ArgumentParser(prog="appliance config", description="check or print the configuration")
    parser.add_argument("action", choices=("check", "show"),
                        help="check: validate and say so; show: print the effective settings as TOML")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"appliance config: {exc}", file=sys.stderr)
        return 1
    if args.action == "show":
        print(config.to_toml(), end="")
    else:
        print(f"configuration OK: {config.source or 'defaults'}, {len(config.topics)} topic(s) declared")
    return 0
