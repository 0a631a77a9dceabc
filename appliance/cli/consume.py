"""``appliance consume TOPIC``: print a topic's records, like Kafka's ``kafka-console-consumer.sh``.

Where the records come from (one of):

* ``--bootstrap-server HOST:PORT`` (Kafka's option; the default, ``127.0.0.1:9092``): the broker, over TCP;
* ``--data-dir DIR`` (the appliance's data dir, its first log dir, as ``appliance.Producer`` names it) or
  ``--appliance-config FILE`` (the appliance's configuration; ``--config FILE`` is its older spelling):
  the segment files on this host, memory-mapped, up to the high watermark the running appliance publishes
  (add ``--offline`` to read a stopped appliance's files up to their end).

Which records: every partition of the topic (or ``--partition P``), from the end -- only records written
from now on -- unless ``--from-beginning``; ``--offset O`` (with ``--partition``) starts at offset ``O``, or
at ``earliest`` / ``latest``.  The command stops after ``--max-messages N`` records, after ``--timeout-ms T``
without a record, or on Ctrl-C / SIGTERM, and then says ``Processed a total of N messages`` on stderr.

Output: one line per record on stdout, as Kafka's default formatter writes it: the value (``null`` for a
null value), preceded when asked by ``CreateTime:<ms>`` (``--print-timestamp``), ``Partition:<p>``
(``--print-partition``), ``Offset:<o>`` (``--print-offset``), the headers as ``k:v,k2:v2`` (or
``NO_HEADERS``, ``--print-headers``) and the key (``--print-key``), separated by ``--key-separator`` (a tab).
Keys and values are written as the bytes they are.

kafka-console-consumer's flags work too: ``--topic``, ``--include REGEX``, ``--property print.key=true``
and the other properties of its default formatter (``appliance.cli.message_formatter``), ``--formatter``,
``--formatter-config``, ``--key-deserializer`` / ``--value-deserializer`` (Kafka's String or ByteArray
deserializer), ``--consumer.config``, ``--isolation-level`` (read_committed reads as
read_uncommitted: there are no transactions yet), ``--group G`` (a member of group G:
``Consumer.subscribe()``, from the group's committed offsets, committing as it reads); docs/tools.md maps
every flag.

Exit status: 0 when it stopped as asked (count, time-out, signal); 1 when reading failed (no such topic or
partition, no broker, an offset out of range, corrupt data: the reason on stderr); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

from appliance.cli.kafka_forms import UsageError, property_pairs, read_properties, refuse_together
from appliance.cli.message_formatter import (
    DEFAULT_FORMATTERS,
    DESERIALIZERS,
    DESERIALIZERS_BUILT,
    MessageFormatter,
)
from storage.errors import ApplianceError

if TYPE_CHECKING:  # imported by main once the arguments are checked: a usage error costs no numba start-up
    from appliance.client.consumer import Consumer

__all__ = ["DEFAULT_BOOTSTRAP_SERVER", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main"]

DEFAULT_BOOTSTRAP_SERVER = "127.0.0.1:9092"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
_POLL_MS = 500


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance consume",
        description="print the records of a topic (like kafka-console-consumer; its flags work too)",
    )
    parser.add_argument("topic", nargs="?", help="the topic to read (or --topic TOPIC)")
    parser.add_argument("--topic", dest="topic_flag", metavar="TOPIC",
                        help="the topic, as kafka-console-consumer takes it")
    parser.add_argument("--include", metavar="REGEX", type=_regex,
                        help="every topic whose whole name matches REGEX (Java regex syntax's common part)")
    where = parser.add_argument_group("where from (one of)")
    where.add_argument("--bootstrap-server", metavar="HOST:PORT",
                       help=f"the broker to fetch from over TCP (default {DEFAULT_BOOTSTRAP_SERVER})")
    where.add_argument("--data-dir", metavar="DIR",
                       help="read the segment files of the appliance whose data dir (first log dir) is DIR")
    where.add_argument("--appliance-config", "--config", dest="config", metavar="FILE",
                       help="read the segment files of the appliance this TOML configuration file describes")
    where.add_argument("--offline", action="store_true",
                       help="with --data-dir/--appliance-config: the appliance is stopped, read the files to "
                            "their end")
    which = parser.add_argument_group("which records")
    which.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (default: only records written from now on)")
    which.add_argument("--partition", type=int, metavar="P", help="read only this partition")
    which.add_argument("--offset", metavar="O",
                       help="with --partition: start at this offset, or 'earliest' / 'latest'")
    which.add_argument("--max-messages", type=int, metavar="N", help="stop after N records")
    which.add_argument("--timeout-ms", type=int, metavar="T",
                       help="stop when no record arrived for T milliseconds")
    which.add_argument("--consumer-property", metavar="KEY=VALUE", action="append", default=[],
                       help="a Consumer setting, e.g. check.crcs=false (repeatable)")
    which.add_argument("--consumer.config", dest="consumer_config", metavar="FILE",
                       help="Consumer settings from a properties file (--consumer-property wins)")
    which.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                       help="read_committed is accepted and reads as read_uncommitted: the appliance has no "
                            "transactions, so every record is committed")
    which.add_argument("--group", metavar="GROUP",
                       help="consume as a member of this consumer group: its partitions, from its committed "
                            "offsets (else --from-beginning / the end), committing as it reads")
    out = parser.add_argument_group("output (kafka-console-consumer's DefaultMessageFormatter)")
    out.add_argument("--formatter", metavar="CLASS",
                     help="kafka.tools.DefaultMessageFormatter (the default, the only one)")
    out.add_argument("--property", metavar="KEY=VALUE", action="append", default=[],
                     help="a formatter property: print.key, print.value, print.timestamp, print.partition, "
                          "print.offset, print.headers, key.separator, line.separator, headers.separator, "
                          "null.literal (repeatable)")
    out.add_argument("--formatter-config", metavar="FILE", help="formatter properties from a properties file")
    out.add_argument("--key-deserializer", metavar="CLASS",
                     help="org.apache.kafka.common.serialization.StringDeserializer (keys as UTF-8 text) or "
                          "ByteArrayDeserializer (as bytes, the default)")
    out.add_argument("--value-deserializer", metavar="CLASS", help="as --key-deserializer, for values")
    out.add_argument("--skip-message-on-error", action="store_true",
                     help="accepted: no record fails to be formatted here, so none is skipped")
    out.add_argument("--print-key", action="store_true", help="print the key before the value")
    out.add_argument("--print-offset", action="store_true", help="print Offset:<o> first")
    out.add_argument("--print-partition", action="store_true", help="print Partition:<p> first")
    out.add_argument("--print-timestamp", action="store_true", help="print CreateTime:<ms> first")
    out.add_argument("--print-headers", action="store_true", help="print the headers before the key")
    out.add_argument("--key-separator", metavar="SEP", help="between fields (default: a tab)")
    return parser


def _settings(args: argparse.Namespace) -> dict[str, object]:
    local = args.data_dir is not None or args.config is not None
    if local and args.bootstrap_server is not None:
        raise refuse_together("--bootstrap-server", "--data-dir/--appliance-config",
                              "the first reads over TCP, the second local files: give one")
    if args.data_dir is not None and args.config is not None:
        raise refuse_together("--data-dir", "--appliance-config", "both name the appliance: give one")
    if args.offline and not local:
        raise UsageError("--offline reads local files: give --data-dir or --appliance-config")
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition (as in Kafka)")
    if args.offset is not None and args.from_beginning:
        raise refuse_together("--offset", "--from-beginning", "both say where to start (as in Kafka)")
    settings: dict[str, object] = {"client.id": "appliance-console-consumer"}
    if args.data_dir is not None:
        settings["appliance.data.dir"] = args.data_dir
    elif args.config is not None:
        settings["appliance.config"] = args.config
    else:
        settings["bootstrap.servers"] = args.bootstrap_server or DEFAULT_BOOTSTRAP_SERVER
    if args.offline:
        settings["appliance.local.offline"] = True
    settings["auto.offset.reset"] = "earliest" if args.from_beginning else "latest"
    if args.consumer_config is not None:
        settings.update(read_properties(args.consumer_config))
    pairs = property_pairs(args.consumer_property, "--consumer-property")
    settings.update({key: value.strip() for key, value in pairs.items()})
    settings.pop("isolation.level", None)  # said by --isolation-level (see main)
    given = settings.pop("group.id", None)
    if given is not None and args.group is not None and given != args.group:
        raise refuse_together(f"--group {args.group}", f"group.id={given}",
                              "the group ids given in different places do not match (as in Kafka)")
    args.group = args.group if args.group is not None else given
    if args.group is not None:
        if args.partition is not None:
            raise refuse_together("--group", "--partition", "a group member is given its partitions")
        settings["group.id"] = args.group
    return settings


def _check(args: argparse.Namespace) -> None:
    """Refuse what kafka-console-consumer refuses, naming the flags; resolve the topic."""
    if args.topic is not None and args.topic_flag is not None and args.topic != args.topic_flag:
        raise refuse_together(f"TOPIC {args.topic}", f"--topic {args.topic_flag}", "give the topic once")
    args.topic = args.topic or args.topic_flag
    if (args.topic is None) == (args.include is None):
        raise UsageError("give exactly one of --topic (or TOPIC) and --include, as kafka-console-consumer")
    if args.partition is not None and args.include is not None:
        raise refuse_together("--partition", "--include", "a partition belongs to one --topic")
    if args.group is not None and args.partition is not None:
        raise refuse_together("--group", "--partition", "a group member is given its partitions")
    if args.formatter is not None and args.formatter not in DEFAULT_FORMATTERS:
        raise UsageError(f"--formatter {args.formatter}: only the default formatter "
                         f"({DEFAULT_FORMATTERS[0]}) is built")
    if args.offset not in (None, "earliest", "latest") and (not args.offset.isdigit()):
        raise UsageError(f"--offset {args.offset!r}: expected a non-negative offset, earliest or latest")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError(f"--max-messages {args.max_messages}: expected at least 1")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise UsageError(f"--timeout-ms {args.timeout_ms}: expected >= 0")


def _formatter(args: argparse.Namespace) -> MessageFormatter:
    """The formatter the properties (file, then --property) and our own --print-* flags ask for."""
    properties = read_properties(args.formatter_config) if args.formatter_config is not None else {}
    properties.update(property_pairs(args.property, "--property"))
    for flag in ("print_key", "print_offset", "print_partition", "print_timestamp", "print_headers"):
        if getattr(args, flag):
            properties[flag.replace("_", ".")] = "true"
    if args.key_separator is not None:
        properties["key.separator"] = args.key_separator
    for flag, given in (("--key-deserializer", args.key_deserializer),
                        ("--value-deserializer", args.value_deserializer)):
        if given:  # as kafka-console-consumer: the flag over the property
            if given.strip() not in DESERIALIZERS:
                raise UsageError(f"{flag} {given}: {DESERIALIZERS_BUILT}")
            properties[flag[2:].replace("-", ".")] = given
    return MessageFormatter.from_properties(properties)


def _topics(args: argparse.Namespace, settings: dict[str, object]) -> list[str]:
    """The topics to read: ``--topic``, or those whose whole name matches ``--include`` (internal topics,
    ``__``..., left out as kafka-console-consumer leaves them out)."""
    if args.include is None:
        return [args.topic]
    if args.group is not None:
        return []  # the group subscribes by the pattern itself
    if "bootstrap.servers" in settings:
        from appliance.client.admin import KafkaAdmin

        with KafkaAdmin(str(settings["bootstrap.servers"]), client_id="appliance-console-consumer") as admin:
            names = admin.list_topics()
    else:
        from appliance.config.server_config import load_config
        from appliance.config.topic_metadata import read_topics, topics_path

        dirs = (args.data_dir,) if args.data_dir is not None else load_config(args.config).log_dirs
        names = list(read_topics(topics_path(dirs)))
    return sorted(n for n in names if args.include.fullmatch(n) and not n.startswith("__"))


def _start(consumer: Consumer, args: argparse.Namespace, topics: list[str]) -> None:
    from appliance.client.consumer import TopicPartition

    if args.group is not None:  # the group gives the partitions, from its committed offsets or the reset
        consumer.subscribe(args.include if args.include is not None else topics)
        return
    if args.partition is not None:
        partitions = [TopicPartition(args.topic, args.partition)]
    else:
        partitions = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t)]
    consumer.assign(partitions)
    if args.offset in (None, "latest") and not args.from_beginning:
        consumer.seek_to_end()  # decided now, not at the first poll: "records written from now on"
    elif args.offset == "earliest":
        consumer.seek_to_beginning()
    elif args.offset is not None and args.offset != "latest":
        consumer.seek(partitions[0], int(args.offset))


class _Stop(Exception):
    pass


class _Progress:
    """Records written so far, and how a SIGTERM stops the loop: at once while it waits for records, after
    the write while it writes them (so the count printed at the end is the number of lines printed)."""

    def __init__(self) -> None:
        self.count = 0
        self.writing = False
        self.stop_requested = False

    def on_sigterm(self, signum: int, frame: object) -> None:
        if self.writing:
            self.stop_requested = True
        else:
            raise _Stop

    def write(self, out: BinaryIO, lines: bytes, records: int) -> None:
        self.writing = True
        try:
            out.write(lines)
            out.flush()
            self.count += records
        finally:
            self.writing = False
        if self.stop_requested:
            raise _Stop


def main(argv: list[str]) -> int:
    """``appliance consume TOPIC [options]``; see the module doc."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _check(args)
        settings = _settings(args)
        formatter = _formatter(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"appliance consume: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.isolation_level == "read_committed":
        print("appliance consume: --isolation-level read_committed reads as read_uncommitted: the appliance "
              "has no transactions yet, so every record is committed", file=sys.stderr)
    from appliance.client.consumer import Consumer

    out: BinaryIO = sys.stdout.buffer
    progress = _Progress()
    previous = signal.signal(signal.SIGTERM, progress.on_sigterm)
    try:
        with Consumer(settings) as consumer:
            _start(consumer, args, _topics(args, settings))
            _loop(consumer, args, formatter, out, progress)
    except (_Stop, KeyboardInterrupt):
        pass
    except BrokenPipeError:  # the reader went away (| head): stop quietly, and let exit not flush into it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except ApplianceError as exc:
        print(f"appliance consume: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
        print(f"Processed a total of {progress.count} messages", file=sys.stderr)
    return EXIT_OK


def _loop(consumer: Consumer, args: argparse.Namespace, formatter: MessageFormatter, out: BinaryIO,
          progress: _Progress) -> None:
    limit = args.max_messages
    last_record = time.monotonic()
    while limit is None or progress.count < limit:
        wait_ms = _POLL_MS
        if args.timeout_ms is not None:
            wait_ms = min(wait_ms, max(0.0, args.timeout_ms - (time.monotonic() - last_record) * 1000))
        left = None if limit is None else limit - progress.count
        records = consumer.poll(timeout_ms=wait_ms, max_records=left)
        if records:
            progress.write(out, b"".join(map(formatter.format, records)), len(records))
            last_record = time.monotonic()
        elif args.timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
