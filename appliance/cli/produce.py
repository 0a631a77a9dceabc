"""``appliance produce TOPIC``: every line of standard input becomes one record, like kafka-console-producer.

    printf 'k1:hello\\nk2:world\\n' | appliance produce orders --key-separator :

A line ends at ``\\n``, ``\\r`` or ``\\r\\n``, as Kafka's line reader (Java's ``BufferedReader.readLine``)
ends it; the last line needs no newline.  With ``--key-separator SEP`` (or Kafka's ``--property
parse.key=true --property key.separator=SEP``) a line is split at the first SEP into key and value; a
line without SEP is an error (exit 1, naming the line; the lines before it were sent), as in Kafka.
Records are sent with Kafka's default partitioner (the key's murmur2, else sticky) unless ``--partition``
pins them.

Where the appliance is: ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` for a remote one (Kafka's Produce
over TCP to each partition's leader, ``appliance.client.tcp_route``; ``--acks 0`` is not offered there), else
on this host, through shared-memory rings: ``--control-socket PATH``, else ``--data-dir DIR`` (its first log
dir: the socket is ``DIR/.appliance.sock``), else the ``appliance.control.socket`` of ``--config FILE`` /
``--override K=V`` (default ``./data/.appliance.sock``).  ``--producer-property KEY=VALUE`` passes any
producer setting (``appliance.client.producer_config``), e.g. ``max.block.ms=5000`` to give up sooner on a
broker that does not answer.

kafka-console-producer's flags work too: ``--topic T``, ``--broker-list`` (its older name for
``--bootstrap-server``), ``--request-required-acks``, ``--compression-codec [CODEC]`` (gzip when given
alone), ``--timeout MS`` (linger.ms), ``--message-send-max-retries`` (retries), ``--retry-backoff-ms``,
``--producer.config FILE`` (a properties file, under ``--producer-property`` and the flags), ``--sync``
(each record sent alone and acknowledged before the next line is read), and every property of its line
reader, from ``--property`` or a ``--reader-config`` file: ``parse.key``, ``key.separator``,
``parse.headers`` with ``headers.delimiter`` / ``headers.separator`` / ``headers.key.separator``,
``null.marker``, ``ignore.error`` (``appliance.cli.line_reader``).  The appliance's TOML file is
``--appliance-config FILE`` (``--config FILE``, the older spelling, still works here: this command takes
no topic settings).

Standard input is read in blocks as it arrives (``read1``), split into lines in C, and handed to
``Producer.send_many`` a block at a time, so a pipe of short lines goes at bulk speed while an interactive
terminal still sends each line within ``linger.ms``.  Exit status: 0 when every record was acknowledged
(with ``--acks 0``: published), 1 when a record failed or a line was malformed, 2 for bad arguments or when
the appliance cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import IO, Any

from appliance.cli.kafka_forms import UsageError, property_pairs, read_properties
from appliance.cli.line_reader import LineFormat, LineSplitter, MalformedLineError, ParsedLines, line_format
from storage.errors import ApplianceError, ConfigError

__all__ = ["main", "producer_settings", "read_records"]

_READ_BYTES = 1 << 20
_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance produce",
        description="send each line of standard input to TOPIC as one record",
    )
    parser.add_argument("topic", metavar="TOPIC", nargs="?", help="topic to send to (or --topic TOPIC)")
    parser.add_argument("--topic", dest="topic_flag", metavar="TOPIC",
                        help="the topic, as kafka-console-producer takes it")
    parser.add_argument("--key-separator", metavar="SEP",
                        help="split each line at the first SEP into key and value")
    parser.add_argument("--property", metavar="KEY=VALUE", action="append", default=[],
                        help="kafka-console-producer's line reader properties: parse.key, key.separator, "
                             "parse.headers, headers.delimiter, headers.separator, headers.key.separator, "
                             "null.marker, ignore.error (repeatable)")
    parser.add_argument("--reader-config", metavar="FILE",
                        help="line reader properties from a properties file (--property wins)")
    parser.add_argument("--sync", action="store_true",
                        help="send each record alone and wait for its acknowledgement before the next line")
    parser.add_argument("--acks", "--request-required-acks", choices=("0", "1", "all", "-1"),
                        help="0: do not wait; 1 or all: wait for the writer's ack (default all)")
    parser.add_argument("--compression", choices=_CODECS, help="compress each batch (default none)")
    parser.add_argument("--compression-codec", nargs="?", const="gzip", choices=_CODECS,
                        help="kafka-console-producer's spelling of --compression (alone: gzip, as Kafka)")
    parser.add_argument("--partition", type=int, metavar="N", help="send every record to partition N")
    parser.add_argument("--linger-ms", "--timeout", type=int, metavar="MS",
                        help="linger.ms (default 5); --timeout is kafka-console-producer's name for it")
    parser.add_argument("--max-block-ms", type=int, metavar="MS", help="max.block.ms")
    parser.add_argument("--request-timeout-ms", type=int, metavar="MS", help="request.timeout.ms")
    parser.add_argument("--batch-size", type=int, metavar="BYTES", help="batch.size")
    parser.add_argument("--message-send-max-retries", type=int, metavar="N", help="retries")
    parser.add_argument("--retry-backoff-ms", type=int, metavar="MS", help="retry.backoff.ms")
    parser.add_argument("--producer-property", metavar="KEY=VALUE", action="append", default=[],
                        help="any producer setting, e.g. max.block.ms=1000 (repeatable)")
    parser.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                        help="producer settings from a properties file (the flags above win)")
    where = parser.add_argument_group("where the appliance is (--bootstrap-server, or the first local match)")
    where.add_argument("--bootstrap-server", metavar="HOST:PORT",
                       help="a remote appliance's broker: produce over TCP (Kafka's protocol)")
    where.add_argument("--broker-list", metavar="HOST:PORT",
                       help="kafka-console-producer's older name for --bootstrap-server")
    where.add_argument("--control-socket", metavar="PATH", help="the appliance's control socket")
    where.add_argument("--data-dir", metavar="DIR", help="the appliance's first log dir")
    where.add_argument("--appliance-config", "--config", dest="config", metavar="FILE",
                       help="the appliance's TOML configuration file (--config is the older spelling)")
    where.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                       help="a configuration override, as for `appliance serve` (repeatable)")
    return parser


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r}: expected KEY=VALUE")
        pairs[key.strip()] = value
    return pairs


def _resolve_kafka_flags(args: argparse.Namespace) -> None:
    """Fold kafka-console-producer's spellings into ours; ConfigError naming two flags that disagree."""
    for ours, theirs, flag in (("topic", "topic_flag", "--topic"), ("bootstrap_server", "broker_list",
                                                                    "--broker-list"),
                               ("compression", "compression_codec", "--compression-codec")):
        mine, kafka = getattr(args, ours), getattr(args, theirs)
        if mine is not None and kafka is not None and mine != kafka:
            ours_flag = "TOPIC" if ours == "topic" else f"--{ours.replace('_', '-')}"
            raise ConfigError(f"{ours_flag} {mine} cannot be used with {flag} {kafka}: give one")
        setattr(args, ours, mine if mine is not None else kafka)
    if args.topic is None:
        raise ConfigError("give the topic: TOPIC or --topic TOPIC")


