"""``appliance consumer-groups`` through the real console script, against ``appliance serve`` with real
confluent-kafka consumers in the groups it lists, describes and resets.

What a user sees: Kafka's columns and messages, the exit status, and the offsets a real consumer of the
group resumes from after a reset.  One appliance for the module.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.consumer_fixtures import poll_until
from support.kafka_appliance import Appliance, served_appliance

from appliance.cli import consumer_groups
from appliance.client.admin import KafkaAdmin
from appliance.client.group_admin import decode_assignment

confluent_kafka = pytest.importorskip("confluent_kafka")

APPLIANCE = Path(sys.executable).with_name("appliance")  # the console script of this venv
PARTITIONS = 3
PER_PARTITION = 10
OFFSET_COLUMNS = [
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
]


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(
        tmp_path_factory.mktemp("consumer-groups"),
        {"orders": PARTITIONS, "other": 1},
        extra='"group.initial.rebalance.delay.ms" = 100',
    )


@pytest.fixture(scope="module")
def timestamps(appliance: Appliance) -> list[int]:
    """Produce PER_PARTITION records to each partition of ``orders``, record i of each at time 1000 * i
    past a base; returns the timestamps."""
    base = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce("orders", key=f"k{i}", value=f"{p}-{i}", partition=p, timestamp=base + 1000 * i)
    assert producer.flush(30) == 0
    return [base + 1000 * i for i in range(PER_PARTITION)]


def groups(appliance: Appliance, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(APPLIANCE), "consumer-groups", "--bootstrap-server", appliance.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def rows(stdout: str, header: list[str]) -> list[dict[str, str]]:
    """The table under ``header`` as dicts (only the last column may hold spaces)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.split() == header)
    return [
        dict(zip(header, line.split(maxsplit=len(header) - 1), strict=True)) for line in lines[start + 1 :]
    ]


def consumer(appliance: Appliance, group: str, client_id: str) -> Any:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": appliance.bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "partition.assignment.strategy": "range",
        }
    )


def committed(appliance: Appliance, group: str) -> dict[int, int]:
    """What OffsetFetch answers a real client for ``orders``."""
    c = consumer(appliance, group, "probe")
    try:
        parts = c.committed(
            [confluent_kafka.TopicPartition("orders", p) for p in range(PARTITIONS)], timeout=10
        )
        return {tp.partition: tp.offset for tp in parts}
    finally:
        c.close()


def test_describe_shows_members_assignments_offsets_and_lag(
    appliance: Appliance, timestamps: list[int]
) -> None:
    a, b = consumer(appliance, "g-live", "client-a"), consumer(appliance, "g-live", "client-b")
    try:
        a.subscribe(["orders"])
        b.subscribe(["orders"])
        poll_until(
            [a, b],
            lambda: (
                len(a.assignment()) + len(b.assignment()) == PARTITIONS
                and bool(a.assignment())
                and bool(b.assignment())
            ),
        )
        a.commit(
            offsets=[confluent_kafka.TopicPartition("orders", tp.partition, 4) for tp in a.assignment()],
            asynchronous=False,
        )
        owner = {tp.partition: "client-a" for tp in a.assignment()}
        owner |= {tp.partition: "client-b" for tp in b.assignment()}

        result = groups(appliance, "--describe", "--group", "g-live")
        assert result.returncode == 0, result.stderr
        table = rows(result.stdout, OFFSET_COLUMNS)
        assert sorted(int(r["PARTITION"]) for r in table) == list(range(PARTITIONS))
        for r in table:
            p = int(r["PARTITION"])
            assert (r["GROUP"], r["TOPIC"], r["CLIENT-ID"]) == ("g-live", "orders", owner[p])
            assert r["LOG-END-OFFSET"] == str(PER_PARTITION)
            assert r["HOST"] == "/127.0.0.1"  # as Kafka shows it
            if owner[p] == "client-a":
                assert (r["CURRENT-OFFSET"], r["LAG"]) == ("4", str(PER_PARTITION - 4))
            else:
                assert (r["CURRENT-OFFSET"], r["LAG"]) == ("-", "-")

        members = groups(appliance, "--describe", "--group", "g-live", "--members", "--verbose")
        assert members.returncode == 0, members.stderr
        by_client = {
            r["CLIENT-ID"]: r
            for r in rows(
                members.stdout.replace(", ", ","),
                ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"],
            )
        }
        for name, c in (("client-a", a), ("client-b", b)):
            mine = sorted(tp.partition for tp in c.assignment())
            assert by_client[name]["#PARTITIONS"] == str(len(mine))
            assert by_client[name]["ASSIGNMENT"] == f"orders({','.join(map(str, mine))})"

        state = groups(appliance, "--describe", "--group", "g-live", "--state")
        assert state.returncode == 0, state.stderr
        line = state.stdout.strip().splitlines()[-1].split()
        assert line[0] == "g-live" and line[-3:] == ["range", "Stable", "2"]

        listed = groups(appliance, "--list")
        assert listed.returncode == 0 and "g-live" in listed.stdout.split()

        refused = groups(
            appliance,
            "--reset-offsets",
            "--group",
            "g-live",
            "--topic",
            "orders",
            "--to-earliest",
            "--execute",
        )
        assert refused.returncode == 1
        assert (
            "Assignments can only be reset if the group 'g-live' is inactive, but the current state is Stable"
        ) in refused.stderr
        assert "Stop its consumers first" in refused.stderr
    finally:
        a.close()
        b.close()
    assert committed(appliance, "g-live") == {
        p: 4 if owner[p] == "client-a" else -1001 for p in range(PARTITIONS)
    }  # the refused reset changed nothing


