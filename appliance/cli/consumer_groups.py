"""``appliance consumer-groups``: list, describe, reset and delete consumer groups, like Kafka's tool.

::

    appliance consumer-groups [--bootstrap-server HOST:PORT] --list [--state]
    appliance consumer-groups --describe (--group G ... | --all-groups)
        [--offsets | --members [--verbose] | --state]
    appliance consumer-groups --reset-offsets (--group G ... | --all-groups)
        (--topic T[:P,P...] ... | --all-topics)
        (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO | --by-duration PnDTnHnMnS
         | --shift-by N | --to-current)
        [--dry-run | --execute]
    appliance consumer-groups --delete (--group G ... | --all-groups)
    appliance consumer-groups --delete-offsets --group G --topic T[:P,P...] ...

It speaks the Kafka protocol through :class:`appliance.client.group_admin.GroupAdmin`, so it works from
any host, and ``kafka-consumer-groups.sh`` does the same against the appliance.  Output follows
kafka-consumer-groups: ``--describe`` prints per group a table with Kafka's columns (``GROUP TOPIC
PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID``: a row per partition a member
owns, then a row per partition the group committed that nobody owns now, with ``-`` for the member
columns); ``--members`` a row per member (``#PARTITIONS``, and with ``--verbose`` its ``ASSIGNMENT``);
``--state`` the coordinator, assignor, state and member count.  LOG-END-OFFSET is the high watermark (what
a consumer can read), as Kafka's tool shows it; LAG is that minus the committed offset.

``--reset-offsets`` computes new committed offsets (``GROUP TOPIC PARTITION NEW-OFFSET``) and, with
``--execute``, commits them as an admin (generation -1, no member).  As in Kafka it is allowed only while
the group is inactive (Empty, or unknown: Dead); a requested offset outside the partition's log is moved to
its nearest end, with a warning; without ``--execute`` nothing changes (``--dry-run``, Kafka's default,
warned about when neither is given).  ``--to-datetime`` takes ISO 8601 (``2026-11-28T10:00:00``,
``...T10:00:00.000+01:00``, ``...Z``; without a zone, local time, as Kafka reads it); a partition with no
record at or after it falls back to its latest offset, with a warning.  ``--by-duration`` (``PT1H30M``,
``P1D``: Java's ``Duration`` text) is the time that long before now.  ``--command-config FILE`` gives the
admin client's settings as kafka-consumer-groups takes them (``kafka_forms.admin_settings``).

``--delete`` removes inactive groups and their committed offsets
(DeleteGroups; a group with members is refused, NON_EMPTY_GROUP); ``--delete-offsets`` removes one group's
committed offsets of some topics or partitions (OffsetDelete; refused, GROUP_SUBSCRIBED_TO_TOPIC, for a
topic a member of the group still consumes), with a ``TOPIC PARTITION STATUS`` row per partition.

Messages to the user go to stderr, tables to stdout.  Exit status: 0 done; 1 refused or failed (the group
does not exist, is not inactive for a reset, the coordinator refused, no broker there; the reason names the
group and what to do); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from appliance.cli.kafka_forms import admin_settings
from appliance.client.group_admin import (
    EARLIEST,
    LATEST,
    GroupAdmin,
    GroupAdminError,
    GroupDescription,
    GroupListing,
    group_error,
)
from appliance.client.kafka_cluster import DEFAULT_BOOTSTRAP_SERVER
from ipc.kafka import ErrorCode, error_name
from ipc.kafka_client import BrokerConnectionError, parse_bootstrap_servers
from storage.errors import ApplianceError

__all__ = ["main", "parse_datetime_ms", "parse_topic_partitions"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

MISSING = "-"  # Kafka's tool prints this for a value it does not have
_ACTIONS = ("list", "describe", "reset_offsets", "delete", "delete_offsets")
_SCENARIOS = ("to_earliest", "to_latest", "to_offset", "to_datetime", "by_duration", "shift_by", "to_current")
# java.time.Duration's text: PnDTnHnMn.nS, each part signed, the whole optionally negated
_DURATION = re.compile(r"([-+]?)P(?:([-+]?\d+)D)?"
                       r"(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
                       re.IGNORECASE)
_INACTIVE = ("Empty", "Dead")

TopicPartition = tuple[str, int]


class UsageError(ValueError):
    """Arguments that do not make a command (exit status 2)."""


# -- arguments -------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance consumer-groups",
        description="list, describe, reset and delete consumer groups, like kafka-consumer-groups",
    )
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT",
                        help=f"a broker of the appliance (default {DEFAULT_BOOTSTRAP_SERVER})")
    parser.add_argument("--command-config", metavar="FILE",
                        help="the admin client's settings, a properties file (as kafka-consumer-groups)")
    actions = parser.add_argument_group("actions (one of)")
    actions.add_argument("--list", action="store_true", help="list every consumer group")
    actions.add_argument("--describe", action="store_true", help="describe groups (default: their offsets)")
    actions.add_argument("--reset-offsets", action="store_true", help="reset a group's committed offsets")
    actions.add_argument("--delete", action="store_true", help="delete inactive groups and their offsets")
    actions.add_argument("--delete-offsets", action="store_true", help="delete a group's offsets of topics")
    which = parser.add_argument_group("which groups and partitions")
    which.add_argument("--group", action="append", default=[], metavar="G", help="a group (repeatable)")
    which.add_argument("--all-groups", action="store_true", help="every group")
    which.add_argument("--topic", action="append", default=[], metavar="T[:P,P...]",
                       help="a topic, or some of its partitions (repeatable)")
    which.add_argument("--all-topics", action="store_true", help="every partition the group committed")
    show = parser.add_argument_group("--describe and --list variants")
    show.add_argument("--offsets", action="store_true", help="offsets and lag per partition (the default)")
    show.add_argument("--members", action="store_true", help="one row per member")
    show.add_argument("--verbose", action="store_true", help="with --members: each member's partitions")
    show.add_argument("--state", action="store_true", help="coordinator, assignor, state, member count")
    reset = parser.add_argument_group("--reset-offsets: the new offsets (one of)")
    reset.add_argument("--to-earliest", action="store_true", help="each partition's log start offset")
    reset.add_argument("--to-latest", action="store_true", help="each partition's latest offset")
    reset.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    reset.add_argument("--to-datetime", metavar="ISO", help="the first offset at or after a time")
    reset.add_argument("--by-duration", metavar="PnDTnHnMnS",
                       help="the first offset at or after that long ago (ISO 8601 duration, e.g. PT1H30M)")
    reset.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (may be < 0)")
    reset.add_argument("--to-current", action="store_true", help="the committed offset (else latest)")
    reset.add_argument("--dry-run", action="store_true", help="print the new offsets, change nothing")
    reset.add_argument("--execute", action="store_true", help="commit the new offsets")
    parser.add_argument("--timeout", type=int, default=30_000, metavar="MS",
                        help="how long to wait for the coordinator (default 30000)")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """UsageError for a combination kafka-consumer-groups refuses too."""
    actions = [a for a in _ACTIONS if getattr(args, a)]
    if len(actions) != 1:
        raise UsageError("give exactly one of --list, --describe, --reset-offsets, --delete, "
                         "--delete-offsets")
    if args.command_config is not None:
        settings = admin_settings(args.command_config)
        args.bootstrap_server = args.bootstrap_server or settings.bootstrap_servers
        args.client_id = settings.client_id
        args.timeout = settings.request_timeout_ms or args.timeout
    args.bootstrap_server = args.bootstrap_server or DEFAULT_BOOTSTRAP_SERVER
    parse_bootstrap_servers(args.bootstrap_server)
    action = actions[0]
    if action != "list" and not args.group and not args.all_groups:
        raise UsageError(f"--{action.replace('_', '-')} needs --group G or --all-groups")
    if args.group and args.all_groups:
        raise UsageError("give --group G or --all-groups, not both")
    if action == "describe" and args.offsets + args.members + args.state > 1:
        raise UsageError("--describe takes one of --offsets, --members, --state")
    if args.verbose and not args.members:
        raise UsageError("--verbose goes with --describe --members")
    if action == "reset_offsets":
        _check_reset_arguments(args)
    elif action == "delete_offsets":
        if len(args.group) != 1 or not args.topic:
            raise UsageError("--delete-offsets needs one --group G and --topic T[:P,P...] (repeatable)")
        for topic in args.topic:
            parse_topic_partitions(topic)
    elif args.topic or args.all_topics or any(_given(args, s) for s in _SCENARIOS) or args.execute:
        raise UsageError(f"--topic, --all-topics and the --to-* options go with --reset-offsets, "
                         f"not --{action}")


def _check_reset_arguments(args: argparse.Namespace) -> None:
    scenarios = [s for s in _SCENARIOS if _given(args, s)]
    if len(scenarios) != 1:
        raise UsageError("--reset-offsets needs exactly one of --to-earliest, --to-latest, --to-offset N, "
                         "--to-datetime ISO, --by-duration PnDTnHnMnS, --shift-by N, --to-current")
    if bool(args.topic) == args.all_topics:
        raise UsageError("--reset-offsets needs --topic T[:P,P...] (repeatable) or --all-topics")
    if args.dry_run and args.execute:
        raise UsageError("give --dry-run or --execute, not both")
    for topic in args.topic:
        parse_topic_partitions(topic)
    if args.to_datetime is not None:
        parse_datetime_ms(args.to_datetime)
    if args.by_duration is not None:
        parse_duration_ms(args.by_duration)


def _given(args: argparse.Namespace, scenario: str) -> bool:
    value = getattr(args, scenario)
    return value is not None and value is not False


def parse_topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """``T`` -> (T, None: every partition); ``T:0,2`` -> (T, [0, 2]).  UsageError for a bad partition."""
    topic, sep, rest = text.partition(":")
    if not topic:
        raise UsageError(f"--topic {text!r}: no topic name")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in rest.split(",")]
    except ValueError:
        raise UsageError(f"--topic {text!r}: partitions are numbers, e.g. {topic}:0,1") from None
    if any(p < 0 for p in partitions):
        raise UsageError(f"--topic {text!r}: partitions are 0 or more")
    return topic, partitions


def parse_datetime_ms(text: str) -> int:
    """An ISO 8601 time as epoch milliseconds (no zone: local time).  UsageError if it is not one."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--to-datetime {text!r}: not an ISO 8601 time, e.g. 2026-11-28T10:00:00.000 "
                         "or 2026-11-28T10:00:00Z") from None
    return int(moment.timestamp() * 1000)  # a naive datetime is taken as local time


