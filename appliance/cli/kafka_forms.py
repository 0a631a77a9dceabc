"""Kafka's command-line shapes, read into ours: what the commands share to accept Kafka's tools' flags.

* :func:`read_properties`: a Java ``.properties`` file (``--producer.config``, ``--consumer.config``), as
  Kafka's tools read one: ``key=value`` or ``key: value`` or ``key value`` lines, ``#`` and ``!`` comments,
  blank lines skipped, a ``\\`` at the end of a line continuing it.
* :func:`property_pairs`: repeated ``--property k=v`` / ``--producer-property k=v`` values as a dict.
* :func:`topics_argv`: ``kafka-topics.sh``'s ``--create|--list|--describe|--alter|--delete --topic T ...``
  rewritten as ``appliance topics`` subcommand arguments, after refusing the flag combinations
  kafka-topics refuses (:class:`UsageError` naming the flags).  Arguments already in our shape (a
  subcommand word first) pass unchanged.
* :func:`refuse_together`: the one message for two flags that do not go together.
* :func:`topic_filter`: kafka-topics' ``--topic`` as the regular expression it is there (``--list``,
  ``--describe``, ``--alter``, ``--delete``): Kafka's ``IncludeList`` rules.
* :func:`admin_settings`: kafka-topics' ``--command-config FILE``, the admin client's settings, those that
  apply to ours read and the others refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

__all__ = [
    "TOPICS_ACTIONS",
    "AdminSettings",
    "UsageError",
    "admin_settings",
    "property_pairs",
    "read_properties",
    "refuse_together",
    "topic_filter",
    "topics_argv",
]

TOPICS_ACTIONS: Final = ("--create", "--list", "--describe", "--alter", "--delete")
# kafka-topics: the flags that are valid only with some actions (TopicCommand's option checks)
_ONLY_WITH: Final[dict[str, tuple[str, ...]]] = {
    "--partitions": ("--create", "--alter"),
    "--replication-factor": ("--create",),
    "--config": ("--create",),
    "--if-not-exists": ("--create",),
    "--if-exists": ("--alter", "--delete", "--describe"),
    "--under-replicated-partitions": ("--describe",),
    "--unavailable-partitions": ("--describe",),
    "--under-min-isr-partitions": ("--describe",),
    "--at-min-isr-partitions": ("--describe",),
    "--topics-with-overrides": ("--describe",),
    "--exclude-internal": ("--list", "--describe"),
}
# partition reports: any of them together (a partition is printed if one says so), none with the topic report
_REPLICATION_REPORTS: Final = ("--under-replicated-partitions", "--unavailable-partitions",
                               "--under-min-isr-partitions", "--at-min-isr-partitions")
_NEEDS_TOPIC: Final = ("--create", "--alter", "--delete")
# the admin client settings of --command-config that ours has, and the ones whose value must be this one
_ADMIN_SETTINGS: Final = ("bootstrap.servers", "client.id", "request.timeout.ms",
                          "socket.connection.setup.timeout.ms", "security.protocol")


class UsageError(ValueError):
    """Arguments the command cannot take, with the flags named (exit status 2)."""


def refuse_together(first: str, second: str, why: str = "") -> UsageError:
    """The error for two flags given together that Kafka's tool (or ours) refuses together."""
    return UsageError(f"{first} cannot be used with {second}" + (f": {why}" if why else ""))


