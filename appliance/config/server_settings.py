"""The table of the server's settings: every key of the configuration file, its names, default and range.

:data:`SETTINGS` holds the broker-wide settings in the order ``appliance config show`` prints them;
:data:`TOPIC_SETTINGS` the keys of a ``[topics.NAME]`` table: the topic's own ``partitions`` and
``replication.factor`` and every broker setting that may be overridden per topic.  Each row is a
:class:`~appliance.config.settings.Setting`: Kafka's name, the :class:`~appliance.config.server_config.Config`
field it fills, the default as TOML writes it, the converter that checks it, a one-line doc and Kafka's other
names (broker-level spellings of topic settings, older names, scaled units such as ``log.retention.hours``).

The converters here are the server's own types (paths made absolute, listeners, cleanup policies, ring
sizes); numbers and switches use the kit's typed converters, so a quoted number in the file is refused.
Settings whose default depends on others (the sockets under the first log dir, the advertised listeners)
default to :data:`DERIVED`, filled in after loading.  docs/configuration.md documents every row.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from appliance.config.listeners import Listener, parse_listener, split_host_port
from appliance.config.settings import (
    INT_MAX,
    LONG_MAX,
    Alias,
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

__all__ = [
    "CLEANUP_POLICIES",
    "DERIVED",
    "LOG_LEVELS",
    "SETTINGS",
    "TIMESTAMP_TYPES",
    "TOPIC_SETTINGS",
]

TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES: Final = ("delete", "compact")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DERIVED: Final = object()  # default of a setting computed from others after loading
_HOUR_MS: Final = 3_600_000
_MINUTE_MS: Final = 60_000


# -------------------------------------------------------------------------------------- the server's types


def _text_or_unset(value: object) -> object:
    return text(value) or None  # "" unsets


def _group(value: object) -> object:
    """A group name, or a group id as a number or a string of digits; "" unsets."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return _text_or_unset(value)


def _path(value: object) -> str:
    path = text(value)
    if not path:
        raise Invalid("expected a path, got an empty string")
    return os.path.abspath(os.path.expanduser(path))


def _optional_path(value: object) -> object:
    return _path(value) if text(value) else None


def _paths(allow_empty: bool) -> Convert:
    def convert(value: object) -> object:
        items = string_list(value)
        if not items and not allow_empty:
            raise Invalid("expected at least one directory")
        paths = tuple(_path(item) for item in items)
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise Invalid(f"lists {duplicates[0]} twice")
        return paths

    return convert


def _policy(value: object) -> object:
    items = string_list(value)
    if not items:
        raise Invalid("expected delete, compact or both")
    result: list[str] = []
    for item in items:
        if item not in CLEANUP_POLICIES:
            raise Invalid(f"unknown policy {item!r}: expected delete, compact or both")
        if item not in result:
            result.append(item)
    return tuple(sorted(result, key=CLEANUP_POLICIES.index))


def ratio(value: object) -> object:
    """A double from 0 to 1, as a number or its text (CreateTopics carries "0.5")."""
    if isinstance(value, bool):
        raise Invalid("expected a number between 0 and 1, got a boolean")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise Invalid("expected a number between 0 and 1") from None
    if not isinstance(value, int | float) or not 0 <= value <= 1:
        raise Invalid("expected a number between 0 and 1")
    return float(value)


def _bytes_per_second(value: object) -> object:
    """A rate above 0 (Kafka's double): a number or its text; Kafka's default, the largest double, is no
    limit."""
    if isinstance(value, bool):
        raise Invalid("expected a number of bytes per second above 0, got a boolean")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise Invalid("expected a number of bytes per second above 0") from None
    if not isinstance(value, int | float) or not value > 0:
        raise Invalid("expected a number of bytes per second above 0")
    return float(value)


def _fault_list(value: object) -> object:
    return tuple(item for item in string_list(value) if item)


def _ring_bytes(value: object) -> object:
    size = integer(64 * 1024, 2**40)(value)
    assert isinstance(size, int)
    if size % 4096:
        raise Invalid("must be a multiple of 4096 (the page size)")
    return size


