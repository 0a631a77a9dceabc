"""``appliance topics create|list|describe|alter|delete-records|delete``: topics of a running appliance.

kafka-topics' form works too (``--create --topic T --partitions N --replication-factor R --config K=V``,
``--describe --under-replicated-partitions``, ...): ``appliance.cli.kafka_forms`` rewrites it into these
subcommands after refusing what kafka-topics refuses; docs/tools.md maps every flag.  As in kafka-topics,
``--topic`` is a regular expression a topic's whole name must match with ``list``, ``describe``, ``alter``
and ``delete`` (``--describe --topic 'orders-.*'``; a ``,`` in it reads as ``|``), and one that matches no
topic is an error unless ``--if-exists``; a topic named as an argument (``describe orders``, ours) is
that topic exactly.  ``describe --under-min-isr-partitions`` / ``--at-min-isr-partitions`` print the
partitions whose ISR is below / exactly the topic's ``min.insync.replicas`` (or that have no leader, for
the first), and the partition reports combine: a partition any of them names is printed.

``alter NAME --partitions N`` grows a topic to N partitions (CreatePartitions; ``kafka-topics.sh --alter``);
``delete-records --topic T --partition P --offset O`` moves a partition's log start offset to O, -1 for
its high watermark (DeleteRecords; ``kafka-delete-records.sh``), or every partition an
``--offset-json-file`` lists in kafka-delete-records' shape (``{"partitions": [{"topic": "t",
"partition": 0, "offset": 10}]}``).  Topic settings are changed with ``appliance configs``.

Where the appliance is, as Kafka's ``kafka-topics.sh`` says it:

* ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (the default, ``127.0.0.1:9092``): the broker, over the
  Kafka protocol (:class:`appliance.client.admin.KafkaAdmin`), from any host; ``--command-config FILE``
  gives the admin client's settings as kafka-topics takes them (``kafka_forms.admin_settings``);
* on the appliance's host, its control socket: ``--control-socket PATH``, ``--data-dir DIR`` (its first log
  dir; the socket is ``DIR/.appliance.sock``) or the configuration that names it (``--appliance-config
  FILE``, ``--override KEY=VALUE``; not ``--config``, which is a topic setting here, as in kafka-topics).
  This path also shows what only the host knows: each partition's writer process (pid, unique memory,
  restarts), a replicated partition's committed high watermark and one line per follower.

Both paths go through a :class:`TopicsBackend`; :func:`open_backend` picks one from the arguments.

Output follows ``kafka-topics.sh --describe``: one line per topic, then one tab-indented line per partition::

    Topic: orders  TopicId: 4f6c...  PartitionCount: 2  ReplicationFactor: 3  Configs: retention.ms=60000
        Topic: orders  Partition: 0  Leader: 0  Replicas: 0,1,2  Isr: 0,1  LogStartOffset: 0  ...
            Follower: 1  InIsr: yes  LogEndOffset: 17  LagRecords: 0  LagMs: 0  LastFetchMsAgo: 3
            Follower: 2  InIsr: no  LogEndOffset: 4  LagRecords: 13  LagMs: 31200  LastFetchMsAgo: 31190

Fields are separated by tabs.  A partition line always has ``Topic Partition Leader Replicas Isr
LogStartOffset LogEndOffset HighWatermark LeaderEpoch BytesOnDisk`` (bytes of its segment files; ``Leader:
none`` and -1 for what a partition without a leader cannot tell); a replicated partition on the local path
adds ``CommittedHighWatermark`` -- what acks=all waits for; consumers see ``HighWatermark`` once every
in-sync follower knows it -- after ``HighWatermark``, then ``WriterPid WriterUniqueMemory WriterRestarts``,
and one line per follower: its log end offset, its lag in records and in milliseconds since it was last
caught up.  A partition whose log is damaged and was not opened (offline: ``appliance repair``) shows
``Leader: none`` and ``Offline: <node>`` as kafka-topics shows offline replicas, and on the local path
``OfflineReason:`` with the file, position, offsets and what to do.  Over ``--bootstrap-server`` the topic
line has no ``TopicId`` and no ``Configs`` (the protocol versions spoken here do not carry them).

Exit status: 0 done; 1 refused or failed (the reason on stderr: unknown topic, topic exists, invalid name,
partition count or setting, no appliance there); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from appliance.broker.log_dirs import partition_size_bytes
from appliance.cli.kafka_forms import UsageError, admin_settings, topic_filter, topics_argv
from appliance.client.admin import (
    DEFAULT_BOOTSTRAP_SERVER,
    KafkaAdmin,
    PartitionDescription,
    TopicDescription,
)
from appliance.config.server_config import load_config, parse_override
from ipc.kafka import ConfigSource, ResourceType
from ipc.kafka_client import BrokerConnectionError, parse_bootstrap_servers
from storage.errors import ApplianceError, ConfigError, TopicExistsError, UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from ipc.control import ControlClient, TopicInfo

__all__ = [
    "ControlBackend",
    "KafkaBackend",
    "TopicsBackend",
    "add_connection_arguments",
    "describe_local",
    "format_topic",
    "main",
    "open_backend",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class TopicsBackend(Protocol):
    """What the commands need from an appliance."""

    def list_topics(self) -> list[str]: ...

    def describe(self, names: Sequence[str] | None) -> list[TopicDescription]: ...

    def create(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, Any]
    ) -> int:
        """Create the topic; return its partition count."""
        ...

    def delete(self, name: str) -> None: ...

    def add_partitions(self, name: str, count: int) -> None: ...

    def min_insync_replicas(self, name: str) -> int:
        """The topic's effective ``min.insync.replicas``."""
        ...

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move the partition's log start offset to ``offset`` (-1: the high watermark); the new one."""
        ...

    def close(self) -> None: ...