def read_properties(path: str) -> dict[str, str]:
    """The settings of a Java properties file; :class:`UsageError` naming the file if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read the properties file {path}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for line in _logical_lines(text.splitlines()):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        cut = min((i for i in (stripped.find("="), stripped.find(":"), _first_space(stripped)) if i >= 0),
                  default=len(stripped))
        key, value = stripped[:cut].strip(), stripped[cut + 1 :].strip()
        if not key:
            raise UsageError(f"{path}: line {line!r} has no key (expected key=value)")
        out[key] = value
    return out


def _logical_lines(lines: Iterable[str]) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in lines:
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1].lstrip() if pending else line[:-1]
            continue
        out.append(pending + (line.lstrip() if pending else line))
        pending = ""
    if pending:
        out.append(pending)
    return out


def _first_space(text: str) -> int:
    return next((i for i, c in enumerate(text) if c in " \t"), -1)


def property_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """``["k=v", ...]`` (a repeated ``flag``) as a dict; :class:`UsageError` for an item without ``=``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def topics_argv(argv: Sequence[str]) -> list[str]:
    """``appliance topics`` arguments in our shape: Kafka's ``--ACTION --topic T ...`` rewritten; ours
    kept."""
    args = list(argv)
    if not args or not args[0].startswith("-") or args[0] in ("-h", "--help"):
        return args  # ours (a subcommand word first; argparse names a wrong one)
    actions = [a for a in args if a in TOPICS_ACTIONS]
    if len(actions) != 1:
        given = f" (given: {' '.join(actions)})" if actions else ""
        raise UsageError("kafka-topics form: give exactly one action: --list, --describe, --create, --alter "
                         f"or --delete{given}")
    action = actions[0]
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    for flag, allowed in _ONLY_WITH.items():
        if flag in flags and action not in allowed:
            raise refuse_together(flag, action, f"it goes with {' or '.join(allowed)} (as in kafka-topics)")
    reports = [f for f in _REPLICATION_REPORTS if f in flags]
    if reports and "--topics-with-overrides" in flags:
        raise refuse_together(reports[0], "--topics-with-overrides",
                              "the partition reports and the topic report do not go together (kafka-topics)")
    topic = _value_of(args, "--topic")
    if action in _NEEDS_TOPIC and topic is None:
        raise UsageError(f"{action} needs --topic NAME (as in kafka-topics)")
    if action == "--alter" and "--partitions" not in flags:
        raise UsageError("--alter needs --partitions N (change topic settings with `appliance configs "
                         "--alter --entity-type topics --entity-name T --add-config K=V`)")
    rest = [a for a in args if a != action]
    if action == "--create" and topic is not None:  # a name; with the other actions a regular expression
        rest = _without(rest, "--topic")
        return [action[2:], topic, *rest]
    return [action[2:], *rest]


def topic_filter(raw: str) -> re.Pattern[str]:
    """kafka-topics' ``--topic`` value as the pattern a topic's whole name must match: trimmed, ``,`` read
    as ``|``, spaces and enclosing quotes dropped (Kafka's ``TopicFilter``); :class:`UsageError` if it is
    not a regular expression."""
    text = re.sub(r"[\"']+$", "", re.sub(r"^[\"']+", "", raw.strip().replace(",", "|").replace(" ", "")))
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"--topic {raw!r}: {text} is an invalid regex ({exc})") from None


class AdminSettings(NamedTuple):
    """What a ``--command-config`` file says that our admin client takes."""

    bootstrap_servers: str | None
    client_id: str | None
    request_timeout_ms: int | None
    connect_timeout_ms: int | None


def admin_settings(path: str) -> AdminSettings:
    """The admin client settings of the properties file ``path``; :class:`UsageError` naming the file and
    each setting ours does not have (SSL, SASL, retries... : the appliance's broker speaks PLAINTEXT)."""
    values = read_properties(path)
    unknown = sorted(set(values) - set(_ADMIN_SETTINGS))
    protocol = values.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol != "PLAINTEXT":
        unknown.insert(0, f"security.protocol={protocol}")
    if unknown:
        raise UsageError(f"--command-config {path}: not taken here: {', '.join(unknown)}; the admin client "
                         f"reads {', '.join(_ADMIN_SETTINGS)} (security.protocol PLAINTEXT only)")
    timeouts = {}
    for name in ("request.timeout.ms", "socket.connection.setup.timeout.ms"):
        if name in values:
            try:
                timeouts[name] = int(values[name].strip())
            except ValueError:
                raise UsageError(f"--command-config {path}: {name}={values[name]!r}: expected an integer of "
                                 "milliseconds") from None
            if timeouts[name] < 1:
                raise UsageError(f"--command-config {path}: {name}={timeouts[name]}: expected at least 1")
    return AdminSettings(values.get("bootstrap.servers", "").strip() or None,
                         values.get("client.id", "").strip() or None, timeouts.get("request.timeout.ms"),
                         timeouts.get("socket.connection.setup.timeout.ms"))


def _value_of(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    return None


def _without(args: list[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out
