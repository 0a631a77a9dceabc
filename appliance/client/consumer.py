"""``appliance.Consumer``: read partitions by offset, locally through memory maps or remotely over Kafka's
protocol.

Theory of operation
-------------------
A consumer is told which partitions to read -- by :meth:`Consumer.assign`, or by its group
(:meth:`Consumer.subscribe` with ``group.id``: ``appliance.client.group_rebalance``) -- and keeps, per
partition, a *position*: the offset of the next record :meth:`Consumer.poll` returns.  A new assignment
has no position until the first poll resolves one with ``auto.offset.reset`` (``earliest``: the log start
offset, ``latest``: the high watermark, ``none``: :class:`OffsetOutOfRangeError`); :meth:`seek`,
:meth:`seek_to_beginning` and :meth:`seek_to_end` set it explicitly.  A position that falls out of the log
(retention deleted it, or it is past the end) is reset the same way.

Two paths fetch the records, chosen by the configuration:

* **remote** (``bootstrap.servers``): Fetch, ListOffsets and Metadata over TCP to the broker, pipelined (one
  Fetch in flight per leader while the last one is decoded), see ``appliance.client.remote_fetch``;
* **local** (``appliance.data.dir``, ``log.dirs`` or ``appliance.config``): the segment files are
  memory-mapped read-only and read up
  to the high watermark the partition writer publishes in the partition's state page, see
  ``appliance.client.local_fetch``.  Zero copy: the returned arrays are views of the page cache.

With ``group.id`` and :meth:`subscribe`, the group is coordinated over the broker's socket (TCP on the
remote path, the broker's Unix socket ``appliance.unix.listener`` on the local one) by
``appliance.client.group_member``; the records still come through the path above.  A new assignment starts
at the group's committed offset; :meth:`commit` and :meth:`committed` store and read them.

Both end in ``appliance.client.record_arrays``: runs of batches decoded by numba into :class:`RecordArrays`
(the array API, :meth:`poll_batch`), with :class:`ConsumerRecord` tuples built on top (:meth:`poll`).  When
``max_records`` cuts a run, the rest stays buffered for the next poll; :meth:`position` is then the first
buffered record's offset, as in Kafka.

Settings (:data:`SETTINGS`, declared with ``appliance.config.settings``) carry Kafka's consumer names and
defaults; ``appliance.*`` ones are this appliance's own (the local path's address and its wait strategy).
Numbers and switches may be given as text, as in Kafka's clients, and keyword arguments may spell the names
with ``_`` for ``.``::

    Consumer({"bootstrap.servers": "127.0.0.1:9092"})
    Consumer(appliance_data_dir="/var/lib/log-appliance", auto_offset_reset="earliest")
"""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from appliance.client.group_member import GroupError, GroupMember
from appliance.client.group_rebalance import (
    GROUP_SETTINGS,
    GroupSubscription,
    RebalanceCallback,
    commit_failure,
    member_for,
    subscription_for,
)
from appliance.client.local_fetch import (
    DEFAULT_MAX_SLEEP_US,
    DEFAULT_SPIN_US,
    LocalPartition,
    LocalSource,
    list_local_partitions,
    wait_for_data,
)
from appliance.client.record_arrays import ConsumerRecord, DecodedRun, RecordArrays
from appliance.client.remote_fetch import EARLIEST, LATEST, FetchSettings, PartitionFetch, RemoteCluster
from appliance.config.settings import (
    INT_MAX,
    Invalid,
    Origin,
    Setting,
    SettingTable,
    bad_value,
    boolean,
    choice,
    client_pairs,
    did_you_mean,
    file_path,
    integer,
    optional,
    read_settings,
    text,
)
from ipc.shm import instance_id
from storage.errors import (
    ApplianceError,
    ConfigError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)

__all__ = ["SETTINGS", "Consumer", "ConsumerRecord", "GroupError", "RecordArrays", "TopicPartition"]

log = logging.getLogger(__name__)

_NO_PROGRESS_PAUSE_S = 50e-6
_GROUP_POLL_SLICE_MS = 200  # longest a subscribed consumer's poll waits before looking at its group