def test_reset_offsets_of_an_empty_group_and_a_consumer_resumes_there(
    appliance: Appliance, timestamps: list[int]
) -> None:
    first = consumer(appliance, "g-reset", "client-r")
    try:
        first.subscribe(["orders"])
        poll_until([first], lambda: len(first.assignment()) == PARTITIONS)
        first.commit(
            offsets=[confluent_kafka.TopicPartition("orders", p, 5) for p in range(PARTITIONS)],
            asynchronous=False,
        )
    finally:
        first.close()

    def reset(*args: str) -> dict[int, int]:
        result = groups(appliance, "--reset-offsets", "--group", "g-reset", *args)
        assert result.returncode == 0, result.stderr
        return {
            int(r["PARTITION"]): int(r["NEW-OFFSET"])
            for r in rows(result.stdout, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"])
        }

    every = dict.fromkeys(range(PARTITIONS), 0)
    assert reset("--topic", "orders", "--to-earliest", "--dry-run") == every
    assert committed(appliance, "g-reset") == dict.fromkeys(range(PARTITIONS), 5)  # a dry run changes nothing
    assert reset("--topic", "orders:1", "--shift-by", "-2", "--execute") == {1: 3}
    assert reset("--all-topics", "--to-offset", "99", "--execute") == dict.fromkeys(range(PARTITIONS), 10)
    at = datetime.fromtimestamp(timestamps[7] / 1000, UTC).isoformat()
    assert reset("--topic", "orders:0,2", "--to-datetime", at, "--execute") == {0: 7, 2: 7}
    assert reset("--topic", "orders", "--to-current") == {0: 7, 1: 10, 2: 7}
    assert reset("--topic", "orders:1", "--by-duration", "P3650D") == {1: 0}  # a dry run: nothing changes
    assert reset("--topic", "orders:1", "--by-duration", "PT0S") == {1: 10}  # no record since now: latest
    assert committed(appliance, "g-reset") == {0: 7, 1: 10, 2: 7}

    empty = groups(appliance, "--describe", "--group", "g-reset")
    assert empty.returncode == 0 and "Consumer group 'g-reset' has no active members." in empty.stderr
    table = rows(empty.stdout, OFFSET_COLUMNS)
    assert {(r["PARTITION"], r["CURRENT-OFFSET"], r["LAG"], r["CONSUMER-ID"]) for r in table} == {
        ("0", "7", "3", "-"),
        ("1", "10", "0", "-"),
        ("2", "7", "3", "-"),
    }

    resumed = consumer(appliance, "g-reset", "client-s")  # a real consumer starts where the reset put it
    try:
        resumed.subscribe(["orders"])
        seen: list[Any] = []
        deadline = time.monotonic() + 30
        while len(seen) < 6 and time.monotonic() < deadline:
            message = resumed.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message)
        assert sorted((m.partition(), m.offset()) for m in seen) == [
            (0, 7),
            (0, 8),
            (0, 9),
            (2, 7),
            (2, 8),
            (2, 9),
        ]
    finally:
        resumed.close()


