"""The appliance's configuration: Kafka's setting names in a TOML file, every one defaulted.

Theory of operation
-------------------
A configuration is built from up to three layers, later layers winning setting by setting:

1. the defaults (Kafka's where Kafka has the setting), so ``appliance serve`` runs with no file;
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

**Names.** The settings, their names and ranges are declared in ``appliance.config.server_settings`` with
the kit of ``appliance.config.settings``.  Each setting has one canonical name and may have aliases: Kafka's
broker-level names of settings that also exist per topic (``log.segment.bytes`` for ``segment.bytes``;
``log.retention.hours`` for ``retention.ms``, scaled to milliseconds) and Kafka's older names (``broker.id``
for ``node.id``).  The appliance's own settings start with ``appliance.``.  An unknown key is a
:class:`ConfigError` naming the key and the nearest known one; a bad value is one naming the layer, the key,
the value and what was expected.

**Topics.** ``[topics.NAME]`` tables declare topics the appliance creates at start: ``partitions``,
``replication.factor`` and any per-topic setting (``retention.ms``, ``segment.bytes``, ...) overriding the
broker default for that topic only.  Every topic setting Kafka documents is known by name and checked by
``appliance.config.topic_configs`` (the catalog: implemented, implemented differently, or refused saying
why); those the appliance does not use are kept in the topic's ``overrides`` only.  On the command
line: ``--override topics.NAME.KEY=VALUE``.

**Overrides.** An override's value is read as a TOML value when it is one (``1000``, ``true``, ``["a"]``)
and kept as text otherwise; when a setting refuses the TOML value, its text is tried, so ``node.id=7`` is
the number 7 and a string setting given ``7`` gets ``"7"``.

Relative paths (``log.dirs``, sockets, files) are made absolute against the working directory at load time,
so a process that changes directory later still finds them.  The result is a frozen :class:`Config`; nothing
below ``appliance`` reads files or the command line, so the supervisor passes values (or a storage
``LogConfig`` from :meth:`Config.log_config`) down.
"""

from __future__ import annotations

import dataclasses
import datetime
import grp
import os
import re
import socket
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from appliance.config.listeners import Listener
from appliance.config.server_settings import DERIVED, SETTINGS, TOPIC_SETTINGS
from appliance.config.settings import Found, Origin, SettingTable, convert, toml_str, toml_value
from appliance.config.topic_configs import ALL_TOPIC_SETTINGS
from ipc.shm import instance_id as shm_instance_id
from storage.errors import ConfigError

if TYPE_CHECKING:
    from storage.log_config import LogConfig

__all__ = [
    "Config",
    "ConfigError",
    "FrozenMap",
    "TopicConfig",
    "check_new_topic_name",
    "check_topic_name",
    "config_from_mapping",
    "load_config",
    "parse_override",
]

SOCKET_PATH_MAX_BYTES: Final = 107  # sizeof(sockaddr_un.sun_path) - 1 for the terminating NUL on Linux

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


INTERNAL_TOPIC_PREFIX: Final = "__"  # Kafka's internal topics: __consumer_offsets, __transaction_state


def check_new_topic_name(name: str, *, internal: bool = False) -> str | None:
    """Why a topic named ``name`` may not be created, or ``None``: :func:`check_topic_name`, and names
    beginning with ``__`` are reserved for the appliance's internal topics.  ``internal=True`` is the
    allowance of the path that creates those topics itself (none yet); every path a client reaches
    (CreateTopics, Metadata auto-creation, ``appliance topics create``, a local producer's attach, the
    configuration's ``[topics.NAME]``) passes False, and gets INVALID_TOPIC_EXCEPTION (ConfigError)."""
    reason = check_topic_name(name)
    if reason is not None or internal or not name.startswith(INTERNAL_TOPIC_PREFIX):
        return reason
    return (f"topic names beginning with {INTERNAL_TOPIC_PREFIX!r} are reserved for the appliance's internal "
            "topics (__consumer_offsets, __transaction_state); choose a name without the leading '__'")


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
    message_timestamp_difference_max_ms: int
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    file_delete_delay_ms: int
    cleanup_policy: tuple[str, ...]
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
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
    message_timestamp_difference_max_ms: int
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    file_delete_delay_ms: int
    cleanup_policy: tuple[str, ...]
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_insync_replicas: int
    retention_check_interval_ms: int
    cleaner_enable: bool
    cleaner_dedupe_buffer_size: int
    cleaner_io_max_bytes_per_second: float
    cleaner_backoff_ms: int
    cleaner_threads: int
    log_dir_min_free_bytes: int
    replica_lag_time_max_ms: int
    replica_fetch_max_bytes: int
    replica_fetch_wait_max_ms: int
    replica_fetch_backoff_ms: int
    replica_socket_timeout_ms: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_initial_rebalance_delay_ms: int
    group_max_size: int
    offsets_retention_minutes: int
    offsets_retention_check_interval_ms: int
    offsets_topic_num_partitions: int
    offsets_topic_replication_factor: int
    offsets_topic_segment_bytes: int
    offsets_commit_timeout_ms: int
    ring_bytes: int
    ring_initial_bytes: int
    ring_idle_ms: int
    shm_group: str | None
    control_socket: str
    unix_listener: str | None
    writer_idle_ms: int  # -1: resident writers (appliance.server.writer_demand)
    cleaner_nice: int  # appliance.cleaner.nice
    shutdown_timeout_ms: int
    log_level: str
    replica_dirs: tuple[str, ...]
    replica_leader: str | None
    cluster_secret_file: str | None
    test_faults: tuple[str, ...]  # tests only: appliance.server.faults
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
            message_timestamp_type=t.message_timestamp_type,
            message_timestamp_difference_max_ms=t.message_timestamp_difference_max_ms,
            message_timestamp_before_max_ms=t.message_timestamp_before_max_ms,
            message_timestamp_after_max_ms=t.message_timestamp_after_max_ms,
            file_delete_delay_ms=t.file_delete_delay_ms,
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
            lines.append(f"{toml_str(name)} = {toml_value('' if value is None else value)}")  # "" unsets
        for topic in self.topics.values():
            lines += ["", f"[topics.{toml_str(topic.name)}]"]
            lines += [f"{toml_str(name)} = {toml_value(value)}" for name, value in topic.overrides.items()]
        return "\n".join(lines) + "\n"


