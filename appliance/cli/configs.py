"""``appliance configs``: read and change a running appliance's topic settings, as ``kafka-configs.sh`` does.

::

    appliance configs --bootstrap-server HOST:PORT --entity-type topics --entity-name T --describe [--all]
    appliance configs --bootstrap-server HOST:PORT --entity-type topics --entity-name T --alter \\
        [--add-config K=V[,K=V...]] [--delete-config K[,K...]]
    appliance configs --bootstrap-server HOST:PORT --entity-type brokers --entity-name 0 --describe [--all]

kafka-configs' shorter entity flags work too: ``--topic T`` for ``--entity-type topics --entity-name T``,
``--broker ID`` for ``--entity-type brokers --entity-name ID``, and ``--add-config-file FILE`` (a properties
file) beside ``--add-config``.

It speaks the Kafka protocol (DescribeConfigs, IncrementalAlterConfigs) through the admin client, so it
works from any host, and ``kafka-configs.sh`` does the same against the appliance.  ``--describe`` prints,
as kafka-configs does, the settings set on the entity (a topic's overrides; a broker's settings that differ
from their defaults), or every setting with ``--all``, one per line::

    Dynamic configs for topic orders are:
      retention.ms=60000 sensitive=false synonyms={TOPIC_CONFIG:retention.ms=60000, DEFAULT_CONFIG:...}

A value list in ``--add-config`` is written in brackets, as kafka-configs takes it:
``cleanup.policy=[compact,delete]``.  ``--alter`` changes only the keys given; the change takes effect
without a restart.  Brokers cannot be altered: their settings are in the configuration file (a restart
applies them).

Exit status: 0 done; 1 refused (INVALID_CONFIG naming the key, unknown topic, no broker there); 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TextIO

from appliance.cli.kafka_forms import (
    AdminSettings,
    UsageError,
    admin_settings,
    read_properties,
    refuse_together,
)
from appliance.client.admin import DEFAULT_BOOTSTRAP_SERVER, KafkaAdmin
from appliance.client.admin_configs import ConfigEntry
from ipc.kafka import ConfigSource, ResourceType
from ipc.kafka_client import BrokerConnectionError
from storage.errors import ApplianceError

__all__ = ["main", "parse_add_config"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_ENTITY_TYPES = {"topics": ResourceType.TOPIC, "brokers": ResourceType.BROKER}
_KAFKA_SOURCE_NAMES = {  # as kafka-configs prints them
    ConfigSource.TOPIC_CONFIG: "DYNAMIC_TOPIC_CONFIG",
    ConfigSource.STATIC_BROKER_CONFIG: "STATIC_BROKER_CONFIG",
    ConfigSource.DEFAULT_CONFIG: "DEFAULT_CONFIG",
}


def parse_add_config(text: str) -> dict[str, str]:
    """``K=V,K=[a,b],...`` as kafka-configs reads ``--add-config``; ValueError for an item without ``=``."""
    out: dict[str, str] = {}
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--add-config {text!r}: {item!r} is not KEY=VALUE")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance configs", description="read or change topic settings")
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT",
                        help=f"a broker of the appliance (default {DEFAULT_BOOTSTRAP_SERVER})")  # fmt: skip
    parser.add_argument("--command-config", metavar="FILE",
                        help="the admin client's settings, a properties file (as kafka-configs)")
    parser.add_argument("--entity-type", choices=sorted(_ENTITY_TYPES))
    parser.add_argument("--entity-name", help="the topic, or the broker's node id")
    parser.add_argument("--topic", metavar="T", help="the same as --entity-type topics --entity-name T")
    parser.add_argument("--broker", metavar="ID", help="the same as --entity-type brokers --entity-name ID")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", action="store_true", help="print the settings")
    what.add_argument("--alter", action="store_true", help="change the settings given")
    parser.add_argument("--all", action="store_true", help="with --describe: every setting")
    parser.add_argument("--add-config", metavar="K=V[,K=V]", action="append", default=[],
                        help="settings to set (repeatable)")  # fmt: skip
    parser.add_argument("--add-config-file", metavar="FILE",
                        help="settings to set, from a properties file (with --alter)")
    parser.add_argument("--delete-config", metavar="K[,K]", action="append", default=[],
                        help="settings to reset to their defaults (repeatable)")  # fmt: skip
    return parser


def format_entry(entry: ConfigEntry) -> str:
    """One setting as kafka-configs prints it."""
    synonyms = ", ".join(f"{_KAFKA_SOURCE_NAMES.get(ConfigSource(s.source), ConfigSource(s.source).name)}:"
                         f"{s.name}={s.value}" for s in entry.synonyms)  # fmt: skip
    return (f"  {entry.name}={'' if entry.value is None else entry.value} "
            f"sensitive={'true' if entry.sensitive else 'false'} synonyms={{{synonyms}}}")  # fmt: skip


def _entity(args: argparse.Namespace) -> None:
    """Fold ``--topic T`` / ``--broker ID`` into ``--entity-type`` / ``--entity-name``, refusing them
    together with those (UsageError naming the flags), as kafka-configs does."""
    for flag, kind, value in (("--topic", "topics", args.topic), ("--broker", "brokers", args.broker)):
        if value is None:
            continue
        for other, given in (("--entity-type", args.entity_type), ("--entity-name", args.entity_name)):
            if given is not None:
                raise refuse_together(flag, other, f"{flag} names the entity already")
        args.entity_type, args.entity_name = kind, value
    if args.topic is not None and args.broker is not None:
        raise refuse_together("--topic", "--broker", "give one entity")
    if args.entity_type is None or args.entity_name is None:
        raise UsageError("name the entity: --topic T, --broker ID, or --entity-type topics|brokers "
                         "--entity-name NAME")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    kind = _ENTITY_TYPES[args.entity_type]
    try:
        given = args.admin
        admin = KafkaAdmin(args.bootstrap_server or given.bootstrap_servers or DEFAULT_BOOTSTRAP_SERVER,
                           client_id=given.client_id or "appliance-configs",
                           request_timeout_ms=given.request_timeout_ms or 30_000,
                           connect_timeout_ms=given.connect_timeout_ms or 10_000)
    except (BrokerConnectionError, ApplianceError) as exc:
        print(f"appliance configs: {exc} (is the appliance running there?)", file=err)
        return EXIT_FAILED
    try:
        if args.describe:
            entries = admin.describe_configs(kind, args.entity_name)
            unset = (ConfigSource.DEFAULT_CONFIG, -1)
            shown = [e for e in entries.values() if args.all or e.source not in unset]
            what = "topic" if kind == ResourceType.TOPIC else "broker"
            print(f"{'All' if args.all else 'Dynamic'} configs for {what} {args.entity_name} are:", file=out)
            for entry in shown:
                print(format_entry(entry), file=out)
        else:
            admin.incremental_alter_configs(kind, args.entity_name, set_configs=args.set_configs,
                                            delete_configs=args.delete_configs)  # fmt: skip
            print(f"Completed updating config for {args.entity_type[:-1]} {args.entity_name}.", file=out)
    except (ApplianceError, OSError) as exc:
        print(f"appliance configs: {exc}", file=err)
        return EXIT_FAILED
    finally:
        admin.close()
    return EXIT_OK


def main(argv: list[str]) -> int:
    """``appliance configs ...``"""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    try:
        _entity(args)
        args.admin = (admin_settings(args.command_config) if args.command_config is not None
                      else AdminSettings(None, None, None, None))
        args.set_configs = read_properties(args.add_config_file) if args.add_config_file else {}
        for text in args.add_config:
            args.set_configs.update(parse_add_config(text))
        args.delete_configs = [k.strip() for text in args.delete_config for k in text.split(",") if k.strip()]
        if args.alter and not (args.set_configs or args.delete_configs):
            raise ValueError("--alter needs --add-config or --delete-config")
        if args.describe and (args.set_configs or args.delete_configs):
            raise ValueError("--add-config and --delete-config go with --alter")
        if args.all and not args.describe:
            raise refuse_together("--all", "--alter", "--all goes with --describe (as in kafka-configs)")
    except ValueError as exc:
        print(f"appliance configs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(args, sys.stdout, sys.stderr)
