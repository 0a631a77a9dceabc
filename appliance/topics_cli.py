"""``appliance topics create|list|describe|delete``: manage topics of a running appliance.

Where the appliance is: ``--control-socket PATH``, or the configuration that names it (``--config FILE``,
``--override KEY=VALUE``; with neither, the defaults: ``./data/.appliance.sock``).  The commands go through a
:class:`TopicsBackend`; :func:`open_backend` picks one from the arguments.  Today there is the control socket
(:class:`ControlBackend`); a backend speaking Kafka's protocol (``--bootstrap-server``) plugs in the same
way: add its option in :func:`add_connection_arguments` and its branch in :func:`open_backend`.

Output follows ``kafka-topics.sh --describe``: one line per topic, then one tab-indented line per partition::

    Topic: orders  TopicId: 4f6c...  PartitionCount: 2  ReplicationFactor: 3  Configs: retention.ms=60000
        Topic: orders  Partition: 0  Leader: 0  Replicas: 0,1,2  Isr: 0,1  LogStartOffset: 0  ...
            Follower: 1  InIsr: yes  LogEndOffset: 17  LagRecords: 0  LagMs: 0  LastFetchMsAgo: 3
            Follower: 2  InIsr: no  LogEndOffset: 4  LagRecords: 13  LagMs: 31200  LastFetchMsAgo: 31190

(fields separated by tabs; a replicated partition also shows its committed high watermark -- what acks=all
waits for; consumers see ``HighWatermark`` once every in-sync follower knows it -- and one line per follower:
its log end offset, its lag in records and in milliseconds since it was last caught up).
Exit status: 0 done; 1 refused or failed (the reason on stderr: unknown
topic, topic exists, bad setting, no appliance running); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

from appliance.config import add_config_arguments, config_from_args, parse_override
from appliance.control import ControlClient, TopicInfo
from appliance.metadata import TopicExistsError
from storage.errors import ApplianceError

__all__ = [
    "ControlBackend",
    "TopicsBackend",
    "add_connection_arguments",
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

    def describe(self, names: Sequence[str] | None) -> list[TopicInfo]: ...

    def create(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, Any]
    ) -> TopicInfo: ...

    def delete(self, name: str) -> None: ...

    def close(self) -> None: ...


class ControlBackend:
    """Topics through the supervisor's control socket (same host, the appliance's user or group)."""

    def __init__(self, client: ControlClient) -> None:
        self.client = client

    def list_topics(self) -> list[str]:
        return sorted(self.client.metadata().topics)

    def describe(self, names: Sequence[str] | None) -> list[TopicInfo]:
        topics = self.client.metadata(list(names) if names else None).topics
        return [topics[name] for name in (names or sorted(topics))]

    def create(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, Any]
    ) -> TopicInfo:
        return self.client.create_topic(
            name, partitions, replication_factor=replication_factor, configs=configs or None
        )

    def delete(self, name: str) -> None:
        self.client.delete_topic(name)

    def close(self) -> None:
        self.client.close()


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that say which appliance to talk to."""
    parser.add_argument(
        "--control-socket",
        metavar="PATH",
        help="the appliance's control socket (default: from the configuration)",
    )
    add_config_arguments(parser)


def open_backend(args: argparse.Namespace) -> TopicsBackend:
    """The backend the connection options name.  ApplianceError if the appliance cannot be reached."""
    path = args.control_socket or config_from_args(args).control_socket
    return ControlBackend(ControlClient.connect(path, timeout_s=60.0))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance topics", description="manage the topics of an appliance")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    create = commands.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, help="partition count (default: num.partitions)")
    create.add_argument(
        "--replication-factor", type=int, help="replicas (default: default.replication.factor)"
    )
    create.add_argument(
        "--topic-config",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a topic setting, e.g. retention.ms=86400000 (repeatable)",
    )
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    listing = commands.add_parser("list", help="print the topic names")
    describe = commands.add_parser("describe", help="print topics with their partitions and offsets")
    describe.add_argument("names", nargs="*", metavar="NAME", help="topics to describe (default: all)")
    delete = commands.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    for sub in (create, listing, describe, delete):
        add_connection_arguments(sub)
    return parser


def format_topic(topic: TopicInfo) -> str:
    """``kafka-topics --describe``-style lines for one topic (no trailing newline)."""
    configs = ",".join(f"{key}={_plain(value)}" for key, value in sorted(topic.configs.items()))
    lines = [
        f"Topic: {topic.name}\tTopicId: {topic.topic_id}\tPartitionCount: {topic.partition_count}\t"
        f"ReplicationFactor: {topic.replication_factor}\tConfigs: {configs}"
    ]
    for p in topic.partitions:
        memory = f"{p.writer_uss_bytes / 2**20:.1f}MiB" if p.writer_uss_bytes else "-"
        replicas = _ids(topic.replicas or (p.leader,))
        isr = _ids(p.isr or (p.leader,))
        committed = f"\tCommittedHighWatermark: {p.committed_high_watermark}" if topic.replicas[1:] else ""
        lines.append(
            f"\tTopic: {topic.name}\tPartition: {p.partition}\tLeader: {p.leader}\tReplicas: {replicas}\t"
            f"Isr: {isr}\tLogStartOffset: {p.log_start_offset}\tLogEndOffset: {p.log_end_offset}\t"
            f"HighWatermark: {p.high_watermark}{committed}\tLeaderEpoch: {p.leader_epoch}\t"
            f"WriterPid: {p.writer_pid}\tWriterUniqueMemory: {memory}\tWriterRestarts: {p.writer_restarts}"
        )
        for f in p.followers:
            lines.append(
                f"\t\tFollower: {f.replica_id}\tInIsr: {'yes' if f.in_isr else 'no'}\t"
                f"LogEndOffset: {f.log_end_offset}\tLagRecords: {f.lag_records}\tLagMs: {f.lag_ms}\t"
                f"LastFetchMsAgo: {f.last_fetch_ms_ago}"
            )
    return "\n".join(lines)


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


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run one parsed command; return the exit status."""
    try:
        backend = open_backend(args)
    except ApplianceError as exc:
        print(f"appliance topics: {exc}", file=err)
        return EXIT_FAILED
    try:
        if args.command == "create":
            try:
                topic = backend.create(
                    args.name, args.partitions, args.replication_factor, _topic_configs(args.topic_config)
                )
            except TopicExistsError:
                if not args.if_not_exists:
                    raise
                print(f"Topic {args.name} already exists.", file=out)
                return EXIT_OK
            print(f"Created topic {topic.name} with {topic.partition_count} partitions.", file=out)
        elif args.command == "list":
            for name in backend.list_topics():
                print(name, file=out)
        elif args.command == "describe":
            for topic in backend.describe(args.names or None):
                print(format_topic(topic), file=out)
        else:
            backend.delete(args.name)
            print(f"Deleted topic {args.name}.", file=out)
    except (ApplianceError, OSError) as exc:
        print(f"appliance topics {args.command}: {exc}", file=err)
        return EXIT_FAILED
    finally:
        backend.close()
    return EXIT_OK


def main(argv: list[str]) -> int:
    """``appliance topics COMMAND ...``"""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    return run(args, sys.stdout, sys.stderr)
