"""``appliance replica`` (run a replica) and ``appliance replicas status|promote`` (look at and move leaders).

Where the node is: ``--control-socket PATH``, or the configuration naming it (``--config FILE``,
``--override KEY=VALUE``).  The same commands work against a leader (``appliance serve``: its supervisor's
control socket) and a replica (``appliance replica``: the replica process's), and say which one answered.

``appliance replicas status`` prints one line per partition, then for a leader one indented line per
follower (fields separated by tabs, as ``appliance topics describe`` does)::

    Node: 0  Role: leader
    Topic: orders  Partition: 0  Leader: 0  LeaderEpoch: 3  Replicas: 0,1,2  Isr: 0,1,2  LogEndOffset: 120 ...
        Follower: 1  InIsr: yes  LogEndOffset: 120  LagRecords: 0  LagMs: 0  LastFetchMsAgo: 2

A replica shows, per partition, whom it follows, its phase (truncating or fetching), its log end offset
and high watermark, whether the last ISR it saw includes it, and its last error.  ``--json`` prints the
control socket's answer as it is.

``appliance replicas promote (TOPIC-PARTITION... | --all) [--unclean]`` asks a *replica* to become the
leader (``appliance.replica``: it must name every partition the replica holds; refused while the old
leader answers; refused for an out-of-sync replica unless ``--unclean``, which prints a warning that
acknowledged records may be lost).  The replica then turns into ``appliance serve`` on its own data;
``--wait S`` waits until it answers as leader.  Exit status: 0 done; 1 refused or failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from appliance.cli.config import add_config_arguments, config_from_args
from appliance.config.server_config import ConfigError
from ipc.control import ControlClient, ControlError
from storage.errors import ApplianceError

__all__ = ["format_status", "main", "replicas_main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: list[str]) -> int:
    """``appliance replica [--config FILE] [--override KEY=VALUE]...``"""
    parser = argparse.ArgumentParser(
        prog="appliance replica",
        description="follow a leader: copy its replicated partitions into this node's log.dirs "
                    "(needs appliance.replica.leader and a node.id of its own)")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"appliance replica: {exc}", file=sys.stderr)
        return EXIT_FAILED
    from appliance.cli.serve import setup_logging  # the service's imports, only when it runs
    from appliance.follower.replica import run_replica

    setup_logging(config.log_level)
    try:
        return run_replica(config, argv)
    except ConfigError as exc:
        print(f"appliance replica: {exc}", file=sys.stderr)
        return EXIT_FAILED


# -- appliance replicas ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance replicas",
                                     description="replication state and failover of an appliance")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser("status", help="leader, replicas, ISR, high watermark, follower lag")
    status.add_argument("--json", action="store_true", help="print the raw answer")
    promote = commands.add_parser("promote", help="make this replica the leader of its partitions")
    promote.add_argument("partitions", nargs="*", metavar="TOPIC-PARTITION")
    promote.add_argument("--all", action="store_true", help="every partition the replica holds")
    promote.add_argument("--unclean", action="store_true",
                         help="also if out of sync: records the old leader acknowledged may be lost")
    promote.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait until the promoted node answers as leader")
    for sub in (status, promote):
        sub.add_argument("--control-socket", metavar="PATH",
                         help="the node's control socket (default: from the configuration)")
        add_config_arguments(sub)
    return parser


def replicas_main(argv: list[str]) -> int:
    """``appliance replicas status|promote ...``"""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    if args.command == "promote" and bool(args.all) == bool(args.partitions):
        print("appliance replicas promote: name TOPIC-PARTITION... or --all (not both)", file=sys.stderr)
        return EXIT_USAGE
    return run(args, sys.stdout, sys.stderr)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        path = args.control_socket or config_from_args(args).control_socket
        client = ControlClient.connect(path, timeout_s=60.0)
    except (ApplianceError, OSError) as exc:
        print(f"appliance replicas: {exc}", file=err)
        return EXIT_FAILED
    try:
        if args.command == "status":
            reply = client.request({"op": "replica_status"})
            if args.json:
                print(json.dumps(reply, indent=2, sort_keys=True), file=out)
            else:
                print(format_status(reply), file=out)
            return EXIT_OK
        partitions: object = "all" if args.all else list(args.partitions)
        reply = client.request({"op": "promote", "partitions": partitions, "unclean": bool(args.unclean)})
    except ControlError as exc:
        print(f"appliance replicas {args.command}: {exc}", file=err)
        return EXIT_FAILED
    except (ApplianceError, OSError) as exc:
        print(f"appliance replicas {args.command}: {exc}", file=err)
        return EXIT_FAILED
    finally:
        client.close()
    for warning in reply.get("warnings", []):
        print(f"WARNING: {warning}", file=err)
    for p in reply.get("promoted", []):
        print(f"Promoted {p['partition']}: node {reply['node_id']} leads it next (ISR {p['isr']}, high "
              f"watermark {p['high_watermark']}, log end offset {p['log_end_offset']}"
              f"{'' if p['clean'] else ', UNCLEAN'}).", file=out)
    print(f"Node {reply['node_id']} is becoming the leader (appliance serve on its own data, listeners "
          f"{', '.join(reply.get('listeners', []))}).", file=out)
    if args.wait > 0:
        return _wait_leader(path, args.wait, err)
    return EXIT_OK


def _wait_leader(path: str, timeout_s: float, err: TextIO) -> int:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with ControlClient.connect(path, timeout_s=5.0) as client:
                if client.request({"op": "replica_status"}).get("role") == "leader":
                    return EXIT_OK
        except (ApplianceError, OSError) as exc:
            last = str(exc)
        time.sleep(0.1)
    print(f"appliance replicas promote: the node did not answer as leader within {timeout_s} s ({last})",
          file=err)
    return EXIT_FAILED


def _ids(values: Any) -> str:
    return ",".join(str(v) for v in values) or "-"


def format_status(reply: Mapping[str, Any]) -> str:
    """The ``replica_status`` answer of a leader or a replica as text lines (no trailing newline)."""
    role = reply.get("role")
    lines = []
    if role == "leader":
        lines.append(f"Node: {reply['node_id']}\tRole: leader")
        for topic in reply.get("topics", []):
            for p in topic["partitions"]:
                lines.append(
                    f"Topic: {topic['name']}\tPartition: {p['partition']}\tLeader: {p.get('leader', 0)}\t"
                    f"LeaderEpoch: {p['leader_epoch']}\t"
                    f"Replicas: {_ids(p.get('replicas') or topic.get('replicas', []))}\t"
                    f"Isr: {_ids(p.get('isr', []))}\tMinIsr: {topic.get('min_insync_replicas', 1)}\t"
                    f"LogEndOffset: {p['log_end_offset']}\tHighWatermark: {p['high_watermark']}\t"
                    f"CommittedHighWatermark: {p.get('committed_high_watermark', -1)}"
                )
                for f in p.get("followers", []):
                    lines.append(
                        f"\tFollower: {f['replica_id']}\tInIsr: {'yes' if f['in_isr'] else 'no'}\t"
                        f"LogEndOffset: {f['log_end_offset']}\tLagRecords: {f['lag_records']}\t"
                        f"LagMs: {f['lag_ms']}\tLastFetchMsAgo: {f['last_fetch_ms_ago']}"
                    )
    else:
        unreachable = reply.get("unreachable", {})
        lines.append(f"Node: {reply['node_id']}\tRole: replica\tLeaders: {_ids(reply.get('leaders', []))}\t"
                     f"Unreachable: {_ids(sorted(unreachable)) if unreachable else '-'}")
        for p in reply.get("partitions", []):
            lines.append(
                f"Topic: {p['topic']}\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
                f"LeaderEpoch: {p['leader_epoch']}\tLeaderAddress: {p['leader_address'] or '-'}\t"
                f"Phase: {p['phase']}\tLogStartOffset: {p['log_start_offset']}\t"
                f"LogEndOffset: {p['log_end_offset']}\tHighWatermark: {p['high_watermark']}\t"
                f"InIsr: {'yes' if p['in_isr'] else 'no'} (Isr {_ids(p['isr_seen'])}, seen "
                f"{p['isr_seen_ms_ago']} ms ago)\tLastFetchMsAgo: {p['last_fetch_ms_ago']}\t"
                f"LastError: {p['last_error'] or '-'}"
            )
    return "\n".join(lines)