def producer_settings(args: argparse.Namespace) -> tuple[dict[str, object], LineFormat]:
    """The Producer settings (the ``--producer.config`` file, then ``--producer-property``, then the flags)
    and how lines are read (the ``--reader-config`` file, then ``--property``, then ``--key-separator``)."""
    _resolve_kafka_flags(args)
    settings: dict[str, object] = {}
    if args.producer_config is not None:
        try:
            settings.update(read_properties(args.producer_config))
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
    settings.update(_pairs(args.producer_property, "--producer-property"))
    settings.setdefault("acks", "all")
    settings.setdefault("compression.type", "none")
    for value, name in ((args.acks, "acks"), (args.compression, "compression.type"),
                        (args.linger_ms, "linger.ms"), (args.batch_size, "batch.size"),
                        (args.max_block_ms, "max.block.ms"), (args.request_timeout_ms, "request.timeout.ms"),
                        (args.message_send_max_retries, "retries"),
                        (args.retry_backoff_ms, "retry.backoff.ms")):
        if value is not None:
            settings[name] = value
    local = [f"--{name.replace('_', '-')}" for name in ("control_socket", "data_dir", "config", "override")
             if getattr(args, name)]
    if args.bootstrap_server is not None:
        if local:
            raise ConfigError(f"--bootstrap-server produces over TCP, {local[0]} through this host's rings: "
                              "give one")
        settings["bootstrap.servers"] = args.bootstrap_server
    elif args.control_socket:
        settings["appliance.control.socket"] = args.control_socket
    elif args.data_dir:
        settings["appliance.data.dir"] = args.data_dir
    elif not ({"appliance.control.socket", "appliance.data.dir", "bootstrap.servers"} & set(settings)):
        from appliance.config.server_config import load_config

        settings["appliance.control.socket"] = load_config(args.config, args.override).control_socket
    try:
        reader = read_properties(args.reader_config) if args.reader_config is not None else {}
        reader.update(property_pairs(args.property, "--property"))
        return settings, line_format(reader, args.key_separator)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def read_records(stream: IO[bytes], lines_format: LineFormat) -> Iterator[ParsedLines]:
    """The records of ``stream``'s lines, a block at a time as the data arrives.

    Raises :class:`MalformedLineError` for a line the format cannot read, after yielding the lines before it.
    """
    separator = lines_format.key_separator if lines_format.parse_key else None
    read = getattr(stream, "read1", stream.read)
    splitter = LineSplitter()
    line_number = 0
    while True:
        block = read(_READ_BYTES)
        lines = splitter.feed(block) if block else splitter.end()
        if lines:
            if lines_format.plain:
                values, keys, error = _split(lines, separator, line_number)
                parsed = ParsedLines(values, keys, None, error)  # type: ignore[arg-type]
            else:
                parsed = lines_format.parse(lines, line_number)
            if parsed.values:
                yield parsed
            if parsed.error is not None:
                raise parsed.error
            line_number += len(lines)
        if not block:
            return


