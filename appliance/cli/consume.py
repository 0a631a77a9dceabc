"""``appliance consume TOPIC``: print a topic's records, like Kafka's ``kafka-console-consumer.sh``.

Where the records come from (one of):

* ``--bootstrap-server HOST:PORT`` (Kafka's option; the default, ``127.0.0.1:9092``): the broker, over TCP;
* ``--data-dir DIR`` (the appliance's data dir, its first log dir, as ``appliance.Producer`` names it) or
  ``--config FILE`` (the appliance's configuration): the segment files on this host, memory-mapped, up to the
  high watermark the running appliance publishes (add ``--offline`` to read a stopped appliance's files up
  to their end).

Which records: every partition of the topic (or ``--partition P``), from the end -- only records written
from now on -- unless ``--from-beginning``; ``--offset O`` (with ``--partition``) starts at offset ``O``, or
at ``earliest`` / ``latest``.  The command stops after ``--max-messages N`` records, after ``--timeout-ms T``
without a record, or on Ctrl-C / SIGTERM, and then says ``Processed a total of N messages`` on stderr.

Output: one line per record on stdout, as Kafka's default formatter writes it: the value (``null`` for a
null value), preceded when asked by ``CreateTime:<ms>`` (``--print-timestamp``), ``Partition:<p>``
(``--print-partition``), ``Offset:<o>`` (``--print-offset``), the headers as ``k:v,k2:v2`` (or
``NO_HEADERS``, ``--print-headers``) and the key (``--print-key``), separated by ``--key-separator`` (a tab).
Keys and values are written as the bytes they are.

Exit status: 0 when it stopped as asked (count, time-out, signal); 1 when reading failed (no such topic or
partition, no broker, an offset out of range, corrupt data: the reason on stderr); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import BinaryIO

from appliance.client.consumer import Consumer, ConsumerRecord, TopicPartition
from storage.errors import ApplianceError

__all__ = ["DEFAULT_BOOTSTRAP_SERVER", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "format_record", "main"]

DEFAULT_BOOTSTRAP_SERVER = "127.0.0.1:9092"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
_POLL_MS = 500
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance consume",
        description="print the records of a topic (like kafka-console-consumer)",
    )
    parser.add_argument("topic", help="the topic to read")
    where = parser.add_argument_group("where from (one of)")
    where.add_argument("--bootstrap-server", metavar="HOST:PORT",
                       help=f"the broker to fetch from over TCP (default {DEFAULT_BOOTSTRAP_SERVER})")
    where.add_argument("--data-dir", metavar="DIR",
                       help="read the segment files of the appliance whose data dir (first log dir) is DIR")
    where.add_argument("--config", metavar="FILE",
                       help="read the segment files of the appliance this configuration file describes")
    where.add_argument("--offline", action="store_true",
                       help="with --data-dir/--config: the appliance is stopped, read the files to their end")
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
    out = parser.add_argument_group("output")
    out.add_argument("--print-key", action="store_true", help="print the key before the value")
    out.add_argument("--print-offset", action="store_true", help="print Offset:<o> first")
    out.add_argument("--print-partition", action="store_true", help="print Partition:<p> first")
    out.add_argument("--print-timestamp", action="store_true", help="print CreateTime:<ms> first")
    out.add_argument("--print-headers", action="store_true", help="print the headers before the key")
    out.add_argument("--key-separator", default="\t", metavar="SEP", help="between fields (default: a tab)")
    return parser


def format_record(record: ConsumerRecord, args: argparse.Namespace) -> bytes:
    """One output line (newline included) as Kafka's DefaultMessageFormatter writes it."""
    separator = args.key_separator.encode()
    fields: list[bytes] = []
    if args.print_timestamp:
        fields.append(f"{_TIMESTAMP_TYPES[record.timestamp_type]}:{record.timestamp}".encode())
    if args.print_partition:
        fields.append(b"Partition:%d" % record.partition)
    if args.print_offset:
        fields.append(b"Offset:%d" % record.offset)
    if args.print_headers:
        fields.append(b",".join(name.encode() + b":" + (b"null" if value is None else value)
                                for name, value in record.headers) or b"NO_HEADERS")
    if args.print_key:
        fields.append(b"null" if record.key is None else record.key)
    fields.append(b"null" if record.value is None else record.value)
    return separator.join(fields) + b"\n"


def _settings(args: argparse.Namespace) -> dict[str, object]:
    local = args.data_dir is not None or args.config is not None
    if local and args.bootstrap_server is not None:
        raise ValueError("--bootstrap-server reads over TCP, --data-dir/--config read local files: give one")
    if args.data_dir is not None and args.config is not None:
        raise ValueError("--data-dir and --config both name the appliance: give one")
    if args.offline and not local:
        raise ValueError("--offline reads local files: give --data-dir or --config")
    if args.offset is not None and args.partition is None:
        raise ValueError("--offset needs --partition (as in Kafka)")
    if args.offset is not None and args.from_beginning:
        raise ValueError("--offset and --from-beginning both say where to start: give one")
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
    for item in args.consumer_property:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--consumer-property {item!r}: expected KEY=VALUE")
        settings[key.strip()] = value.strip()
    return settings


def _start(consumer: Consumer, args: argparse.Namespace) -> None:
    if args.partition is not None:
        partitions = [TopicPartition(args.topic, args.partition)]
    else:
        partitions = [TopicPartition(args.topic, p) for p in consumer.partitions_for_topic(args.topic)]
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
        settings = _settings(args)
        if args.offset not in (None, "earliest", "latest") and (not args.offset.isdigit()):
            raise ValueError(f"--offset {args.offset!r}: expected a non-negative offset, earliest or latest")
        if args.max_messages is not None and args.max_messages < 1:
            raise ValueError(f"--max-messages {args.max_messages}: expected at least 1")
        if args.timeout_ms is not None and args.timeout_ms < 0:
            raise ValueError(f"--timeout-ms {args.timeout_ms}: expected >= 0")
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"appliance consume: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out: BinaryIO = sys.stdout.buffer
    progress = _Progress()
    previous = signal.signal(signal.SIGTERM, progress.on_sigterm)
    try:
        with Consumer(settings) as consumer:
            _start(consumer, args)
            _loop(consumer, args, out, progress)
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


def _loop(consumer: Consumer, args: argparse.Namespace, out: BinaryIO, progress: _Progress) -> None:
    limit = args.max_messages
    last_record = time.monotonic()
    while limit is None or progress.count < limit:
        wait_ms = _POLL_MS
        if args.timeout_ms is not None:
            wait_ms = min(wait_ms, max(0.0, args.timeout_ms - (time.monotonic() - last_record) * 1000))
        left = None if limit is None else limit - progress.count
        records = consumer.poll(timeout_ms=wait_ms, max_records=left)
        if records:
            progress.write(out, b"".join(format_record(r, args) for r in records), len(records))
            last_record = time.monotonic()
        elif args.timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