def parse_duration_ms(text: str) -> int:
    """An ISO 8601 duration as Java's ``Duration.parse`` reads it (``P1D``, ``PT1H30M``, ``PT0.5S``,
    ``-PT5M``), in milliseconds.  UsageError if it is not one."""
    found = _DURATION.fullmatch(text.strip())
    if found is None or not any(found.group(i) for i in (2, 3, 4, 5)):
        raise UsageError(f"--by-duration {text!r}: not an ISO 8601 duration, e.g. PT1H30M or P1DT12H")
    sign, days, hours, minutes, seconds, fraction = found.groups()
    total_ms = (int(days or 0) * 86_400_000 + int(hours or 0) * 3_600_000 + int(minutes or 0) * 60_000
                + int(seconds or 0) * 1000)
    if fraction:
        millis = int((fraction + "000")[:3])
        total_ms += -millis if (seconds or "").startswith("-") else millis
    return -total_ms if sign == "-" else total_ms


# -- tables ----------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[object]], min_widths: Sequence[int]) -> str:
    """Left-aligned columns separated by a space, each as wide as its widest cell (at least its minimum),
    the last one unpadded, as kafka-consumer-groups lays its tables out."""
    cells = [list(header), *([str(v) for v in row] for row in rows)]
    widths = [max(min_widths[i], *(len(r[i]) for r in cells)) for i in range(len(header))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        lines.append(" ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """One row of ``--describe --offsets``."""

    group: str
    topic: str
    partition: int
    current_offset: int | None  # committed; None: never committed
    log_end_offset: int | None
    consumer_id: str
    host: str
    client_id: str

    @property
    def lag(self) -> int | None:
        if self.current_offset is None or self.log_end_offset is None:
            return None
        return self.log_end_offset - self.current_offset

    def cells(self) -> list[object]:
        def show(value: int | None) -> object:
            return MISSING if value is None else value

        return [self.group, self.topic, self.partition, show(self.current_offset), show(self.log_end_offset),
                show(self.lag), self.consumer_id, self.host, self.client_id]


def offset_rows(admin: GroupAdmin, group: GroupDescription) -> list[OffsetRow]:
    """Members' partitions (members with the most partitions first), then committed partitions nobody owns."""
    committed = admin.committed_offsets(group.group_id)
    owned = [(m, p) for m in sorted(group.members, key=lambda m: -len(m.assignment)) for p in m.assignment]
    owned_keys = {p for _, p in owned}
    unowned = sorted(k for k in committed if k not in owned_keys)
    wanted = [p for _, p in owned] + unowned
    ends = admin.log_offsets(wanted, LATEST, missing_ok=True) if wanted else {}  # "-" for a deleted topic
    rows = [OffsetRow(group.group_id, t, p, committed.get((t, p)), ends.get((t, p)), m.member_id,
                      m.host, m.client_id) for m, (t, p) in owned]
    rows += [OffsetRow(group.group_id, t, p, committed[(t, p)], ends.get((t, p)), MISSING, MISSING, MISSING)
             for t, p in unowned]
    return rows


def _exists(group: GroupDescription, err: TextIO) -> bool:
    """Kafka's notes on a group's state before its table; False (an error) for a group that does not exist."""
    if group.state == "Dead":
        print(f"Error: Consumer group '{group.group_id}' does not exist "
              "(`appliance consumer-groups --list` lists the groups).", file=err)
        return False
    if group.state == "Empty":
        print(f"Consumer group '{group.group_id}' has no active members.", file=err)
    elif group.state != "Stable":
        print(f"Warning: Consumer group '{group.group_id}' is rebalancing.", file=err)
    return True


def describe(admin: GroupAdmin, args: argparse.Namespace, groups: list[str], out: TextIO, err: TextIO) -> int:
    status = EXIT_OK
    for group_id in groups:
        group = admin.describe_group(group_id)
        if not _exists(group, err):
            status = EXIT_FAILED
            continue
        if args.members:
            text = _members_table(group, args.verbose)
        elif args.state:
            node_id, host, port = group.coordinator
            text = table(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                         [[group.group_id, f"{host}:{port} ({node_id})", group.assignor or MISSING,
                           group.state, len(group.members)]], [15, 25, 20, 15, 0])
        else:
            rows = offset_rows(admin, group)
            if not rows:
                continue
            text = table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                          "CONSUMER-ID", "HOST", "CLIENT-ID"], [r.cells() for r in rows],
                         [15, 15, 10, 15, 15, 15, 15, 15, 0])
        print(f"\n{text}", file=out)
    return status