class TopicPartition(NamedTuple):
    """A partition of a topic.  Plain ``(topic, partition)`` tuples are accepted wherever one is."""

    topic: str
    partition: int


# ----------------------------------------------------------------------------------------- settings


def _dirs(value: object) -> object:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) and i.strip() for i in items):
        raise Invalid("expected a directory or a list of directories")
    return tuple(i.strip() for i in items)


def _servers(value: object) -> object:
    """HOST:PORT[,HOST:PORT...] as one comma-separated string or a list."""
    if isinstance(value, list | tuple):
        return ",".join(text(v) for v in value)
    if not isinstance(value, str):
        raise Invalid("expected HOST:PORT[,HOST:PORT...]")
    return value


SETTINGS: Final = SettingTable((
    # where to read: one of the two
    Setting("bootstrap.servers", None, optional(_servers),
            "remote path: HOST:PORT[,...] of the appliance's broker"),
    Setting("appliance.data.dir", None, optional(file_path),
            "local path: the appliance's data dir (its first log dir), as the Producer names it"),
    Setting("log.dirs", None, optional(_dirs),
            "local path: all the appliance's log dirs (the first is its data dir)"),
    Setting("appliance.config", None, optional(file_path),
            "local path: the appliance's TOML configuration file (log dirs and instance id come from it)"),
    Setting("appliance.local.offline", False, boolean(text=True),
            "local path without a running appliance: read up to the end of the log on disk"),
    # Kafka's consumer settings
    Setting("client.id", "appliance-consumer", text, "name sent to the broker"),
    Setting("auto.offset.reset", "latest", choice(("earliest", "latest", "none")),
            "where to start without a position, or when it is out of range"),
    Setting("fetch.min.bytes", 1, integer(1, INT_MAX, text=True),
            "bytes a fetch waits for (up to fetch.max.wait.ms)"),
    Setting("fetch.max.wait.ms", 500, integer(0, INT_MAX, text=True),
            "longest a fetch waits for fetch.min.bytes"),
    Setting("max.partition.fetch.bytes", 1_048_576, integer(1, INT_MAX, text=True),
            "bytes per partition per fetch (at least one whole batch)"),
    Setting("fetch.max.bytes", 52_428_800, integer(1, INT_MAX, text=True), "bytes per fetch, all partitions"),
    Setting("max.poll.records", 500, integer(1, INT_MAX, text=True), "records one poll() returns at most"),
    Setting("check.crcs", True, boolean(text=True), "verify every batch's CRC-32C"),
    Setting("request.timeout.ms", 30_000, integer(1, INT_MAX, text=True),
            "remote: longest wait for a response"),
    Setting("socket.connection.setup.timeout.ms", 10_000, integer(1, INT_MAX, text=True),
            "remote: connect timeout"),
    Setting("retry.backoff.ms", 100, integer(0, INT_MAX, text=True),
            "remote: pause before retrying after an error"),
    *GROUP_SETTINGS,  # consumer groups: appliance.client.group_rebalance
    # the local path's wait strategy (appliance.client.local_fetch)
    Setting("appliance.poll.spin.us", DEFAULT_SPIN_US, integer(0, 10_000_000, text=True),
            "local: spin this long on the high watermark before sleeping"),
    Setting("appliance.poll.max.sleep.us", DEFAULT_MAX_SLEEP_US, integer(50, 10_000_000, text=True),
            "local: longest sleep between two looks at the high watermark (after 20 ms without data)"),
))
_ORIGIN: Final = Origin("consumer setting")
_UNSUPPORTED: Final = {
    "isolation.level": "only read_uncommitted exists here (no transactions)",
}


def _unknown(key: str) -> ConfigError:
    if key in _UNSUPPORTED:
        return ConfigError(f"consumer setting {key!r}: {_UNSUPPORTED[key]}")
    return ConfigError(f"unknown consumer setting {key!r}{did_you_mean(SETTINGS.nearest(key))}")


