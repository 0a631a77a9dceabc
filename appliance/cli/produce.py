"""``appliance produce TOPIC``: every line of standard input becomes one record, like kafka-console-producer.

    printf 'k1:hello\\nk2:world\\n' | appliance produce orders --key-separator :

A line is the bytes before ``\\n`` (a ``\\r`` before it is dropped too, as Kafka's line reader does); the last
line needs no newline.  With ``--key-separator SEP`` (or Kafka's ``--property parse.key=true --property
key.separator=SEP``) a line is split at the first SEP into key and value; a line without SEP is an error
(exit 1, naming the line; the lines before it were sent), as in Kafka.  Records are sent with Kafka's
default partitioner (the key's murmur2, else sticky) unless ``--partition`` pins them.

Where the appliance is: ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` for a remote one (Kafka's Produce
over TCP to each partition's leader, ``appliance.client.tcp_route``; ``--acks 0`` is not offered there), else
on this host, through shared-memory rings: ``--control-socket PATH``, else ``--data-dir DIR`` (its first log
dir: the socket is ``DIR/.appliance.sock``), else the ``appliance.control.socket`` of ``--config FILE`` /
``--override K=V`` (default ``./data/.appliance.sock``).  ``--producer-property KEY=VALUE`` passes any
producer setting (``appliance.client.producer_config``), e.g. ``max.block.ms=5000`` to give up sooner on a
broker that does not answer.

kafka-console-producer's flags work too: ``--topic T``, ``--broker-list`` (its older name for
``--bootstrap-server``), ``--request-required-acks``, ``--compression-codec [CODEC]`` (gzip when given
alone), ``--timeout MS`` (linger.ms), ``--producer.config FILE`` (a properties file, under
``--producer-property`` and the flags).  The appliance's TOML file is ``--appliance-config FILE``
(``--config FILE``, the older spelling, still works here: this command takes no topic settings).

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

from appliance.cli.kafka_forms import UsageError, read_properties
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
                        help="Kafka console-producer reader properties: parse.key=true, key.separator=SEP")
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


def producer_settings(args: argparse.Namespace) -> tuple[dict[str, object], bytes | None]:
    """The Producer settings and the key separator (None: no keys) the arguments ask for: the
    ``--producer.config`` file, then ``--producer-property``, then the flags."""
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
                        (args.max_block_ms, "max.block.ms"), (args.request_timeout_ms, "request.timeout.ms")):
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
    reader = _pairs(args.property, "--property")
    unknown = set(reader) - {"parse.key", "key.separator"}
    if unknown:
        raise ConfigError(f"--property {sorted(unknown)[0]}: supported reader properties are parse.key and "
                          "key.separator")
    separator: str | None = args.key_separator
    if separator is None and reader.get("parse.key", "false").lower() == "true":
        separator = reader.get("key.separator", "\t")  # Kafka's default separator is a tab
    if separator == "":
        raise ConfigError("--key-separator: the separator cannot be empty")
    return settings, None if separator is None else separator.encode("utf-8")


class MalformedLineError(ApplianceError):
    """A line without the key separator (with keys asked for)."""


Block = tuple[list[bytes], list[bytes] | None]  # values, keys (None: no keys)


def read_records(stream: IO[bytes], separator: bytes | None) -> Iterator[Block]:
    """Blocks of (values, keys or None) from ``stream``, one record per line, as the data arrives.

    Raises :class:`MalformedLineError` for a line without ``separator``, after yielding the lines before it.
    """
    read = getattr(stream, "read1", stream.read)
    carry = b""
    line_number = 0
    while True:
        block = read(_READ_BYTES)
        if block:
            lines = (carry + block).split(b"\n")
            carry = lines.pop()
        else:
            lines, carry = ([carry] if carry else []), b""
        if lines:
            lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
            values, keys, error = _split(lines, separator, line_number)
            if values:
                yield values, keys
            if error is not None:
                raise error
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


def main(argv: list[str]) -> int:
    """Entry point of ``appliance produce``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        settings, separator = producer_settings(args)
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
            for values, keys in read_records(sys.stdin.buffer, separator):
                producer.send_many(args.topic, values, keys=keys, partition=args.partition,
                                   callback=delivered)
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