def _split(lines: list[bytes], separator: bytes | None,
           lines_before: int) -> tuple[list[bytes], list[bytes] | None, MalformedLineError | None]:
    """(values, keys, the error of the first line without the separator: the lines before it are kept)."""
    if separator is None:
        return lines, None, None
    keys: list[bytes] = []
    values: list[bytes] = []
    for number, line in enumerate(lines, lines_before + 1):
        key, sep, value = line.partition(separator)
        if not sep:
            shown = separator.decode("utf-8", "replace")
            error = MalformedLineError(f"line {number}: no key separator {shown!r} in {line[:80]!r}")
            return values, keys, error
        keys.append(key)
        values.append(value)
    return values, keys, None


def _send_each(producer: Any, args: argparse.Namespace, parsed: ParsedLines) -> None:
    """``--sync``: each record sent alone, its acknowledgement awaited (its error raised) before the next."""
    for i, value in enumerate(parsed.values):
        key = parsed.keys[i] if parsed.keys is not None else None
        headers = parsed.headers[i] if parsed.headers is not None else None
        producer.send(args.topic, value, key=key, headers=headers, partition=args.partition).get()


def main(argv: list[str]) -> int:
    """Entry point of ``appliance produce``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        settings, lines_format = producer_settings(args)
        from appliance.client.producer import Producer

        producer = Producer(settings)
    except (ConfigError, ApplianceError, PermissionError) as exc:
        print(f"appliance produce: {exc}", file=sys.stderr)
        return 2
    failures: list[ApplianceError] = []

    def delivered(error: ApplianceError | None, metadata: Any) -> None:
        if error is not None:
            failures.append(error)

    status = 0
    try:
        with producer:
            for parsed in read_records(sys.stdin.buffer, lines_format):
                if args.sync:
                    _send_each(producer, args, parsed)
                else:
                    producer.send_many(args.topic, parsed.values, keys=parsed.keys, partition=args.partition,
                                       headers=parsed.headers, callback=delivered)
            producer.flush()
    except MalformedLineError as exc:
        print(f"appliance produce: {exc}", file=sys.stderr)
        status = 1
    except (ApplianceError, ValueError) as exc:
        print(f"appliance produce: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if failures:
        print(f"appliance produce: {len(failures)} batch(es) failed; first: {failures[0]}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