def _host_ports(value: object) -> object:
    """One or more HOST:PORT, an array or comma-separated; kept as their comma-separated text."""
    items = [item for item in string_list(value) if item]
    if not items:
        return None
    for item in items:
        if not split_host_port(item)[0]:
            raise Invalid(f"{item!r}: expected HOST:PORT with a host")
    return ",".join(items)


def _listeners(value: object) -> object:
    listeners: tuple[Listener, ...] = tuple(parse_listener(item) for item in string_list(value))
    if not listeners:
        raise Invalid("expected at least one listener such as PLAINTEXT://127.0.0.1:9092")
    names = [listener.name for listener in listeners]
    for name in names:
        if names.count(name) > 1:
            raise Invalid(f"names listener {name} twice: each name (security protocol) may appear once")
    ports = [listener.port for listener in listeners if listener.port]
    for port in ports:
        if ports.count(port) > 1:
            raise Invalid(f"uses port {port} twice")
    return listeners


def _derivable(convert: Callable[[object], object]) -> Convert:
    """A converter for a setting whose default is derived: the sentinel passes through unchanged."""

    def wrapper(value: object) -> object:
        return value if value is DERIVED else convert(value)

    return wrapper


# -------------------------------------------------------------------------------------- the table


def _s(name: str, attr: str, default: object, convert: Convert, doc: str,
       *aliases: str | tuple[str, int]) -> Setting:
    return Setting(name, default, convert, doc,
                   tuple(Alias(a) if isinstance(a, str) else Alias(*a) for a in aliases), attr)


