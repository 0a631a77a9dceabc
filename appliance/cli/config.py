"""``appliance config check|show``, and the ``--appliance-config FILE`` / ``--override KEY=VALUE`` arguments
every command that runs on the appliance's configuration takes (``serve``, ``replica``, ``replicas``).

``--config FILE`` is the older spelling of ``--appliance-config`` and still works in these commands, and
in ``produce`` and ``consume``: none of them takes topic settings.  ``appliance topics`` takes only
``--appliance-config``, because there ``--config K=V`` is a topic setting, as in kafka-topics."""

from __future__ import annotations

import argparse
import sys

from appliance.config.server_config import Config, ConfigError, load_config

__all__ = ["add_config_arguments", "config_from_args", "main"]


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--appliance-config FILE`` (or ``--config FILE``) and repeatable ``--override KEY=VALUE`` to a
    subcommand's parser."""
    parser.add_argument("--appliance-config", "--config", dest="config", metavar="FILE",
                        help="the appliance's TOML configuration file (default: none, defaults)")
    parser.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                        help="set one setting, after the file (repeatable), e.g. --override num.partitions=8")


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config named by the arguments :func:`add_config_arguments` added."""
    return load_config(args.config, args.override)


def main(argv: list[str]) -> int:
    """``appliance config check|show [--config FILE] [--override KEY=VALUE]...``"""
    parser = argparse.ArgumentParser(prog="appliance config", description="check or print the configuration")
    parser.add_argument("action", choices=("check", "show"),
                        help="check: validate and say so; show: print the effective settings as TOML")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"appliance config: {exc}", file=sys.stderr)
        return 1
    if args.action == "show":
        print(config.to_toml(), end="")
    else:
        print(f"configuration OK: {config.source or 'defaults'}, {len(config.topics)} topic(s) declared")
    return 0