def _normalise(config: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting by Kafka's name: the defaults, then ``config``, then ``kwargs`` (``_`` for ``.``)."""
    return {**SETTINGS.defaults(), **read_settings(SETTINGS, client_pairs(config, kwargs), _ORIGIN, _unknown)}


_LOCAL_KEYS = ("appliance.data.dir", "log.dirs", "appliance.config")


def _local_source(values: Mapping[str, Any]) -> LocalSource:
    given = [key for key in _LOCAL_KEYS if values[key] is not None]
    if len(given) > 1:
        raise ConfigError(f"consumer: {' and '.join(given)} both name the local appliance: give one")
    if values["appliance.config"] is not None:
        from appliance.config.server_config import load_config

        log_dirs = load_config(values["appliance.config"]).log_dirs
    elif values["log.dirs"] is not None:
        log_dirs = values["log.dirs"]
    else:
        log_dirs = (values["appliance.data.dir"],)
    log_dirs = tuple(os.path.abspath(d) for d in log_dirs)
    # The appliance names its shared memory after its first log dir
    # (appliance.server.supervisor.shm_names_for).
    return LocalSource(log_dirs, instance_id(log_dirs[0]), bool(values["appliance.local.offline"]))


# ----------------------------------------------------------------------------------------- the consumer


class Consumer:
    """A Kafka-like consumer of assigned partitions; see the module doc.  Not thread-safe."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = _normalise(config, kwargs)
        c = self.config
        remote = c["bootstrap.servers"] is not None
        local = any(c[key] is not None for key in _LOCAL_KEYS)
        if remote == local:
            raise ConfigError(
                "consumer: set bootstrap.servers (read over the network) or appliance.data.dir / log.dirs / "
                "appliance.config (read the appliance's files on this host)"
                + (", not both" if remote else "")
            )
        self._settings = FetchSettings(
            fetch_min_bytes=c["fetch.min.bytes"], fetch_max_wait_ms=c["fetch.max.wait.ms"],
            max_partition_fetch_bytes=c["max.partition.fetch.bytes"], fetch_max_bytes=c["fetch.max.bytes"],
            check_crcs=c["check.crcs"], client_id=c["client.id"], request_timeout_ms=c["request.timeout.ms"],
            connect_timeout_ms=c["socket.connection.setup.timeout.ms"],
            retry_backoff_ms=c["retry.backoff.ms"],
        )  # fmt: skip
        self._cluster: RemoteCluster | None = None
        self._source: LocalSource | None = None
        self._locals: dict[TopicPartition, LocalPartition] = {}
        if remote:
            try:
                self._cluster = RemoteCluster(c["bootstrap.servers"], self._settings)
            except ValueError as exc:
                raise bad_value(_ORIGIN, "bootstrap.servers", c["bootstrap.servers"], str(exc)) from None
        else:
            self._source = _local_source(c)
        self._assignment: list[TopicPartition] = []
        self._fetch_positions: dict[TopicPartition, int | None] = {}  # next offset to fetch; None = reset
        self._buffered: dict[TopicPartition, deque[RecordArrays]] = {}
        self._closed = False
        if c["heartbeat.interval.ms"] >= c["session.timeout.ms"]:
            raise ConfigError(f"consumer: heartbeat.interval.ms={c['heartbeat.interval.ms']} must be lower "
                              f"than session.timeout.ms={c['session.timeout.ms']} (a third of it, typically)")
        self._member: GroupMember | None = None
        self._subscription: GroupSubscription | None = None

    @property
    def is_local(self) -> bool:
        return self._source is not None

    # --- assignment -----------------------------------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions (replacing any earlier assignment).  Raises
        UnknownTopicOrPartitionError for a partition that does not exist."""
        self._check_open()
        if self._subscription is not None:
            raise RuntimeError("consumer: assign() while subscribed: a consumer either subscribes or "
                               "assigns; unsubscribe() first")
        self._set_assignment(partitions)

    def _set_assignment(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        wanted = list(dict.fromkeys(TopicPartition(str(t), int(p)) for t, p in partitions))
        if self._cluster is not None:
            self._cluster.assign(wanted)
        else:
            assert self._source is not None
            for tp in list(self._locals):
                if tp not in wanted:
                    self._locals.pop(tp).close()
            for tp in wanted:
                if tp not in self._locals:
                    self._locals[tp] = LocalPartition(self._source, tp.topic, tp.partition,
                                                      check_crcs=self.config["check.crcs"])
        self._assignment = wanted
        self._fetch_positions = {tp: self._fetch_positions.get(tp) for tp in wanted}
        self._buffered = {tp: self._buffered.get(tp, deque()) for tp in wanted}

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    def partitions_for_topic(self, topic: str) -> list[int]:
        """The topic's partition numbers (remote: from Metadata; local: the partition directories)."""
        self._check_open()
        if self._cluster is not None:
            return self._cluster.partitions_for(topic)
        assert self._source is not None
        found = list_local_partitions(self._source, topic)
        if not found:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r}: no partition directory in the log dirs {', '.join(self._source.log_dirs)}"
            )
        return found

    # --- positions ------------------------------------------------------------------------------------------
    def _tp(self, partition: TopicPartition | tuple[str, int]) -> TopicPartition:
        tp = TopicPartition(str(partition[0]), int(partition[1]))
        if tp not in self._fetch_positions:
            raise UnknownTopicOrPartitionError(f"partition {tp.topic}-{tp.partition} is not assigned to this "
                                               "consumer: assign() it first")
        return tp

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """The next poll reads ``partition`` from ``offset`` (checked against the log at that poll)."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"seek offset {offset}: offsets are >= 0")
        tp = self._tp(partition)
        self._fetch_positions[tp] = offset
        self._buffered[tp].clear()

    def seek_to_beginning(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Move to the log start offset (of ``partitions``, default every assigned one)."""
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Move to the high watermark: the next poll returns only records written after now."""
        self._seek_to(partitions, LATEST)

    def _seek_to(self, partitions: tuple[TopicPartition | tuple[str, int], ...], which: int) -> None:
        self._check_open()
        tps = [self._tp(p) for p in partitions] if partitions else list(self._assignment)
        for tp, offset in self._list_offsets(tps, which).items():
            self._fetch_positions[tp] = offset
            self._buffered[tp].clear()

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record poll() returns for ``partition`` (resolving auto.offset.reset)."""
        self._check_open()
        tp = self._tp(partition)
        buffered = self._buffered[tp]
        if buffered:
            return int(buffered[0].offsets[0])
        self._resolve_positions([tp])
        offset = self._fetch_positions[tp]
        assert offset is not None
        return offset

    def beginning_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[
        TopicPartition, int
    ]:
        """Log start offset of each partition."""
        return self._list_offsets([TopicPartition(str(t), int(p)) for t, p in partitions], EARLIEST)

    def end_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[
        TopicPartition, int
    ]:
        """High watermark of each partition (the offset the next committed record will get)."""
        return self._list_offsets([TopicPartition(str(t), int(p)) for t, p in partitions], LATEST)

    def offsets_for_times(self, timestamps: Mapping[TopicPartition | tuple[str, int], int]) -> dict[
        TopicPartition, int | None
    ]:
        """The offset of the first record whose timestamp is >= the one given (ms), below the high watermark,
        or None, per partition: the broker's ListOffsets answer (``storage.timestamp_search``), read locally
        from the log's files or asked over TCP."""
        self._check_open()
        out: dict[TopicPartition, int | None] = {}
        for partition, timestamp_ms in timestamps.items():
            tp = TopicPartition(str(partition[0]), int(partition[1]))
            if timestamp_ms < 0:
                raise ValueError(f"timestamp {timestamp_ms} for {tp}: timestamps are >= 0 ms")
            if self._cluster is not None:
                offset = self._cluster.list_offsets([tp], timestamp_ms)[tp]
                out[tp] = None if offset < 0 else offset
            else:
                out[tp] = self._local(tp).offset_for_timestamp(timestamp_ms)
        return out

    def highwater(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The high watermark last seen for ``partition`` (local: read now from its state page)."""
        tp = TopicPartition(str(partition[0]), int(partition[1]))
        if self._cluster is not None:
            return self._cluster.high_watermarks.get(tp)
        return self._local(tp).high_watermark()

    def _local(self, tp: TopicPartition) -> LocalPartition:
        part = self._locals.get(tp)
        if part is None:
            assert self._source is not None
            part = LocalPartition(self._source, tp.topic, tp.partition, check_crcs=self.config["check.crcs"])
            self._locals[tp] = part
        return part

    def _list_offsets(self, tps: list[TopicPartition], which: int) -> dict[TopicPartition, int]:
        self._check_open()
        if not tps:
            return {}
        if self._cluster is not None:
            found = self._cluster.list_offsets(tps, which)
            return {tp: found[tp] for tp in tps}
        if which == EARLIEST:
            return {tp: self._local(tp).log_start_offset() for tp in tps}
        return {tp: self._local(tp).high_watermark() for tp in tps}

    def _resolve_positions(self, tps: Iterable[TopicPartition]) -> None:
        missing = [tp for tp in tps if self._fetch_positions.get(tp) is None]
        if missing:
            self._reset(missing, None)

    def _reset(self, tps: list[TopicPartition], error: OffsetOutOfRangeError | None) -> None:
        policy = self.config["auto.offset.reset"]
        if policy == "none":
            if error is not None:
                raise error
            names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)
            raise OffsetOutOfRangeError(
                f"no position for {names} and auto.offset.reset is none: seek() first"
            )
        for tp, offset in self._list_offsets(tps, EARLIEST if policy == "earliest" else LATEST).items():
            self._fetch_positions[tp] = offset
            self._buffered[tp].clear()

    # --- polling --------------------------------------------------------------------------------------------
    def poll_batch(self, timeout_ms: float = 0, max_records: int | None = None) -> list[RecordArrays]:
        """Records as arrays (zero copy on the local path), one :class:`RecordArrays` per run of batches,
        waiting up to ``timeout_ms`` for some.  ``max_records`` (default: no limit but the fetch sizes) caps
        the total; the rest stays buffered for the next poll."""
        self._check_open()
        limit = max_records if max_records is not None else 1 << 62
        if limit <= 0:
            raise ValueError(f"max_records {max_records}: expected >= 1")
        if self._subscription is None:
            return self._poll_once(timeout_ms, limit)
        # In a group, wait in slices: a rebalance announced meanwhile is joined within one slice.
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        slice_ms = min(self.config["heartbeat.interval.ms"], _GROUP_POLL_SLICE_MS)
        while True:
            self._subscription.before_poll()
            left_ms = max(0.0, deadline - time.monotonic()) * 1000
            out = self._poll_once(min(left_ms, slice_ms), limit)
            if out or time.monotonic() >= deadline:
                return out

    def _poll_once(self, timeout_ms: float, limit: int) -> list[RecordArrays]:
        out = self._take_buffered(limit)
        if out:
            return out
        self._resolve_positions(self._assignment)
        if not self._assignment:
            if timeout_ms > 0:
                time.sleep(timeout_ms / 1000)
            return []
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        while True:
            positions = {tp: o for tp, o in self._fetch_positions.items() if o is not None}
            fetched = self._fetch(positions, max(0.0, deadline - time.monotonic()))
            resets: list[tuple[TopicPartition, OffsetOutOfRangeError]] = []
            for result in fetched:
                tp = TopicPartition(result.topic, result.partition)
                if self._fetch_positions.get(tp) != result.fetch_offset:
                    continue  # seeked meanwhile
                if result.error is not None:
                    resets.append((tp, result.error))
                    continue
                run = result.run
                assert run is not None
                if run.next_offset >= 0:
                    self._fetch_positions[tp] = run.next_offset
                    self._buffered[tp].extend(run.chunks)
            for tp, error in resets:
                self._reset([tp], error)
            out = self._take_buffered(limit)
            if out or time.monotonic() >= deadline:
                return out

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records one by one (at most ``max_records``, default ``max.poll.records``), waiting up to
        ``timeout_ms`` for some.  Each is a :class:`ConsumerRecord` (topic, partition, offset, timestamp,
        timestamp_type, key, value, headers)."""
        chunks = self.poll_batch(timeout_ms, max_records or self.config["max.poll.records"])
        if not chunks:
            return []
        enabled = gc.isenabled()
        gc.disable()  # building many tuples triggers collections that scan every live object: 3x slower
        try:
            if len(chunks) == 1:
                return chunks[0].records()
            out: list[ConsumerRecord] = []
            for chunk in chunks:
                out += chunk.records()
            return out
        finally:
            if enabled:
                gc.enable()

    def _take_buffered(self, limit: int) -> list[RecordArrays]:
        out: list[RecordArrays] = []
        for tp in self._assignment:
            queue = self._buffered[tp]
            while queue and limit > 0:
                chunk = queue[0]
                if len(chunk) <= limit:
                    out.append(queue.popleft())
                    limit -= len(chunk)
                else:
                    out.append(chunk.slice(0, limit))
                    queue[0] = chunk.slice(limit)
                    limit = 0
            if limit == 0:
                break
        return out

    def _fetch(self, positions: dict[TopicPartition, int], timeout_s: float) -> list[PartitionFetch]:
        if self._cluster is not None:
            return self._cluster.fetch(positions, timeout_s)  # type: ignore[arg-type]
        return self._fetch_local(positions, timeout_s)

    def _fetch_local(self, positions: dict[TopicPartition, int], timeout_s: float) -> list[PartitionFetch]:
        c = self.config
        start = time.monotonic()
        deadline = start + timeout_s
        min_bytes_deadline = min(deadline, start + c["fetch.max.wait.ms"] / 1000)
        budget = c["fetch.max.bytes"]
        results: list[PartitionFetch] = []
        gathered = 0
        at = dict(positions)
        waited, before = False, 0
        while True:
            for tp, offset in at.items():
                if budget <= 0:
                    break
                part = self._locals[tp]
                try:
                    run = part.read(offset, min(c["max.partition.fetch.bytes"], budget))
                except OffsetOutOfRangeError as error:
                    results.append(PartitionFetch(tp.topic, tp.partition, offset, error=error))
                    continue
                if run.batch_count:
                    results.append(PartitionFetch(tp.topic, tp.partition, offset, run))
                    at[tp] = run.next_offset
                    gathered += run.size_bytes
                    budget -= run.size_bytes
            now = time.monotonic()
            if any(r.error is not None for r in results) or budget <= 0:
                break
            if results and (gathered >= c["fetch.min.bytes"] or now >= min_bytes_deadline):
                break
            if now >= deadline:
                break
            if waited and len(results) == before:
                time.sleep(_NO_PROGRESS_PAUSE_S)  # the high watermark moved, yet no whole batch below it
            waits = [(self._locals[tp], offset) for tp, offset in at.items()]
            until = min_bytes_deadline if results else deadline
            waited = wait_for_data(waits, until - now, spin_us=c["appliance.poll.spin.us"],
                                   max_sleep_us=c["appliance.poll.max.sleep.us"])
            before = len(results)
            if not waited and results:
                break
        return _merge_runs(results)

    # --- the group (appliance.client.group_rebalance drives these) ----------------------------------------
    def subscribe(self, topics: Iterable[str] | str | re.Pattern[str], *,
                  on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        """Join ``group.id`` and read the partitions it gives this member, of ``topics`` (names) or of every
        topic matching a pattern (an ``re.Pattern``, or a string starting with ``^``, as librdkafka reads
        one).  The group is joined at the next poll.  The callbacks are called as
        ``callback(consumer, [TopicPartition, ...])`` from inside poll(): see ``docs/client.md``."""
        self._check_open()
        if self._assignment and self._subscription is None:
            raise RuntimeError("consumer: subscribe() after assign(): a consumer either subscribes or "
                               "assigns; assign([]) first")
        if self._subscription is not None:
            self.unsubscribe()
        member = self._group_member()
        self._subscription = subscription_for(self, member, self.config, topics, on_assign=on_assign,
                                              on_revoke=on_revoke, on_lost=on_lost)
        member.request_rejoin()

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto commit; ``on_revoke`` for what this member had)."""
        self._check_open()
        if self._subscription is not None:
            try:
                self._subscription.leave()
            finally:
                self._subscription = None
                self._set_assignment([])

    def commit(self, offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None, *,
               asynchronous: bool = False,
               callback: Callable[[GroupError | None, dict[tuple[str, int], int]], None] | None = None,
               ) -> None:
        """Commit ``offsets`` (each the offset of the next record to read: the last one processed + 1), or
        the current positions of every assigned partition.  Synchronous: returns once the coordinator has
        stored them in ``__consumer_offsets``, raises GroupError when it refused some.  Asynchronous: sent
        now; ``callback(error or None, offsets)`` is called from a later poll(), commit() or close()."""
        self._check_open()
        member = self._group_member()
        wanted: dict[tuple[str, int], int] = (
            self._group_positions() if offsets is None
            else {TopicPartition(str(tp[0]), int(tp[1])): int(o) for tp, o in offsets.items()})
        group = self.config["group.id"]
        if asynchronous:
            done = None if callback is None else (lambda r: callback(commit_failure(group, r), dict(wanted)))
            member.commit_async(wanted, done)
            return
        if wanted:
            error = commit_failure(group, member.commit(wanted))
            if error is not None:
                raise error

    def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[
        TopicPartition, int | None
    ]:
        """The group's committed offset of each partition, None where nothing is committed."""
        self._check_open()
        tps = [TopicPartition(str(t), int(p)) for t, p in partitions]
        found = self._group_member().committed(tps)
        return {tp: found[tp] for tp in tps}

    def _group_member(self) -> GroupMember:
        if self._member is None:
            self._member = member_for(self.config, self._source.log_dirs if self._source else None)
        return self._member

    def _group_positions(self, partitions: Iterable[tuple[str, int]] | None = None,
                         ) -> dict[tuple[str, int], int]:
        """The position of each assigned partition that has one (buffered records count as unread)."""
        wanted = self._assignment if partitions is None else [TopicPartition(*tp) for tp in partitions]
        out: dict[tuple[str, int], int] = {}
        for tp in wanted:
            buffered = self._buffered.get(tp)
            offset = int(buffered[0].offsets[0]) if buffered else self._fetch_positions.get(tp)
            if offset is not None:
                out[tp] = offset
        return out

    def _group_start_at(self, starts: Mapping[tuple[str, int], int | None]) -> None:
        for key, offset in starts.items():
            tp = TopicPartition(*key)
            if tp in self._fetch_positions:
                self._fetch_positions[tp] = offset
                self._buffered[tp].clear()

    @staticmethod
    def _group_partitions(partitions: Iterable[tuple[str, int]]) -> list[TopicPartition]:
        return [TopicPartition(*tp) for tp in partitions]

    # --- lifetime -------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._subscription is not None:
                self._subscription.leave()
        except ApplianceError as exc:  # the coordinator removes the member after session.timeout.ms
            log.warning("consumer close: leaving group %r failed: %s", self.config["group.id"], exc)
        finally:
            self._subscription = None
            if self._member is not None:
                self._member.close()
        self._closed = True
        for part in self._locals.values():
            part.close()
        self._locals.clear()
        if self._cluster is not None:
            self._cluster.close()
        self._buffered.clear()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = (f"bootstrap.servers={self.config['bootstrap.servers']!r}" if self._cluster is not None
                 else f"log.dirs={self._source.log_dirs if self._source else ()!r}")
        return f"Consumer({where}, {len(self._assignment)} partitions{', closed' if self._closed else ''})"


def _merge_runs(results: list[PartitionFetch]) -> list[PartitionFetch]:
    """Several reads of one partition in one fetch (fetch.min.bytes) become one result, in order."""
    merged: dict[tuple[str, int], PartitionFetch] = {}
    out: list[PartitionFetch] = []
    for result in results:
        key = (result.topic, result.partition)
        first = merged.get(key)
        if first is None or first.error is not None or result.error is not None:
            merged[key] = result
            out.append(result)
            continue
        assert first.run is not None and result.run is not None
        first.run = DecodedRun(first.run.chunks + result.run.chunks, result.run.next_offset,
                               result.run.stop_position, result.run.stop_code,
                               first.run.batch_count + result.run.batch_count,
                               first.run.size_bytes + result.run.size_bytes)
    return out
