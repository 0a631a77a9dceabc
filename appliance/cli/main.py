"""The ``appliance`` command: one entry point, one subcommand per job.

Subcommands are registered in ``_COMMANDS`` as ``name -> "module:function"`` and imported only when used, so
``appliance --help`` stays fast and a subcommand's heavy imports (numba, sockets) cost nothing elsewhere.
Each target function takes ``argv: list[str]`` and returns the process exit code.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["main"]

_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("bench.cli:main", "measure throughput and latency, like kafka-*-perf-test"),
    "config": ("appliance.cli.config:main", "check or print the configuration"),
    "configs": ("appliance.cli.configs:main", "read or change topic settings, like kafka-configs"),
    "consumer-groups": (
        "appliance.cli.consumer_groups:main",
        "list, describe, reset and delete consumer groups, like kafka-consumer-groups",
    ),
    "consume": ("appliance.cli.consume:main", "print records of a topic, like kafka-console-consumer"),
    "dump-log": (
        "appliance.cli.dump_log:main",
        "print the record batches of segment files, like kafka-dump-log",
    ),
    "produce": ("appliance.cli.produce:main", "send stdin lines as records, like kafka-console-producer"),
    "repair": (
        "appliance.cli.repair:main",
        "cut a damaged partition log the appliance took offline at its first invalid batch",
    ),
    "replica": ("appliance.cli.replica:main", "follow a leader: copy its replicated partitions to this node"),
    "replicas": ("appliance.cli.replica:replicas_main", "replication status, promote a replica to leader"),
    "serve": ("appliance.cli.serve:main", "run the appliance (the supervisor and its processes)"),
    "topics": ("appliance.cli.topics:main", "create, list, describe or delete topics of a running appliance"),
    "version": ("appliance.cli.version:main", "print the version and the Kafka protocol versions spoken"),
}


def _usage() -> str:
    lines = ["usage: appliance COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_text) in sorted(_COMMANDS.items()):
        lines.append(f"  {name:<16} {help_text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = ("version" if args[0] == "--version" else args[0]), args[1:]
    if name not in _COMMANDS:
        print(f"appliance: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = _COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest))
    except BrokenPipeError:  # the reader went away (`dump-log ... | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