# Per-topic log settings: broker defaults that each [topics.NAME] table may override for its topic.
_PER_TOPIC: Final = (
    _s("segment.bytes", "segment_bytes", 1_073_741_824, integer(14, INT_MAX),
       "roll to a new segment file when the active one would exceed this size", "log.segment.bytes"),
    _s("segment.ms", "segment_ms", 604_800_000, integer(1), "roll the active segment after this age",
       "log.roll.ms", ("log.roll.hours", _HOUR_MS)),
    _s("index.interval.bytes", "index_interval_bytes", 4096, integer(0, INT_MAX),
       "bytes of log between two entries of the sparse offset and time indexes", "log.index.interval.bytes"),
    _s("segment.index.bytes", "segment_index_bytes", 10_485_760, integer(4, INT_MAX),
       "preallocated size of each segment's offset and time index", "log.index.size.max.bytes"),
    _s("retention.ms", "retention_ms", 604_800_000, integer(-1),
       "delete closed segments whose newest record is older than this; -1 keeps them forever",
       "log.retention.ms", ("log.retention.minutes", _MINUTE_MS), ("log.retention.hours", _HOUR_MS)),
    _s("retention.bytes", "retention_bytes", -1, integer(-1),
       "delete the oldest closed segments while a partition is larger than this; -1 = no limit",
       "log.retention.bytes"),
    _s("flush.messages", "flush_messages", LONG_MAX, integer(1),
       "fsync the log after this many records (default: never, rely on replication and the page cache)",
       "log.flush.interval.messages"),
    _s("flush.ms", "flush_ms", LONG_MAX, integer(0),
       "fsync the log when the oldest unflushed record is this old (default: never)",
       "log.flush.interval.ms"),
    _s("preallocate", "preallocate", True, boolean(),
       "reserve the active segment's disk blocks ahead of the appends (fallocate, keeping the file size; "
       "given back on roll and close). Kafka's default is false: see docs/storage.md for why it is on here",
       "log.preallocate"),
    _s("max.message.bytes", "max_message_bytes", 1_048_588, integer(0, INT_MAX),
       "largest record batch accepted (after compression)", "message.max.bytes"),
    _s("message.timestamp.type", "message_timestamp_type", "CreateTime", choice(TIMESTAMP_TYPES),
       "CreateTime keeps the producer's timestamps; LogAppendTime stamps the append time",
       "log.message.timestamp.type"),
    _s("message.timestamp.difference.max.ms", "message_timestamp_difference_max_ms", LONG_MAX, integer(0),
       "CreateTime topics: refuse (INVALID_TIMESTAMP) a batch with a record this much before or after the "
       "broker's clock (deprecated by Kafka 3.6 for the two below, which take it when left at default)",
       "log.message.timestamp.difference.max.ms"),
    _s("message.timestamp.before.max.ms", "message_timestamp_before_max_ms", LONG_MAX, integer(0),
       "CreateTime topics: refuse (INVALID_TIMESTAMP) a batch with a record this much before the broker's "
       "clock", "log.message.timestamp.before.max.ms"),
    _s("message.timestamp.after.max.ms", "message_timestamp_after_max_ms", LONG_MAX, integer(0),
       "CreateTime topics: refuse (INVALID_TIMESTAMP) a batch with a record this much after the broker's "
       "clock", "log.message.timestamp.after.max.ms"),
    _s("file.delete.delay.ms", "file_delete_delay_ms", 1000, integer(0),
       "keep a segment that retention deleted or a clean replaced open this long after its files are "
       "unlinked, then close it on a background thread (Kafka's default is 60000: docs/storage.md)",
       "log.segment.delete.delay.ms"),
    _s("cleanup.policy", "cleanup_policy", "delete", _policy,
       "delete (retention by time and size), compact (the cleaner keeps each key's latest record), or "
       "compact,delete (both)", "log.cleanup.policy"),
    _s("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", 0.5, ratio,
       "the cleaner cleans a compacted log once its dirty bytes are this share of its cleanable bytes",
       "log.cleaner.min.cleanable.ratio"),
    _s("delete.retention.ms", "delete_retention_ms", 86_400_000, integer(0),
       "a compacted log keeps a tombstone this long after the clean that first kept it",
       "log.cleaner.delete.retention.ms"),
    _s("min.compaction.lag.ms", "min_compaction_lag_ms", 0, integer(0),
       "the cleaner leaves records younger than this (by their segment's newest timestamp) uncleaned",
       "log.cleaner.min.compaction.lag.ms"),
    _s("max.compaction.lag.ms", "max_compaction_lag_ms", LONG_MAX, integer(1),
       "a compacted log whose oldest dirty segment is older than this is cleaned whatever its dirty ratio",
       "log.cleaner.max.compaction.lag.ms"),
    _s("min.insync.replicas", "min_insync_replicas", 1, integer(1, 100),
       "acks=all writes need this many in-sync replicas, else NotEnoughReplicas"),
)

