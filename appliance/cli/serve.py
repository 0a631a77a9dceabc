"""``appliance serve``: run the appliance, the supervisor and its processes (``appliance.server.supervisor``).

With ``appliance.replica.leader`` set, the same command runs a replica of that leader instead
(``appliance.follower.replica``): how a former leader rejoins after a failover.  A promoted replica
``exec``\\s this command with the setting cleared.  :func:`setup_logging` is the one logging set-up of the
service's processes (``appliance serve``, ``appliance replica``): to stderr, which systemd's journal keeps.
"""

from __future__ import annotations

import argparse
import logging
import sys

from appliance.cli.config import add_config_arguments, config_from_args
from appliance.server.children import load_extra_children
from appliance.server.supervisor import Supervisor
from storage.errors import ConfigError

__all__ = ["main", "setup_logging"]


def setup_logging(level: str) -> None:
    """Log records of ``level`` (a name: "INFO") and above to stderr, with time, pid and logger name."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(levelname)s [%(process)d] %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        force=True,
    )


def main(argv: list[str]) -> int:
    """``appliance serve [--config FILE] [--override KEY=VALUE]...``"""
    parser = argparse.ArgumentParser(prog="appliance serve", description="run the log appliance (supervisor)")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        setup_logging(config.log_level)
        if config.replica_leader:  # a former leader rejoining, or a node told to follow
            from appliance.follower.replica import run_replica  # else EXTRA_CHILDREN imports it, later

            return run_replica(config, argv)
        extras = load_extra_children(config)
    except ConfigError as exc:
        print(f"appliance serve: {exc}", file=sys.stderr)
        return 1
    return Supervisor(config, extra_children=extras).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