def _members_table(group: GroupDescription, verbose: bool) -> str:
    with_instance = any(m.group_instance_id for m in group.members)
    header = ["GROUP", "CONSUMER-ID", *(["GROUP-INSTANCE-ID"] if with_instance else []), "HOST", "CLIENT-ID",
              "#PARTITIONS", *(["ASSIGNMENT"] if verbose else [])]
    rows = []
    for m in group.members:
        row: list[object] = [group.group_id, m.member_id]
        if with_instance:
            row.append(m.group_instance_id or MISSING)
        row += [m.host, m.client_id, len(m.assignment)]
        if verbose:
            row.append(_assignment_text(m.assignment))
        rows.append(row)
    widths = [15, 15, *([17] if with_instance else []), 15, 15, 11, *([0] if verbose else [])]
    return table(header, rows, widths)


def _assignment_text(assignment: Sequence[TopicPartition]) -> str:
    """``topic(0,1), other(2)``; ``-`` for none."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    parts = [f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in sorted(by_topic.items())]
    return ", ".join(parts) or MISSING


# -- reset -----------------------------------------------------------------------------------------------


def partitions_to_reset(admin: GroupAdmin, args: argparse.Namespace, group_id: str,
                        committed: dict[TopicPartition, int]) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(committed)
    return named_partitions(admin, args.topic)


def named_partitions(admin: GroupAdmin, topics: Sequence[str]) -> list[TopicPartition]:
    """The partitions ``--topic T`` / ``--topic T:P,P`` name, checked against the topics' partitions."""
    chosen: list[TopicPartition] = []
    for text in topics:
        topic, partitions = parse_topic_partitions(text)
        existing = admin.partitions_of(topic)
        for p in partitions if partitions is not None else existing:
            if p not in existing:
                raise GroupAdminError(f"topic {topic!r} has partitions 0-{len(existing) - 1}, not {p}",
                                      ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            chosen.append((topic, p))
    return sorted(set(chosen))


def plan_reset(admin: GroupAdmin, args: argparse.Namespace, partitions: list[TopicPartition],
               committed: dict[TopicPartition, int], err: TextIO) -> dict[TopicPartition, int]:
    """The new offset of each partition, from the scenario the arguments name (module docstring)."""
    if not partitions:
        return {}
    if args.to_earliest:
        return admin.log_offsets(partitions, EARLIEST)
    if args.to_latest:
        return admin.log_offsets(partitions, LATEST)
    if args.to_offset is not None:
        return _within_log(admin, dict.fromkeys(partitions, args.to_offset), err)
    if args.shift_by is not None:
        missing = [f"{t}-{p}" for t, p in partitions if (t, p) not in committed]
        if missing:
            raise GroupAdminError(f"cannot shift offsets of {', '.join(missing)}: the group has no committed "
                                  "offset there (use --to-earliest, --to-latest or --to-offset)",
                                  ErrorCode.INVALID_REQUEST)
        return _within_log(admin, {tp: committed[tp] + args.shift_by for tp in partitions}, err)
    if args.to_datetime is not None or args.by_duration is not None:
        when_ms = (parse_datetime_ms(args.to_datetime) if args.to_datetime is not None
                   else int(time.time() * 1000) - parse_duration_ms(args.by_duration))
        found = admin.log_offsets(partitions, when_ms)
        empty = [tp for tp, offset in found.items() if offset < 0]
        since = args.to_datetime or f"{when_ms} ms"
        for t, p in empty:
            print(f"Warn: Partition {p} from topic {t} has no record at or after {since}. "
                  "Falling back to latest known offset.", file=err)
        if empty:
            found.update(admin.log_offsets(empty, LATEST))
        return found
    latest = [tp for tp in partitions if tp not in committed]  # --to-current
    new = {tp: committed[tp] for tp in partitions if tp in committed}
    if latest:
        new.update(admin.log_offsets(latest, LATEST))
    return new


def _within_log(admin: GroupAdmin, wanted: dict[TopicPartition, int],
                err: TextIO) -> dict[TopicPartition, int]:
    """Each offset moved into [log start, latest], with Kafka's warning when moved."""
    starts = admin.log_offsets(wanted, EARLIEST)
    ends = admin.log_offsets(wanted, LATEST)
    out = {}
    for (t, p), offset in sorted(wanted.items()):
        bounded = min(max(offset, starts[(t, p)]), ends[(t, p)])
        if bounded != offset:
            side = "higher than latest" if offset > bounded else "lower than earliest"
            print(f"Warn: New offset ({offset}) is {side} offset for topic partition {t}-{p}. "
                  f"Value will be set to {bounded}", file=err)
        out[(t, p)] = bounded
    return out


def reset(admin: GroupAdmin, args: argparse.Namespace, groups: list[str], out: TextIO, err: TextIO) -> int:
    if not args.execute and not args.dry_run:
        print("WARN: No action will be performed as the --execute option is missing. Add --dry-run to say "
              "so, or --execute to commit the new offsets.", file=err)
    status = EXIT_OK
    rows: list[list[object]] = []
    for group_id in groups:
        state = admin.describe_group(group_id).state
        if state not in _INACTIVE:
            print(f"Error: Assignments can only be reset if the group '{group_id}' is inactive, but the "
                  f"current state is {state}. Stop its consumers first (`appliance consumer-groups "
                  f"--describe --group {group_id} --members` lists them).", file=err)
            status = EXIT_FAILED
            continue
        committed = admin.committed_offsets(group_id)
        plan = plan_reset(admin, args, partitions_to_reset(admin, args, group_id, committed), committed, err)
        if args.execute and plan:
            admin.alter_offsets(group_id, plan)
        rows += [[group_id, t, p, offset] for (t, p), offset in sorted(plan.items())]
    if rows:
        print("\n" + table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows, [30, 30, 10, 0]), file=out)
    return status