SETTINGS: Final = SettingTable((
    # --- where the data lives
    _s("log.dirs", "log_dirs", ["./data"], _paths(allow_empty=False),
       "directories holding partition logs (a partition lives in one of them)", "log.dir"),
    # --- topics created without explicit numbers
    _s("num.partitions", "num_partitions", 1, integer(1, 100_000),
       "partitions of a topic created without a count"),
    _s("default.replication.factor", "default_replication_factor", 1, integer(1, 100),
       "replicas of a topic created without a replication factor"),
    _s("auto.create.topics.enable", "auto_create_topics_enable", True, boolean(),
       "create a topic on first produce or metadata request for it"),
    _s("delete.topic.enable", "delete_topic_enable", True, boolean(),
       "allow DeleteTopics and `appliance topics delete`"),
    # --- network
    _s("listeners", "listeners", "PLAINTEXT://127.0.0.1:9092", _listeners,
       "TCP listeners of the broker, NAME://HOST:PORT, comma-separated or an array"),
    _s("advertised.listeners", "advertised_listeners", DERIVED, _derivable(_listeners),
       "addresses given to clients in metadata; default: listeners (an empty host as this host's name)"),
    _s("node.id", "node_id", 0, integer(0, INT_MAX), "this appliance's broker id in metadata and replication",
       "broker.id"),
    _s("socket.request.max.bytes", "socket_request_max_bytes", 104_857_600, integer(1, INT_MAX),
       "largest request the broker accepts on a socket"),
    # --- per-topic log settings (broker defaults; each may be overridden in [topics.NAME])
    *_PER_TOPIC,
    _s("log.retention.check.interval.ms", "retention_check_interval_ms", 300_000, integer(1),
       "how often the cleaner looks for segments to delete"),
    # --- the log cleaner (appliance.cleaner)
    _s("log.cleaner.enable", "cleaner_enable", True, boolean(),
       "run the cleaner process, which compacts the topics with cleanup.policy compact"),
    _s("log.cleaner.dedupe.buffer.size", "cleaner_dedupe_buffer_size", 134_217_728, integer(1 << 20),
       "memory of the cleaner's key -> offset map; a log with more keys is cleaned in several passes"),
    _s("log.cleaner.io.max.bytes.per.second", "cleaner_io_max_bytes_per_second", 1.7976931348623157e308,
       _bytes_per_second, "bytes the cleaner reads plus writes per second at most (default: no limit)"),
    _s("log.cleaner.backoff.ms", "cleaner_backoff_ms", 15_000, integer(0),
       "how long the cleaner sleeps when no log needs cleaning"),
    _s("log.cleaner.threads", "cleaner_threads", 1, integer(1, 1),
       "cleaner threads: 1 (one cleaner process; more are refused, see docs/configuration.md)"),
    _s("log.dir.min.free.bytes", "log_dir_min_free_bytes", 33_554_432, integer(0),
       "free bytes a log dir keeps: below them its partitions refuse writes with KAFKA_STORAGE_ERROR"),
    # --- replication
    _s("replica.lag.time.max.ms", "replica_lag_time_max_ms", 30_000, integer(1),
       "a follower that has not caught up for this long leaves the ISR"),
    _s("replica.fetch.max.bytes", "replica_fetch_max_bytes", 1_048_576, integer(1, INT_MAX),
       "bytes a follower asks for per partition in one fetch"),
    _s("replica.fetch.wait.max.ms", "replica_fetch_wait_max_ms", 500, integer(0, INT_MAX),
       "how long a caught-up follower's fetch waits at the leader for new records"),
    _s("replica.fetch.backoff.ms", "replica_fetch_backoff_ms", 1000, integer(0, INT_MAX),
       "how long a follower waits after a failed fetch before trying again"),
    _s("replica.socket.timeout.ms", "replica_socket_timeout_ms", 30_000, integer(1, INT_MAX),
       "a follower gives up on a leader's answer after this (plus replica.fetch.wait.max.ms) and reconnects"),
    # --- consumer groups (appliance.coordinator)
    _s("group.min.session.timeout.ms", "group_min_session_timeout_ms", 6000, integer(0, INT_MAX),
       "a JoinGroup asking for a shorter session.timeout.ms is refused with INVALID_SESSION_TIMEOUT"),
    _s("group.max.session.timeout.ms", "group_max_session_timeout_ms", 1_800_000, integer(0, INT_MAX),
       "a JoinGroup asking for a longer session.timeout.ms is refused with INVALID_SESSION_TIMEOUT"),
    _s("group.initial.rebalance.delay.ms", "group_initial_rebalance_delay_ms", 3000, integer(0, INT_MAX),
       "how long an empty group's first rebalance waits for more members (again per late member, up to "
       "the rebalance timeout)"),
    _s("group.max.size", "group_max_size", INT_MAX, integer(1, INT_MAX),
       "a new member joining a group that has this many is refused with GROUP_MAX_SIZE_REACHED"),
    _s("offsets.retention.minutes", "offsets_retention_minutes", 10080, integer(1, INT_MAX),
       "committed offsets of a group empty this long (or, for a group that never had members, not "
       "committed again this long) are deleted"),
    _s("offsets.retention.check.interval.ms", "offsets_retention_check_interval_ms", 600_000,
       integer(1, INT_MAX), "how often the coordinator looks for expired committed offsets"),
    _s("offsets.topic.num.partitions", "offsets_topic_num_partitions", 3, integer(1, 1000),
       "partitions of __consumer_offsets, fixed when it is created (each partition written is a writer "
       "process: docs/configuration.md)"),
    _s("offsets.topic.replication.factor", "offsets_topic_replication_factor", 3, integer(1, 100),
       "replicas of __consumer_offsets, capped at the replicas that exist (1 + appliance.replica.dirs)"),
    _s("offsets.topic.segment.bytes", "offsets_topic_segment_bytes", 104_857_600, integer(14, INT_MAX),
       "segment.bytes of __consumer_offsets"),
    _s("offsets.commit.timeout.ms", "offsets_commit_timeout_ms", 5000, integer(1, INT_MAX),
       "an OffsetCommit waits this long for its records to be in __consumer_offsets, else "
       "COORDINATOR_NOT_AVAILABLE (retriable)"),
    # --- the appliance's own settings
    _s("appliance.ring.bytes", "ring_bytes", 16 * 1024 * 1024, _ring_bytes,
       "largest capacity a producer ring grows to (shared memory per producer and partition)"),
    _s("appliance.ring.initial.bytes", "ring_initial_bytes", 256 * 1024, _ring_bytes,
       "capacity a producer ring starts with; it doubles, up to appliance.ring.bytes, when a producer "
       "waits for room or has a larger frame"),
    _s("appliance.ring.idle.ms", "ring_idle_ms", 30_000, integer(0, INT_MAX),
       "the broker lets go of a partition's ring after this long without produce traffic to it"),
    _s("appliance.shm.group", "shm_group", "", _group,
       "group given access to shared memory and local sockets (mode 0660); unset: owner only (0600)"),
    _s("appliance.control.socket", "control_socket", DERIVED, _derivable(_path),
       "Unix socket where local producers attach; default: <first log dir>/.appliance.sock"),
    _s("appliance.unix.listener", "unix_listener", DERIVED, _derivable(_optional_path),
       "the broker's Unix socket (Kafka protocol); default: <first log dir>/.broker.sock; \"\" disables it"),
    _s("appliance.cleaner.nice", "cleaner_nice", 10, integer(0, 19),
       "niceness of the cleaner process (0-19): the higher, the more CPU the writers and the broker get "
       "first; its I/O goes best-effort at the lowest level whenever it is above 0"),
    _s("appliance.writer.idle.ms", "writer_idle_ms", 60_000, integer(-1, INT_MAX),
       "a partition's writer exits after this long with no producer ring attached; -1: writers always run"),
    _s("appliance.shutdown.timeout.ms", "shutdown_timeout_ms", 30_000, integer(0, INT_MAX),
       "on SIGTERM, how long the supervisor waits for rings to drain before killing children"),
    _s("appliance.log.level", "log_level", "INFO", choice(LOG_LEVELS), "level of the service's log lines"),
    _s("appliance.replica.dirs", "replica_dirs", [], _paths(allow_empty=True),
       "log dirs on other local disks where `appliance serve` runs one replica each"),
    _s("appliance.replica.leader", "replica_leader", "", _host_ports,
       "HOST:PORT of the leader that `appliance replica` follows (several, comma-separated: it follows "
       "whichever of them leads, in the highest leader epoch)"),
    _s("appliance.cluster.secret.file", "cluster_secret_file", "", _optional_path,
       "file holding the shared secret replicas present to the leader"),
    _s("appliance.test.faults", "test_faults", [], _fault_list,
       "tests only: fault points of the control operations to fire, NAME or NAME:COUNT "
       "(appliance.server.faults); never set in production"),
))

TOPIC_SETTINGS: Final = SettingTable((
    _s("partitions", "partitions", DERIVED, integer(1, 100_000),
       "partitions of this topic (default num.partitions)", "num.partitions"),
    _s("replication.factor", "replication_factor", DERIVED, integer(1, 100),
       "replicas of this topic (default default.replication.factor)", "default.replication.factor"),
    *_PER_TOPIC,
))