def test_errors_name_the_group_and_say_what_to_do(
    appliance: Appliance, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = groups(appliance, "--describe", "--group", "no-such-group")
    assert missing.returncode == 1
    assert "Consumer group 'no-such-group' does not exist" in missing.stderr and "--list" in missing.stderr
    shift = groups(
        appliance,
        "--reset-offsets",
        "--group",
        "never-committed",
        "--topic",
        "other",
        "--shift-by",
        "1",
        "--execute",
    )
    assert shift.returncode == 1 and "other-0" in shift.stderr and "no committed offset" in shift.stderr
    unknown = groups(appliance, "--reset-offsets", "--group", "g-x", "--topic", "nope", "--to-latest")
    assert unknown.returncode == 1 and "'nope'" in unknown.stderr
    for bad in (
        ["--describe"],
        ["--list", "--describe"],
        ["--reset-offsets", "--group", "g", "--to-latest"],
        ["--reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "yesterday"],
        ["--reset-offsets", "--group", "g", "--all-topics", "--by-duration", "1h"],
        ["--list", "--command-config", "/nonexistent/admin.properties"],
        ["--reset-offsets", "--group", "g", "--topic", "t:x", "--to-latest"],
        ["--delete-offsets", "--group", "g"],
    ):  # refused before any connection: in this process
        assert consumer_groups.main(["--bootstrap-server", appliance.bootstrap, *bad]) == 2, bad
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("appliance consumer-groups: "), (bad, err)
    nobody = subprocess.run(
        [str(APPLIANCE), "consumer-groups", "--bootstrap-server", "127.0.0.1:1", "--list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode == 1 and "is the appliance running there?" in nobody.stderr


def test_describe_shows_the_offsets_of_a_deleted_topic_without_an_end(appliance: Appliance) -> None:
    with KafkaAdmin(appliance.bootstrap) as admin:
        admin.create_topic("doomed", 1)
        c = consumer(appliance, "g-doomed", "client-x")
        try:  # a commit as an assign() consumer: generation -1 to a group without members
            c.commit(offsets=[confluent_kafka.TopicPartition("doomed", 0, 0)], asynchronous=False)
        finally:
            c.close()
        admin.delete_topic("doomed")
    result = groups(appliance, "--describe", "--group", "g-doomed")
    assert result.returncode == 0, result.stderr
    (row,) = rows(result.stdout, OFFSET_COLUMNS)
    assert (row["TOPIC"], row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"]) == (
        "doomed",
        "0",
        "-",
        "-",
    )


def test_decode_assignment_reads_every_version_and_tolerates_garbage() -> None:
    body = b"\x00\x00\x00\x01" + b"\x00\x06orders" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x00\x00\x00\x00\x02"
    for version in (0, 1, 3, 7):
        data = version.to_bytes(2, "big") + body + b"\xff\xff\xff\xff"  # user_data null
        assert decode_assignment(data) == (("orders", 0), ("orders", 2))
    for garbage in (b"", b"\x00", b"\xff\xff", b"\x00\x00\x7f\xff\xff\xff", b"\x00\x00" + body[:5]):
        assert decode_assignment(garbage) == ()


def test_delete_offsets_and_delete_group_refused_while_consumed_then_done(
    appliance: Appliance, timestamps: list[int]
) -> None:
    member = consumer(appliance, "g-del", "client-d")
    try:
        member.subscribe(["orders"])
        poll_until([member], lambda: len(member.assignment()) == PARTITIONS)
        member.commit(
            offsets=[confluent_kafka.TopicPartition("orders", p, 3) for p in range(PARTITIONS)]
            + [confluent_kafka.TopicPartition("other", 0, 0)],
            asynchronous=False,
        )
        busy = groups(appliance, "--delete", "--group", "g-del")
        assert busy.returncode == 1
        assert "Group 'g-del' could not be deleted due to" in busy.stderr and "NON_EMPTY_GROUP" in busy.stderr
        subscribed = groups(appliance, "--delete-offsets", "--group", "g-del", "--topic", "orders:1")
        assert subscribed.returncode == 1 and "GROUP_SUBSCRIBED_TO_TOPIC" in subscribed.stdout
        table = rows(subscribed.stdout, ["TOPIC", "PARTITION", "STATUS"])
        assert [(r["TOPIC"], r["PARTITION"]) for r in table] == [("orders", "1")]
        done = groups(appliance, "--delete-offsets", "--group", "g-del", "--topic", "other")
        assert done.returncode == 0, done.stderr
        assert "Request succeed for deleting offsets with topic other group g-del" in done.stdout
        assert rows(done.stdout, ["TOPIC", "PARTITION", "STATUS"]) == [
            {"TOPIC": "other", "PARTITION": "0", "STATUS": "Successful"}
        ]
        assert committed(appliance, "g-del") == dict.fromkeys(range(PARTITIONS), 3)  # orders kept
    finally:
        member.close()
    deleted = groups(appliance, "--delete", "--group", "g-del")
    assert deleted.returncode == 0, deleted.stderr
    assert "Deletion of requested consumer groups ('g-del') was successful." in deleted.stdout
    assert "g-del" not in groups(appliance, "--list").stdout.split()
    assert committed(appliance, "g-del") == dict.fromkeys(range(PARTITIONS), -1001)
    gone = groups(appliance, "--delete", "--group", "g-del")
    assert gone.returncode == 1 and "GROUP_ID_NOT_FOUND" in gone.stderr
