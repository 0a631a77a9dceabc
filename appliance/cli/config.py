"""``appliance config check|show``, and the ``--config FILE`` / ``--override KEY=VALUE`` arguments every
command that runs on the appliance's configuration takes (``serve``, ``replica``, ``replicas``)."""

from __future__ import annotations

import argparse
import sys

from appliance.config.server_config import Config, ConfigError, load_config

__all__ = ["add_config_arguments", "config_from_args", "main"]


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` and repeatable ``--override KEY=VALUE`` to a subcommand's parser."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (default: none, defaults)")
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