# -- delete --------------------------------------------------------------------------------------------


def delete_groups(admin: GroupAdmin, groups: list[str], out: TextIO, err: TextIO) -> int:
    results = admin.delete_groups(groups)
    failed = {g: code for g, code in results.items() if code != ErrorCode.NONE}
    deleted = [g for g, code in results.items() if code == ErrorCode.NONE]
    if not failed:
        print(f"Deletion of requested consumer groups ({_quoted(deleted)}) was successful.", file=out)
        return EXIT_OK
    print("Error: Deletion of some consumer groups failed:", file=err)
    for g, code in failed.items():
        print(f"* Group '{g}' could not be deleted due to: {group_error(g, code, None)}", file=err)
    if deleted:
        print(f"These consumer groups were deleted successfully: {_quoted(deleted)}", file=out)
    return EXIT_FAILED


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


_DELETE_OFFSETS_ERRORS: dict[int, str] = {
    ErrorCode.INVALID_GROUP_ID: "'{g}' is not valid.",
    ErrorCode.GROUP_ID_NOT_FOUND: "'{g}' does not exist (`appliance consumer-groups --list` lists "
                                  "the groups).",
    ErrorCode.NON_EMPTY_GROUP: "Deleting offsets of a consumer group '{g}' is forbidden if the group is not "
                               "empty.",
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: "Encounter some partition level error, see the follow-up details:",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "Encounter some partition level error, see the follow-up details:",
}