class ControlBackend:
    """Topics through the supervisor's control socket (same host, the appliance's user or group)."""

    def __init__(self, client: ControlClient) -> None:
        self.client = client

    def list_topics(self) -> list[str]:
        return sorted(self.client.metadata().topics)

    def describe(self, names: Sequence[str] | None) -> list[TopicDescription]:
        topics = self.client.metadata(list(names) if names else None).topics
        return [describe_local(topics[name]) for name in (names or sorted(topics))]

    def create(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, Any]
    ) -> int:
        topic = self.client.create_topic(
            name, partitions, replication_factor=replication_factor, configs=configs or None
        )
        return topic.partition_count

    def delete(self, name: str) -> None:
        self.client.delete_topic(name)

    def add_partitions(self, name: str, count: int) -> None:
        self.client.create_partitions(name, count)

    def min_insync_replicas(self, name: str) -> int:
        return self.client.metadata([name]).topics[name].min_insync_replicas

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        if offset == -1:
            offset = self.client.metadata([topic]).topics[topic].partitions[partition].high_watermark
        return self.client.delete_records(topic, partition, offset)

    def close(self) -> None:
        self.client.close()


class KafkaBackend:
    """Topics through a broker's Kafka protocol (``--bootstrap-server``)."""

    def __init__(self, admin: KafkaAdmin) -> None:
        self.admin = admin

    def list_topics(self) -> list[str]:
        return self.admin.list_topics()

    def describe(self, names: Sequence[str] | None) -> list[TopicDescription]:
        return self.admin.describe_topics(names or None)

    def with_overrides(self, topic: TopicDescription) -> TopicDescription:
        """``topic`` with its overrides, asked for with DescribeConfigs (Metadata does not carry them)."""
        entries = self.admin.describe_configs(ResourceType.TOPIC, topic.name)
        configs = {e.name: e.value for e in entries.values() if e.source == ConfigSource.TOPIC_CONFIG}
        return dataclasses.replace(topic, configs=configs)

    def create(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, Any]
    ) -> int:
        return self.admin.create_topic(name, partitions, replication_factor, configs)

    def delete(self, name: str) -> None:
        self.admin.delete_topic(name)

    def add_partitions(self, name: str, count: int) -> None:
        self.admin.create_partitions(name, count)

    def min_insync_replicas(self, name: str) -> int:
        entry = self.admin.describe_configs(ResourceType.TOPIC, name, ["min.insync.replicas"])
        return int(entry["min.insync.replicas"].value or 1)

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        return self.admin.delete_records({(topic, partition): offset})[(topic, partition)]

    def close(self) -> None:
        self.admin.close()