# Every setting has its field, and nothing else is a field.
assert {s.attr for s in SETTINGS} | {"topics", "shm_gid", "source"} == set(Config.__dataclass_fields__)
assert {s.attr for s in TOPIC_SETTINGS} | {"name", "overrides"} == set(TopicConfig.__dataclass_fields__)


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


def _convert(found: Found, key: str, value: object, source: str) -> object:
    origin = Origin(f"{source}:", toml=True)
    if not isinstance(value, _OverrideValue):
        return convert(found, key, value, origin)
    try:
        return convert(found, key, value.value, origin)
    except ConfigError as error:
        refused = error
    if value.text != value.value:
        try:
            return convert(found, key, value.text, origin)
        except ConfigError:
            pass
    raise refused


def _unknown_hint(near: str | None) -> str:
    return f"; did you mean {near!r}?" if near else "; see docs/configuration.md for every setting"


def _flatten(table: Mapping[str, Any], prefix: str, is_key: Callable[[str], bool], source: str,
             out: dict[str, object]) -> None:
    """Nested TOML tables as dotted keys; a table under a known key is that setting's value."""
    for key, value in table.items():
        name = prefix + key
        if isinstance(value, dict) and not is_key(name):
            _flatten(value, name + ".", is_key, source, out)
        elif name in out:
            raise ConfigError(f"{source}: {name!r} is given twice")
        else:
            out[name] = value


def _is_key(table: SettingTable, *extra: str) -> Callable[[str], bool]:
    return lambda name: name in extra or table.find(name) is not None


def _topic_values(topic: str, raw: Mapping[str, object], source: str, seen: _Seen) -> dict[str, object]:
    flat: dict[str, object] = {}
    _flatten(raw, "", _is_key(ALL_TOPIC_SETTINGS), source, flat)
    values: dict[str, object] = {}
    for key, value in flat.items():
        found = ALL_TOPIC_SETTINGS.find(key)
        if found is None:
            hint = _unknown_hint(ALL_TOPIC_SETTINGS.nearest(key))
            head, _, tail = key.partition(".")
            if ALL_TOPIC_SETTINGS.find(tail) is not None:
                hint = f"; a topic name with a dot must be quoted: [topics.\"{topic}.{head}\"]"
            raise ConfigError(f"{source}: unknown topic setting {key!r} for topic {topic!r}{hint}")
        seen.claim(key, found.setting.name, source)
        values[found.setting.name] = _convert(found, key, value, source)
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
    if values["control_socket"] is DERIVED:
        values["control_socket"] = os.path.join(first_dir, ".appliance.sock")
    if values["unix_listener"] is DERIVED:
        values["unix_listener"] = os.path.join(first_dir, ".broker.sock")
    if values["advertised_listeners"] is DERIVED:
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
        reason = check_new_topic_name(topic)
        if reason:
            raise ConfigError(f"{label}: [topics.{toml_str(topic)}]: {reason}")
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
            found = SETTINGS.find(key)
            if found is None:
                near = SETTINGS.nearest(key, ["topics"])
                raise ConfigError(f"{label}: unknown setting {key!r}{_unknown_hint(near)}")
            seen.claim(key, found.setting.name, label)
            values[found.setting.attr] = _convert(found, key, value, label)
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
            topic_key = _split_topic_key(key.removeprefix("topics."))
            if topic_key is None:
                raise ConfigError(f"{label}: expected topics.NAME.SETTING with a topic setting such as "
                                  f"partitions or retention.ms")
            topic, name = topic_key
            layers.append((label, {"topics": {topic: {name: value}}}))
        else:
            layers.append((label, {key: value}))
    return layers


def _split_topic_key(rest: str) -> tuple[str, str] | None:
    """``NAME.SETTING`` as (topic, setting): the longest topic setting name at the end (topics have dots)."""
    for index, char in enumerate(rest):
        if char == "." and index > 0 and ALL_TOPIC_SETTINGS.find(rest[index + 1:]) is not None:
            return rest[:index], rest[index + 1:]
    return None


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
    _flatten(document, "", _is_key(SETTINGS, "topics"), os.fspath(path), flat)
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
    _flatten(settings, "", _is_key(SETTINGS, "topics"), label, flat)
    return _resolve([(label, flat)], None)