def delete_offsets(admin: GroupAdmin, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    (group_id,) = args.group
    top, per_partition = admin.delete_offsets(group_id, named_partitions(admin, args.topic))
    if top == ErrorCode.NONE:
        print(f"Request succeed for deleting offsets with topic {', '.join(args.topic)} group {group_id}",
              file=out)
    else:
        text = _DELETE_OFFSETS_ERRORS.get(top, f"Encounter some unknown error: {error_name(top)}")
        print(f"Error: {text.format(g=group_id)}", file=err)
    rows = [[t, p, "Successful" if code == ErrorCode.NONE else f"Error: {group_error(group_id, code, None)}"]
            for (t, p), code in sorted(per_partition.items())]
    if rows:
        print("\n" + table(["TOPIC", "PARTITION", "STATUS"], rows, [30, 15, 0]), file=out)
    failed = top != ErrorCode.NONE or any(code != ErrorCode.NONE for code in per_partition.values())
    return EXIT_FAILED if failed else EXIT_OK


# -- main ------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run checked arguments; return the exit status."""
    try:
        admin = GroupAdmin(args.bootstrap_server, request_timeout_ms=args.timeout,
                           client_id=getattr(args, "client_id", None) or "appliance-consumer-groups")
    except (BrokerConnectionError, ApplianceError) as exc:
        print(f"appliance consumer-groups: {exc} (is the appliance running there? --bootstrap-server "
              "HOST:PORT names another broker)", file=err)
        return EXIT_FAILED
    try:
        if args.list:
            return _list(admin, args.state, out)
        groups = [g.group_id for g in _consumer_groups(admin)] if args.all_groups else args.group
        if args.describe:
            return describe(admin, args, groups, out, err)
        if args.delete:
            return delete_groups(admin, groups, out, err)
        if args.delete_offsets:
            return delete_offsets(admin, args, out, err)
        return reset(admin, args, groups, out, err)
    except (ApplianceError, OSError) as exc:
        print(f"Error: {exc}", file=err)
        return EXIT_FAILED
    finally:
        admin.close()


def _consumer_groups(admin: GroupAdmin) -> list[GroupListing]:
    return [g for g in admin.list_groups() if g.protocol_type in ("consumer", "")]


def _list(admin: GroupAdmin, with_state: bool, out: TextIO) -> int:
    groups = _consumer_groups(admin)
    if not with_state:
        for g in groups:
            print(g.group_id, file=out)
        return EXIT_OK
    rows = [[g.group_id, admin.describe_group(g.group_id).state] for g in groups]
    print(table(["GROUP", "STATE"], rows, [25, 0]), file=out)
    return EXIT_OK


def main(argv: list[str]) -> int:
    """``appliance consumer-groups ...``"""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    try:
        check_arguments(args)
    except ValueError as exc:
        print(f"appliance consumer-groups: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(args, sys.stdout, sys.stderr)
