"""``appliance bench COMMAND``: measure the appliance on this host.

Commands: produce, consume, e2e, replicate, partitions, partition-throughput, recovery, cleaner, groups.

Modelled on Kafka's ``kafka-producer-perf-test`` and ``kafka-consumer-perf-test``::

    appliance bench produce --records 2000000 --record-size 100 --acks 1
    appliance bench produce --records 5000000 --record-size 100 --api send_many --json out.json
    appliance bench produce --records 400000 --producers 4 --partitions 8 --compression zstd
    appliance bench consume --records 10000000 --record-size 100          # local mmap path
    appliance bench consume --records 10000000 --transport tcp            # over the broker
    appliance bench e2e --throughput 100000 --seconds 5                    # produce-to-consume latency
    appliance bench replicate --records 2000000 --record-size 1024
    appliance bench partitions --counts 10,100,1000,5000 --idle-s 30      # what partitions cost
    appliance bench partition-throughput --counts 1,4,16,64,256            # throughput and memory
    appliance bench recovery --segments 1,10,100,1000 --max-bytes 2GiB    # restart / recovery time
    appliance bench cleaner --records 1000000 --dirty-records 3000000 --pairs 3   # the cleaner's cost
    appliance bench groups --members 8 --rounds 5 --commits 2000 --records 1000000  # consumer groups

Where: by default each run starts its own ``appliance serve`` in a fresh temporary directory and stops and
removes it at the end.  ``--data-dir DIR`` uses the appliance running there (or starts one there) and
creates a fresh topic for the run (deleted at the end unless ``--topic`` names one or ``--keep-topic``).
``--bootstrap-server HOST:PORT`` (or ``--transport tcp``) goes over the Kafka protocol instead of shared
memory.

Output: a live progress line on stderr once a second (on a TTY, or with ``--progress``); a Kafka-style
summary on stdout; ``--json FILE`` writes one machine-readable object (keys in ``bench.stats``).
Every run measures its physical limits (``bench.limits``: memcpy, page-cache write of the same
volume, loopback sendfile) and reports its throughput as a ratio to each (``--no-limits`` skips them).
Exit status: 0; 1 on an error; 3 when the path asked for is not available in this tree (the TCP producer,
replication), saying so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from bench.harness import Appliance
from bench.stats import summary_line, write_json
from storage.errors import ApplianceError, ConfigError

__all__ = ["main", "parse_size"]

UNAVAILABLE_EXIT = 3


def parse_size(text: str) -> int:
    """``100``, ``10KiB``, ``1MiB``, ``2GiB``, ``1kB``, ``5MB`` -> bytes."""
    units = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
             "g": 1 << 30, "gib": 1 << 30, "gb": 10**9}
    value = text.strip().lower().replace("_", "")
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number):]
    try:
        if unit not in units or not number:
            raise ValueError(text)
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 100, 10KiB, 2GiB") from None


def _count(text: str) -> int:
    try:
        return int(float(text.replace("_", "")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None


def _int_list(text: str) -> list[int]:
    return [_count(part) for part in text.split(",") if part.strip()]


def _prop(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def _common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where")
    where.add_argument("--data-dir", help="the data dir of a running appliance (or where to start one); "
                                          "default: a fresh temporary appliance, removed afterwards")
    where.add_argument("--bootstrap-server", metavar="HOST:PORT",
                       help="go over TCP (the Kafka protocol) to this broker; implies --transport tcp")
    where.add_argument("--transport", choices=("shm", "tcp"), default=None,
                       help="shm: local rings / memory maps (default); tcp: the broker")
    where.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting for the appliance the bench starts (appliance serve --override)")
    where.add_argument("--topic", help="topic to use (default: a fresh one, deleted afterwards)")
    where.add_argument("--keep-topic", action="store_true", help="do not delete the fresh topic")
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the result as one JSON object ('-': stdout)")
    out.add_argument("--progress", action="store_true", help="progress line on stderr even without a TTY")
    out.add_argument("--no-progress", action="store_true", help="no progress line")
    out.add_argument("--no-limits", action="store_true", help="skip measuring memcpy/page-cache/sendfile")
    out.add_argument("--profile", metavar="FILE",
                     help="cProfile the timed part (the producer, consumer or follower; FILE.<pid> for each "
                          "of several producer processes) and print its top functions")


def _produce_options(parser: argparse.ArgumentParser, *, records: int | None) -> None:
    parser.add_argument("--records", "--num-records", type=_count, required=records is None, default=records,
                        help="records to send (timed)")
    parser.add_argument("--record-size", type=parse_size, default=100, help="bytes per record value (100)")
    parser.add_argument("--partitions", type=_count, default=1, help="partitions of the topic (1)")
    parser.add_argument("--producers", type=_count, default=1,
                        help="producers, each a process of its own when more than 1 (1)")
    parser.add_argument("--acks", choices=("0", "1", "all", "-1"), default="1", help="acks (1)")
    parser.add_argument("--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none",
                        help="compression.type (none)")
    parser.add_argument("--batch-size", type=parse_size, default=None, help="batch.size (producer default)")
    parser.add_argument("--linger-ms", type=_count, default=None, help="linger.ms (producer default)")
    parser.add_argument("--throughput", type=float, default=-1,
                        help="records/s for all producers together; -1: as fast as possible")
    parser.add_argument("--api", choices=("send", "send_many"), default="send",
                        help="send(): one call per record (default); send_many(): arrays of records")
    parser.add_argument("--payload", choices=("json", "random"), default="json",
                        help="json: log-like JSON lines (default); random: incompressible bytes")
    parser.add_argument("--producer-prop", action="append", default=[], type=_prop, metavar="KEY=VALUE",
                        help="any other producer setting (Kafka's name)")
    parser.add_argument("--warmup-records", type=_count, default=None,
                        help="untimed records per producer first (default: records/10, at most 50,000)")
    parser.add_argument("--message-timestamp-type", choices=("CreateTime", "LogAppendTime", "compare"),
                        default="CreateTime",
                        help="the topic's message.timestamp.type (CreateTime); compare (produce only): "
                             "CreateTime and LogAppendTime runs in alternation, with their ratio "
                             "(bench.timestamp_types)")
    parser.add_argument("--recycle-pages", action="store_true",
                        help="touch and free the volume about to be written before each page-cache "
                             "probe and the run, so all three write into pages the host backs (make bench "
                             "does this from 10 KiB records up; see docs/performance.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _produce_commands(sub)
    _scaling_commands(sub)
    return parser


def _produce_commands(sub: Any) -> None:
    """The commands that take the produce options: produce, consume, e2e, replicate."""
    p = sub.add_parser("produce", help="records/s, MB/s and send-to-ack latency of producers")
    _produce_options(p, records=None)
    _common(p)

    c = sub.add_parser("consume", help="records/s of a consumer reading a topic from its start")
    _produce_options(c, records=None)
    c.add_argument("--fetch-max-bytes", type=parse_size, default=None, help="max.partition.fetch.bytes")
    c.add_argument("--reuse", action="store_true",
                   help="consume --topic as it is (do not produce its records first)")
    _common(c)

    e = sub.add_parser("e2e", help="produce-to-consume latency at an offered load")
    _produce_options(e, records=0)
    e.set_defaults(throughput=100_000)
    e.add_argument("--seconds", type=float, default=5.0, help="how long to offer the load (5)")
    _common(e)

    r = sub.add_parser("replicate", help="follower catch-up vs loopback sendfile; acks=all vs acks=1")
    _produce_options(r, records=None)
    r.add_argument("--followers", type=_count, default=2, help="followers for the acks=all comparison (2)")
    _common(r)


def _scaling_commands(sub: Any) -> None:
    """The cost-growth commands (``bench.scaling``): partitions, recovery."""
    c = sub.add_parser("partitions", help="create time, idle CPU, PSS, /dev/shm, first produce, throughput "
                       "ratio per partition count (bench.partition_costs)")
    c.add_argument("--counts", type=_int_list, default=[10, 100, 1000, 5000], help="partition counts")
    c.add_argument("--idle-s", type=float, default=30.0, help="seconds of idle CPU measured (30)")
    c.add_argument("--records", type=_count, default=100_000, help="records of each throughput run (100,000)")
    c.add_argument("--record-size", type=parse_size, default=100)
    c.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the appliance started for each count (repeat)")
    c.add_argument("--wave", type=_count, default=1000,
                   help="the most partitions a produce round touches at once (1,000; bench.partition_costs)")
    c.add_argument("--json", metavar="FILE")

    s = sub.add_parser("partition-throughput", help="throughput and memory as the partition count grows")
    s.add_argument("--counts", type=_int_list, default=[1, 4, 16, 64, 256], help="partition counts")
    s.add_argument("--records", type=_count, default=1_000_000, help="records per count (1,000,000)")
    s.add_argument("--record-size", type=parse_size, default=100)
    s.add_argument("--api", choices=("send", "send_many"), default="send_many")
    s.add_argument("--json", metavar="FILE")
    s.add_argument("--progress", action="store_true")
    s.add_argument("--no-progress", action="store_true")

    k = sub.add_parser("cleaner", help="send() throughput while the cleaner cleans another topic, as a ratio "
                       "to the same with it stopped; the cleaner's peak memory (bench.cleaner_load)")
    k.add_argument("--records", type=_count, default=1_000_000, help="records of each timed run (1,000,000)")
    k.add_argument("--record-size", type=parse_size, default=100)
    k.add_argument("--dirty-records", type=_count, default=3_000_000,
                   help="keyed 100 B records written to the compacted topic before each pair (3,000,000)")
    k.add_argument("--keys", type=_count, default=100_000, help="distinct keys among them (100,000)")
    k.add_argument("--pairs", type=_count, default=3, help="pairs of runs, with and without (3)")
    k.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the appliance started (repeat)")
    k.add_argument("--json", metavar="FILE")

    g = sub.add_parser("groups", help="rebalance time, OffsetCommit round trips/s, group vs assign() "
                       "consume throughput, with confluent-kafka consumers (bench.groups)")
    g.add_argument("--members", type=_count, default=8, help="members of the group that forms (8)")
    g.add_argument("--partitions", type=_count, default=16, help="partitions of the rebalanced topic (16)")
    g.add_argument("--rounds", type=_count, default=5, help="form / leave / join rounds (5)")
    g.add_argument("--commits", type=_count, default=2000, help="synchronous OffsetCommits timed (2,000)")
    g.add_argument("--records", type=_count, default=1_000_000,
                   help="records of the throughput topic, 4 partitions (1,000,000)")
    g.add_argument("--record-size", type=parse_size, default=100)
    g.add_argument("--pairs", type=_count, default=3, help="group / assign() pairs of reads (3)")
    g.add_argument("--data-dir", help="a running appliance's data dir (default: one started here)")
    g.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the appliance started (repeat)")
    g.add_argument("--json", metavar="FILE")

    v = sub.add_parser("recovery", help="restart and crash-recovery time as the log grows")
    v.add_argument("--segments", type=_int_list, default=[1, 10, 100, 1000], help="segment counts")
    v.add_argument("--max-bytes", type=parse_size, default=2 << 30,
                   help="log size at the largest segment count (2GiB; --large: 10GiB)")
    v.add_argument("--large", action="store_true", help="up to 10 GiB")
    v.add_argument("--data-dir", help="where to build the logs (default: a temporary directory)")
    v.add_argument("--json", metavar="FILE")
    v.add_argument("--progress", action="store_true")
    v.add_argument("--no-progress", action="store_true")


def _progress_enabled(args: argparse.Namespace) -> bool:
    if getattr(args, "no_progress", False):
        return False
    return bool(getattr(args, "progress", False)) or sys.stderr.isatty()


def _settings(args: argparse.Namespace) -> Any:
    from bench.produce import ProduceSettings

    transport = args.transport or ("tcp" if args.bootstrap_server else "shm")
    return ProduceSettings(
        records=args.records, record_size=args.record_size, partitions=args.partitions,
        producers=args.producers, acks="all" if args.acks == "-1" else args.acks,
        compression=args.compression,
        batch_size=args.batch_size, linger_ms=args.linger_ms, throughput=args.throughput, api=args.api,
        payload=args.payload, transport=transport, topic=args.topic,
        producer_props=tuple(args.producer_prop), warmup_records=args.warmup_records,
        measure_limits=not args.no_limits, profile=getattr(args, "profile", None),
        recycle_pages=args.recycle_pages,
        timestamp_type=args.message_timestamp_type.replace("compare", "CreateTime"),
    )


def _with_appliance(args: argparse.Namespace, run: Callable[[Appliance], dict[str, Any]]) -> dict[str, Any]:
    app = Appliance.open(args.data_dir, overrides=args.override)
    try:
        return run(app)
    finally:
        app.close()


def _produce(args: argparse.Namespace) -> dict[str, Any]:
    from bench.produce import run_produce

    settings = _settings(args)
    if args.message_timestamp_type == "compare":
        from bench.timestamp_types import compare_timestamp_types

        return _with_appliance(args, lambda app: compare_timestamp_types(
            app, settings, progress=_progress_enabled(args), bootstrap=args.bootstrap_server))
    return _with_appliance(args, lambda app: run_produce(
        app, settings, progress=_progress_enabled(args), bootstrap=args.bootstrap_server,
        keep_topic=args.keep_topic))


def _consume(args: argparse.Namespace) -> dict[str, Any]:
    from bench.consume import run_consume

    settings = _settings(args)
    return _with_appliance(args, lambda app: run_consume(
        app, settings, progress=_progress_enabled(args), bootstrap=args.bootstrap_server,
        keep_topic=args.keep_topic, reuse=args.reuse, fetch_max_bytes=args.fetch_max_bytes))


def _e2e(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e import run_e2e

    if not args.records:  # --seconds decides
        args.records = max(1, int(args.throughput * args.seconds)) if args.throughput > 0 else 1
    settings = _settings(args)
    return _with_appliance(args, lambda app: run_e2e(
        app, settings, seconds=args.seconds, progress=_progress_enabled(args),
        bootstrap=args.bootstrap_server, keep_topic=args.keep_topic))


def _replicate(args: argparse.Namespace) -> dict[str, Any]:
    from bench.replicate import run_replicate

    settings = _settings(args)
    return _with_appliance(args, lambda app: run_replicate(
        app, settings, followers=args.followers, progress=_progress_enabled(args),
        bootstrap=args.bootstrap_server, keep_topic=args.keep_topic))


def _partitions(args: argparse.Namespace) -> dict[str, Any]:
    from bench.partition_costs import run_partition_costs

    return run_partition_costs(args.counts, idle_s=args.idle_s, records=args.records,
                               record_size=args.record_size, overrides=args.override, wave=args.wave)


def _partition_throughput(args: argparse.Namespace) -> dict[str, Any]:
    from bench.scaling import run_partitions

    return run_partitions(args.counts, records=args.records, record_size=args.record_size, api=args.api,
                          progress=_progress_enabled(args))


def _recovery(args: argparse.Namespace) -> dict[str, Any]:
    from bench.scaling import run_recovery

    max_bytes = 10 << 30 if args.large else args.max_bytes
    return run_recovery(args.segments, max_bytes=max_bytes, data_dir=args.data_dir,
                        progress=_progress_enabled(args))


def _cleaner(args: argparse.Namespace) -> dict[str, Any]:
    from bench.cleaner_load import run_cleaner_load

    return run_cleaner_load(records=args.records, record_size=args.record_size,
                            dirty_records=args.dirty_records, keys=args.keys, pairs=args.pairs,
                            overrides=args.override)


def _groups(args: argparse.Namespace) -> dict[str, Any]:
    from bench.groups import run_groups

    if args.members < 2 or args.partitions < args.members + 1:
        raise ConfigError(f"--members {args.members} --partitions {args.partitions}: give at least 2 members "
                          "and more partitions than members (each member, the joiner too, gets one)")
    return run_groups(members=args.members, partitions=args.partitions, rounds=args.rounds,
                      commits=args.commits, records=args.records, record_size=args.record_size,
                      pairs=args.pairs, data_dir=args.data_dir, overrides=args.override)


_RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "produce": _produce, "consume": _consume, "e2e": _e2e, "replicate": _replicate,
    "partitions": _partitions, "partition-throughput": _partition_throughput, "recovery": _recovery,
    "cleaner": _cleaner, "groups": _groups,
}


def main(argv: list[str]) -> int:
    """``appliance bench ARGS``: run the command, print its summary, write its JSON; the exit status."""
    args = build_parser().parse_args(argv)
    from bench.produce import TcpProducerUnavailable

    try:
        result = _RUNNERS[args.command](args)
    except TcpProducerUnavailable as exc:
        print(f"appliance bench {args.command}: not available: {exc}", file=sys.stderr)
        return UNAVAILABLE_EXIT
    except (ConfigError, ApplianceError, OSError) as exc:
        print(f"appliance bench {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"appliance bench {args.command}: interrupted", file=sys.stderr)
        return 130
    if result.get("unavailable"):
        for note in result.get("notes", []):
            print(f"note: {note}")
        print(f"appliance bench {args.command}: not available: {result['unavailable']}", file=sys.stderr)
        if args.json:
            write_json(args.json, result)
        return UNAVAILABLE_EXIT
    _print_result(result)
    if args.json:
        write_json(args.json, result)
    _print_profiles(getattr(args, "profile", None))
    return 0


def _print_result(result: dict[str, Any]) -> None:
    """The summary, the limits measured in the run, the notes."""
    print(result["summary"] if "summary" in result else summary_line(result))
    limits = result.get("limits")
    if limits and "memcpy_mb_per_s" in limits:
        print(f"limits (same run): memcpy {limits['memcpy_mb_per_s']:,.0f} MB/s, page-cache write "
              f"{limits['page_cache_write_mb_per_s']:,.0f} MB/s, loopback sendfile "
              f"{limits['loopback_sendfile_mb_per_s']:,.0f} MB/s")
    for note in result.get("notes", []):
        print(f"note: {note}")


def _print_profiles(path: str | None) -> None:
    import glob
    import os

    from bench.stats import profile_report

    if not path:
        return
    for name in sorted([path] if os.path.exists(path) else glob.glob(f"{glob.escape(path)}.*")):
        print(f"\nprofile {name}:\n{profile_report(name)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