def describe_local(topic: TopicInfo) -> TopicDescription:
    """A control-socket :class:`TopicInfo` as a description, with each partition's bytes on disk measured
    in its directory (-1 if the directory cannot be listed)."""
    partitions = []
    for p in topic.partitions:
        try:
            size_bytes = partition_size_bytes(p.directory)
        except OSError:
            size_bytes = -1
        partitions.append(
            PartitionDescription(
                partition=p.partition,
                leader=-1 if p.offline else p.leader,
                leader_epoch=p.leader_epoch,
                replicas=p.replicas or topic.replicas or (p.leader,),
                isr=p.isr or (p.leader,),
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=size_bytes,
                committed_high_watermark=p.committed_high_watermark if topic.replicas[1:] else -1,
                local=p,
                offline_replicas=(p.leader,) if p.offline else (),
                offline_reason=p.offline,
            )
        )
    return TopicDescription(
        name=topic.name,
        partitions=tuple(partitions),
        replication_factor=topic.replication_factor,
        topic_id=topic.topic_id,
        configs=topic.configs,
    )


_LOCAL_OPTIONS = {"control_socket": "--control-socket", "data_dir": "--data-dir",
                  "appliance_config": "--appliance-config"}


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that say which appliance to talk to."""
    where = parser.add_argument_group("where the appliance is (one of; default --bootstrap-server)")
    where.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        help=f"a broker of the appliance, over the Kafka protocol (default {DEFAULT_BOOTSTRAP_SERVER})",
    )
    where.add_argument(
        "--control-socket", metavar="PATH", help="this host's appliance, by its control socket"
    )
    where.add_argument(
        "--data-dir", metavar="DIR", help="this host's appliance, by its first log dir (DIR/.appliance.sock)"
    )
    where.add_argument(
        "--appliance-config", metavar="FILE",
        help="this host's appliance, by its TOML configuration file (its control socket); not --config, "
             "which is a topic setting here, as in kafka-topics",
    )
    where.add_argument(
        "--override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --appliance-config: one setting after the file (repeatable), as for `appliance serve`",
    )
    where.add_argument(
        "--command-config", metavar="FILE",
        help="the admin client's settings, a properties file (kafka-topics): bootstrap.servers, client.id, "
             "request.timeout.ms, socket.connection.setup.timeout.ms, security.protocol=PLAINTEXT",
    )


def check_connection_arguments(args: argparse.Namespace) -> None:
    """ValueError for options that name two appliances (or none coherently)."""
    local = [flag for name, flag in _LOCAL_OPTIONS.items() if getattr(args, name) is not None]
    if args.bootstrap_server is not None and (local or args.override):
        raise ValueError(
            f"--bootstrap-server reaches the broker over TCP, {(local or ['--override'])[0]} the control "
            "socket on this host: give one"
        )
    if len(local) > 1:
        raise ValueError(f"{local[0]} and {local[1]} both name the appliance: give one")
    if args.override and args.control_socket is not None:
        raise ValueError("--override changes a configuration; --control-socket names the socket itself")
    if args.command_config is not None and local:
        raise ValueError(f"--command-config holds the settings of a client over TCP, {local[0]} names the "
                         "control socket on this host: give one")
    if args.command_config is not None:
        args.admin = admin_settings(args.command_config)
    if args.bootstrap_server is not None:
        parse_bootstrap_servers(args.bootstrap_server)


def open_backend(args: argparse.Namespace) -> TopicsBackend:
    """The backend the connection options name.  ApplianceError if the appliance cannot be reached."""
    path = args.control_socket
    if path is None and args.data_dir is not None:
        path = os.path.join(args.data_dir, ".appliance.sock")
    if path is None and (args.appliance_config is not None or args.override):
        path = load_config(args.appliance_config, args.override).control_socket
    if path is not None:
        from ipc.control import ControlClient  # (only the local path needs it: it loads numba)

        return ControlBackend(ControlClient.connect(path, timeout_s=60.0))
    given = getattr(args, "admin", None)
    if given is None:
        return KafkaBackend(KafkaAdmin(args.bootstrap_server or DEFAULT_BOOTSTRAP_SERVER,
                                       client_id="appliance-topics"))
    servers = args.bootstrap_server or given.bootstrap_servers or DEFAULT_BOOTSTRAP_SERVER
    return KafkaBackend(KafkaAdmin(servers, client_id=given.client_id or "appliance-topics",
                                   request_timeout_ms=given.request_timeout_ms or 30_000,
                                   connect_timeout_ms=given.connect_timeout_ms or 10_000))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance topics", description="manage the topics of an appliance",
        epilog="kafka-topics' form works too: --create|--list|--describe|--alter|--delete --topic NAME "
               "[--partitions N] [--replication-factor R] [--config K=V]... (docs/tools.md)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    create = commands.add_parser("create", help="create a topic")
    create.add_argument("name", help="the topic (kafka-topics: --create --topic NAME)")
    create.add_argument("--partitions", type=int, help="partition count (default: num.partitions)")
    create.add_argument(
        "--replication-factor", type=int, help="replicas (default: default.replication.factor)"
    )
    create.add_argument(
        "--config",
        "--topic-config",
        dest="topic_config",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a topic setting, e.g. retention.ms=86400000 (repeatable), as kafka-topics --config",
    )
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    listing = commands.add_parser("list", help="print the topic names")
    describe = commands.add_parser("describe", help="print topics with their partitions and offsets")
    describe.add_argument("names", nargs="*", metavar="NAME", help="topics to describe (default: all)")
    describe.add_argument("--under-replicated-partitions", action="store_true",
                          help="only the partitions with fewer in-sync replicas than replicas")
    describe.add_argument("--unavailable-partitions", action="store_true",
                          help="only the partitions without a leader")
    describe.add_argument("--under-min-isr-partitions", action="store_true",
                          help="only the partitions with fewer in-sync replicas than min.insync.replicas")
    describe.add_argument("--at-min-isr-partitions", action="store_true",
                          help="only the partitions with exactly min.insync.replicas in-sync replicas")
    describe.add_argument("--topics-with-overrides", action="store_true",
                          help="only the topic lines of topics with settings of their own")
    for sub in (listing, describe):
        sub.add_argument("--exclude-internal", action="store_true", help="leave out __consumer_offsets ...")
    alter = commands.add_parser("alter", help="add partitions to a topic")
    alter.add_argument("name", nargs="?", help="the topic (or --topic REGEX)")
    alter.add_argument("--partitions", type=int, required=True, help="the new partition count, larger")
    alter.add_argument("--if-exists", action="store_true", help="succeed if the topic does not exist")
    records = commands.add_parser("delete-records", help="delete a partition's records below an offset")
    records.add_argument("--topic", help="the topic")
    records.add_argument("--partition", type=int, help="the partition")
    records.add_argument("--offset", type=int, help="the new log start offset (-1: the high watermark)")
    records.add_argument("--offset-json-file", metavar="FILE", help="kafka-delete-records' JSON instead")
    delete = commands.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name", nargs="?", help="the topic (or --topic REGEX)")
    for sub in (describe, delete):
        sub.add_argument("--if-exists", action="store_true", help="succeed if the topic does not exist")
    for sub in (listing, describe, alter, delete):
        sub.add_argument("--topic", metavar="REGEX",
                         help="the topics whose whole name matches REGEX (kafka-topics' --topic)")
    for sub in (create, listing, describe, alter, records, delete):
        add_connection_arguments(sub)
    return parser


def format_topic(topic: TopicDescription) -> str:
    """``kafka-topics --describe``-style lines for one topic (no trailing newline)."""
    head = [f"Topic: {topic.name}"]
    if topic.topic_id is not None:
        head.append(f"TopicId: {topic.topic_id}")
    head += [f"PartitionCount: {topic.partition_count}", f"ReplicationFactor: {topic.replication_factor}"]
    if topic.configs is not None:
        head.append("Configs: " + ",".join(f"{k}={_plain(v)}" for k, v in sorted(topic.configs.items())))
    lines = ["\t".join(head)]
    for p in topic.partitions:
        committed = ""
        if p.committed_high_watermark >= 0:
            committed = f"\tCommittedHighWatermark: {p.committed_high_watermark}"
        line = (
            f"\tTopic: {topic.name}\tPartition: {p.partition}\tLeader: {_leader(p.leader)}\t"
            f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\tLogStartOffset: {p.log_start_offset}\t"
            f"LogEndOffset: {p.log_end_offset}\tHighWatermark: {p.high_watermark}{committed}\t"
            f"LeaderEpoch: {p.leader_epoch}\tBytesOnDisk: {p.size_bytes}"
        )
        if p.offline_replicas:  # kafka-topics prints the offline replicas so
            line += f"\tOffline: {_ids(p.offline_replicas)}"
        if p.offline_reason:
            line += f"\tOfflineReason: {p.offline_reason}"
        local = p.local
        if local is not None and not p.offline_reason:
            memory = f"{local.writer_uss_bytes / 2**20:.1f}MiB" if local.writer_uss_bytes else "-"
            writer = local.writer_pid or "idle"  # no writer runs while nobody writes (writer_demand)
            line += (
                f"\tWriterPid: {writer}\tWriterUniqueMemory: {memory}\t"
                f"WriterRestarts: {local.writer_restarts}"
            )
        lines.append(line)
        for f in local.followers if local is not None else ():
            lines.append(
                f"\t\tFollower: {f.replica_id}\tInIsr: {'yes' if f.in_isr else 'no'}\t"
                f"LogEndOffset: {f.log_end_offset}\tLagRecords: {f.lag_records}\tLagMs: {f.lag_ms}\t"
                f"LastFetchMsAgo: {f.last_fetch_ms_ago}"
            )
    return "\n".join(lines)


def _leader(node_id: int) -> str:
    return "none" if node_id < 0 else str(node_id)


def _ids(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def _plain(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _topic_configs(items: Sequence[str]) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for item in items:
        key, value = parse_override(item)
        configs[key] = value
    return configs


def _records_to_delete(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of each partition ``delete-records`` names; ValueError if unclear."""
    given = (args.topic, args.partition, args.offset)
    if args.offset_json_file is None:
        if any(v is None for v in given):
            raise ValueError("give --topic, --partition and --offset, or --offset-json-file FILE")
        return [(args.topic, args.partition, args.offset)]
    if any(v is not None for v in given):
        raise ValueError("--offset-json-file lists the partitions: no --topic, --partition or --offset")
    try:
        with open(args.offset_json_file, encoding="utf-8") as f:
            document = json.load(f)
        return [(str(p["topic"]), int(p["partition"]), int(p["offset"])) for p in document["partitions"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--offset-json-file {args.offset_json_file}: {exc!r}; expected "
                         '{"partitions": [{"topic": T, "partition": P, "offset": O}, ...]}') from None


@contextlib.contextmanager
def _unless_missing(if_exists: bool) -> Iterator[None]:
    """``--if-exists``: an unknown topic is not an error (nothing done, nothing printed)."""
    try:
        yield
    except UnknownTopicOrPartitionError:
        if not if_exists:
            raise


def _selected(backend: TopicsBackend, args: argparse.Namespace) -> list[str] | None:
    """The topics a command acts on: those ``--topic`` (a regular expression, as kafka-topics reads it)
    matches, sorted, ``--exclude-internal`` applied; else the topics named, or None (every topic).  A
    ``--topic`` that matches nothing is an error (UnknownTopicOrPartitionError) unless ``--if-exists``."""
    names = args.names if args.command == "describe" else [args.name] if getattr(args, "name", None) else []
    if args.topic is None:
        return names or None
    pattern = topic_filter(args.topic)
    exclude = getattr(args, "exclude_internal", False)
    found = [n for n in sorted(backend.list_topics())
             if pattern.fullmatch(n) and not (exclude and n.startswith("__"))]
    if not found and not getattr(args, "if_exists", False):
        raise UnknownTopicOrPartitionError(f"Topic '{args.topic}' does not exist as expected (no topic's "
                                           "name matches it; --topic is a regular expression)")
    return found


def _partition_reports(args: argparse.Namespace) -> bool:
    return bool(args.under_replicated_partitions or args.unavailable_partitions
                or args.under_min_isr_partitions or args.at_min_isr_partitions)


def _partition_reported(args: argparse.Namespace, partition: PartitionDescription, min_isr: int) -> bool:
    """Whether one of kafka-topics' partition reports asked for names ``partition``."""
    isr = len(partition.isr)
    return bool((args.under_replicated_partitions and isr < len(partition.replicas))
                or (args.unavailable_partitions and partition.leader < 0)
                or (args.under_min_isr_partitions and (partition.leader < 0 or isr < min_isr))
                or (args.at_min_isr_partitions and isr == min_isr))


def _describe(backend: TopicsBackend, args: argparse.Namespace, out: TextIO) -> None:
    """``describe``, whole or kafka-topics' reports: partition lines only for the partitions a partition
    report names, topic lines only for topics with overrides."""
    partition_reports = _partition_reports(args)
    with _unless_missing(args.if_exists):
        names = _selected(backend, args)
        if names == []:
            return
        topics = [t for t in backend.describe(names)
                  if not (args.exclude_internal and t.name.startswith("__"))]
        for topic in topics:
            if partition_reports:
                min_isr = (backend.min_insync_replicas(topic.name)
                           if args.under_min_isr_partitions or args.at_min_isr_partitions else 0)
                wanted = tuple(p for p in topic.partitions if _partition_reported(args, p, min_isr))
                lines = format_topic(dataclasses.replace(topic, partitions=wanted)).split("\n")
                for line in lines[1:]:  # the partition lines only, as kafka-topics prints these reports
                    print(line, file=out)
            elif args.topics_with_overrides:
                if topic.configs is None and isinstance(backend, KafkaBackend):
                    topic = backend.with_overrides(topic)
                if topic.configs:
                    print(format_topic(topic).split("\n")[0], file=out)  # the topic line only
            else:
                print(format_topic(topic), file=out)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run one parsed command; return the exit status."""
    try:
        backend = open_backend(args)
    except BrokerConnectionError as exc:
        print(
            f"appliance topics: {exc} (is the appliance running there? --bootstrap-server HOST:PORT names "
            f"another broker, --data-dir DIR this host's appliance)",
            file=err,
        )
        return EXIT_FAILED
    except ApplianceError as exc:
        print(f"appliance topics: {exc}", file=err)
        return EXIT_FAILED
    try:
        if args.command == "create":
            try:
                count = backend.create(
                    args.name, args.partitions, args.replication_factor, _topic_configs(args.topic_config)
                )
            except TopicExistsError:
                if not args.if_not_exists:
                    raise
                print(f"Topic {args.name} already exists.", file=out)
                return EXIT_OK
            print(f"Created topic {args.name} with {count} partitions.", file=out)
        elif args.command == "list":
            names = backend.list_topics() if args.topic is None else _selected(backend, args) or []
            for name in names:
                if not (args.exclude_internal and name.startswith("__")):
                    print(name, file=out)
        elif args.command == "describe":
            _describe(backend, args, out)
        elif args.command == "alter":
            with _unless_missing(args.if_exists):
                for name in _selected(backend, args) or ():
                    backend.add_partitions(name, args.partitions)
                    print(f"Topic {name} now has {args.partitions} partitions.", file=out)
        elif args.command == "delete-records":
            for topic, partition, offset in args.records:
                low = backend.delete_records(topic, partition, offset)
                print(f"Partition: {topic}-{partition}\tLow watermark: {low}", file=out)
        else:
            with _unless_missing(args.if_exists):
                for name in _selected(backend, args) or ():
                    backend.delete(name)
                    print(f"Deleted topic {name}.", file=out)
    except (ApplianceError, OSError) as exc:
        print(f"appliance topics {args.command}: {exc}", file=err)
        return EXIT_FAILED
    except UsageError as exc:
        print(f"appliance topics {args.command}: {exc}", file=err)
        return EXIT_USAGE
    finally:
        backend.close()
    return EXIT_OK


def main(argv: list[str]) -> int:
    """``appliance topics COMMAND ...``"""
    parser = _parser()
    try:
        args = parser.parse_args(topics_argv(argv))
    except UsageError as exc:
        print(f"appliance topics: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    try:
        check_connection_arguments(args)
        if args.command in ("alter", "delete"):
            if (args.name is None) == (args.topic is None):
                raise ValueError("give the topic once: NAME or --topic REGEX")
        if args.command == "describe":
            if args.topic is not None and args.names:
                raise ValueError("give the topics once: NAME... or --topic REGEX")
            if args.topics_with_overrides and _partition_reports(args):
                raise ValueError("--topics-with-overrides cannot be used with the partition reports (as in "
                                 "kafka-topics)")
        if getattr(args, "topic", None) is not None and args.command != "delete-records":
            topic_filter(args.topic)  # a bad pattern is bad arguments
        if args.command == "delete-records":
            args.records = _records_to_delete(args)
        if args.command == "create":
            _topic_configs(args.topic_config)
            for flag, value in (("--partitions", args.partitions), ("--replication-factor",
                                                                    args.replication_factor)):
                if value is not None and value < 1:
                    raise ValueError(f"{flag} {value}: must be at least 1")
    except (ValueError, ConfigError) as exc:  # (UsageError is a ValueError)
        print(f"appliance topics {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(args, sys.stdout, sys.stderr)
