"""``appliance topics create|list|describe|delete`` through the real console script, against a running
``appliance serve`` (supervisor, writers, broker on a free port): over the Kafka protocol
(``--bootstrap-server``) and over the control socket (``--data-dir``, ``--control-socket``, ``--config``).

What a user sees: the messages, the exit status, the describe lines -- checked against the segment files on
disk and against each other (both paths describe the same partitions the same way).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.kafka_appliance import Appliance, served_appliance

from appliance.cli import topics as topics_cli
from appliance.client.admin import KafkaAdmin
from appliance.client.producer import Producer
from ipc.kafka.messages import DescribableLogDirTopic, DescribeLogDirsRequest, DescribeLogDirsResponse
from ipc.kafka_client import KafkaConnection
from storage.errors import ConfigError, TopicExistsError, UnknownTopicOrPartitionError

APPLIANCE = Path(sys.executable).with_name("appliance")  # the console script of this venv
PARTITION_FIELDS = 10  # Topic .. BytesOnDisk: what every partition line has, on both paths


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(
        tmp_path_factory.mktemp("topics"), {"seeded": 2}, extra='"log.retention.check.interval.ms" = 100'
    )


def topics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(APPLIANCE), "topics", *args], capture_output=True, text=True, timeout=60)


def over_tcp(appliance: Appliance, *args: str) -> subprocess.CompletedProcess[str]:
    return topics(*args, "--bootstrap-server", appliance.bootstrap)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], status: int, *phrases: str) -> str:
    assert result.returncode == status, (result.stdout, result.stderr)
    assert result.stdout == ""
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr
    return result.stderr


def parse_describe(text: str) -> dict[str, tuple[dict[str, str], list[dict[str, str]]]]:
    """topic -> (its line's fields, one dict per partition line), from describe output."""
    out: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {}
    for line in text.splitlines():
        if line.startswith("\t\t"):
            continue  # a follower line (replicated partitions only)
        pairs = [f.split(": ", 1) if ": " in f else (f.rstrip(":"), "") for f in line.strip("\t").split("\t")]
        fields = dict(pairs)
        if line.startswith("\t"):
            out[fields["Topic"]][1].append(fields)
        else:
            out[fields["Topic"]] = (fields, [])
    return out


def segment_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.log"))


# -- the happy path ----------------------------------------------------------------------------------------


def test_create_list_describe_delete_over_the_kafka_protocol(appliance: Appliance) -> None:
    assert ok(over_tcp(appliance, "create", "orders", "--partitions", "3")) == (
        "Created topic orders with 3 partitions.\n"
    )
    failed(over_tcp(appliance, "create", "orders"), 1, "'orders' already exists", "TOPIC_ALREADY_EXISTS")
    assert ok(over_tcp(appliance, "create", "orders", "--if-not-exists")) == "Topic orders already exists.\n"
    # no count: the broker's num.partitions
    assert ok(over_tcp(appliance, "create", "plain")) == "Created topic plain with 1 partitions.\n"
    assert ok(over_tcp(appliance, "list")).split() == sorted(["orders", "plain", "seeded"])

    described = parse_describe(ok(over_tcp(appliance, "describe", "orders", "plain")))
    assert list(described) == ["orders", "plain"]
    head, parts = described["orders"]
    assert head == {"Topic": "orders", "PartitionCount": "3", "ReplicationFactor": "1"}
    assert [p["Partition"] for p in parts] == ["0", "1", "2"]
    for p in parts:
        assert (p["Leader"], p["Replicas"], p["Isr"]) == ("0", "0", "0")
        assert (p["LogStartOffset"], p["LogEndOffset"], p["HighWatermark"], p["BytesOnDisk"]) == ("0",) * 4
        assert "WriterPid" not in p, "the writer is only known on the appliance's host"

    assert ok(over_tcp(appliance, "delete", "plain")) == "Deleted topic plain.\n"
    assert ok(over_tcp(appliance, "list")).split() == ["orders", "seeded"]
    assert not (appliance.data_dir / "plain-0").exists()
    failed(over_tcp(appliance, "delete", "plain"), 1, "topic 'plain'", "UNKNOWN_TOPIC_OR_PARTITION")


def test_describe_shows_offsets_and_bytes_on_disk_as_the_local_path_and_the_files_do(
    appliance: Appliance,
) -> None:
    settings = ["--topic-config", "segment.bytes=2048", "--topic-config", "retention.bytes=3000"]
    ok(over_tcp(appliance, "create", "sized", "--partitions", "2", *settings))
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        for i in range(150):  # 78 bytes a batch: 26 batches a segment, retention deletes the oldest ones
            producer.send("sized", b"record %03d" % i, partition=0).get(10)
        producer.send_many("sized", [b"x" * 20] * 7, partition=1).get(10)

    deadline = time.monotonic() + 10
    while True:  # retention runs every 100 ms in the writer
        tcp = parse_describe(ok(over_tcp(appliance, "describe", "sized")))["sized"][1]
        if int(tcp[0]["LogStartOffset"]) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    local = parse_describe(ok(topics("describe", "sized", "--data-dir", str(appliance.data_dir))))
    head, local_parts = local["sized"]
    assert head["TopicId"] and head["Configs"] == "retention.bytes=3000,segment.bytes=2048"
    p0, p1 = tcp
    assert int(p0["LogStartOffset"]) > 0, "retention moved the log start; ListOffsets earliest shows it"
    assert (p0["LogEndOffset"], p0["HighWatermark"]) == ("150", "150")
    assert (p1["LogStartOffset"], p1["LogEndOffset"], p1["HighWatermark"]) == ("0", "7", "7")
    for index, p in enumerate(tcp):
        on_disk = segment_bytes(appliance.data_dir / f"sized-{index}")
        assert int(p["BytesOnDisk"]) == on_disk > 0
        assert list(p.items())[:PARTITION_FIELDS] == list(local_parts[index].items())[:PARTITION_FIELDS]
        assert int(local_parts[index]["WriterPid"]) > 0 and "WriterRestarts" in local_parts[index]
    assert segment_bytes(appliance.data_dir / "sized-0") < 3000 + 2048, "old segments were deleted"


def test_describe_log_dirs_lists_each_partition_by_log_dir(appliance: Appliance) -> None:
    ok(over_tcp(appliance, "create", "dirs", "--partitions", "2", "--if-not-exists"))
    with Producer({"appliance.data.dir": str(appliance.data_dir)}) as producer:
        producer.send("dirs", b"on disk", partition=1).get(10)
    host, port = appliance.bootstrap.split(":")
    with KafkaConnection(host, int(port)) as conn:
        everything: DescribeLogDirsResponse = conn.request(DescribeLogDirsRequest(topics=None))
        some: DescribeLogDirsResponse = conn.request(DescribeLogDirsRequest(topics=[
            DescribableLogDirTopic("dirs", [1, 9]), DescribableLogDirTopic("no-such-topic", [0]),
        ]))  # fmt: skip
    (result,) = everything.results
    assert (result.error_code, result.log_dir) == (0, os.path.abspath(appliance.data_dir))
    sizes = {(t.name, p.partition_index): p.partition_size for t in result.topics for p in t.partitions}
    assert {("dirs", 0), ("dirs", 1), ("seeded", 0), ("seeded", 1)} <= set(sizes)
    assert sizes[("dirs", 1)] == segment_bytes(appliance.data_dir / "dirs-1") > 0
    assert sizes[("dirs", 0)] == 0
    (result,) = some.results
    assert [(t.name, [(p.partition_index, p.offset_lag, p.is_future_key) for p in t.partitions])
            for t in result.topics] == [("dirs", [(1, 0, False)])]  # fmt: skip


def test_kafka_python_admin_creates_with_settings_and_describes_log_dirs(appliance: Appliance) -> None:
    """A client nobody here wrote: its CreateTopics carries settings as strings, its DescribeLogDirs is
    Kafka's AdminClient.describeLogDirs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python reads its schemas the old way
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=appliance.bootstrap, client_id="kafka-python-admin")
        try:
            admin.create_topics([NewTopic("by-kp", 2, 1, topic_configs={"retention.ms": "60000",
                                                                       "cleanup.policy": "delete"})])
            (answer,) = admin.describe_log_dirs({"by-kp": [1]})
        finally:
            admin.close()
    (log_dir,) = answer["log_dirs"]
    assert log_dir["log_dir"] == os.path.abspath(appliance.data_dir)
    assert log_dir["topics"] == [{"name": "by-kp", "partitions": [
        {"partition_index": 1, "partition_size": 0, "offset_lag": 0, "is_future_key": False}]}]  # fmt: skip
    local = parse_describe(ok(topics("describe", "by-kp", "--data-dir", str(appliance.data_dir))))
    assert local["by-kp"][0]["Configs"] == "cleanup.policy=delete,retention.ms=60000"


def test_the_local_path_by_data_dir_control_socket_or_config(appliance: Appliance) -> None:
    data = str(appliance.data_dir)
    config = str(appliance.data_dir.parent / "appliance.toml")
    created = ok(topics("create", "local-made", "--data-dir", data))
    assert created == "Created topic local-made with 1 partitions.\n"
    assert "local-made" in ok(topics("list", "--control-socket", f"{data}/.appliance.sock")).split()
    described = parse_describe(ok(topics("describe", "local-made", "--appliance-config", config)))
    assert described["local-made"][1][0]["WriterPid"] == "idle", "no writer runs until a producer comes"
    assert "local-made" in ok(over_tcp(appliance, "list")).split(), "both paths see one appliance"
    assert ok(topics("delete", "local-made", "--data-dir", data)) == "Deleted topic local-made.\n"


# -- bad input ---------------------------------------------------------------------------------------------


def test_bad_names_counts_and_settings_get_clear_errors_and_change_nothing(appliance: Appliance) -> None:
    """Each kind of mistake once through the console script, the variations in-process (the same ``main``)."""
    before = ok(over_tcp(appliance, "list"))
    b = ["--bootstrap-server", appliance.bootstrap]
    script: list[tuple[list[str], int, tuple[str, ...]]] = [
        (["create", "bad/name", *b], 1, ("'bad/name'", "INVALID_TOPIC_EXCEPTION")),
        (["create", "zero", "--partitions", "0", *b], 2, ("--partitions 0: must be at least 1",)),
        (["create", "cfg", "--topic-config", "retention.ms=soon", *b], 1, ("retention.ms", "INVALID_CONFIG")),
        (["describe", "missing", *b], 1, ("topic 'missing': no such topic", "UNKNOWN_TOPIC_OR_PARTITION")),
        (["delete", "missing", *b], 1, ("topic 'missing': no such topic",)),
        (["list", "--bootstrap-server", "127.0.0.1:1"], 1, ("127.0.0.1:1: cannot connect", "running there")),
    ]
    in_process: list[tuple[list[str], int, tuple[str, ...]]] = [
        (["create", "..", *b], 1, ("'..'", "INVALID_TOPIC_EXCEPTION")),
        (["create", "x" * 250, *b], 1, ("INVALID_TOPIC_EXCEPTION",)),
        (["create", "neg", "--partitions", "-4", *b], 2, ("--partitions -4: must be at least 1",)),
        (["create", "nrf", "--replication-factor", "0", *b], 2, ("--replication-factor 0",)),
        (["create", "many", "--partitions", "lots", *b], 2, ("invalid int value: 'lots'",)),
        (["create", "cfg", "--topic-config", "no.such=1", *b], 1, ("unknown topic setting 'no.such'",)),
        (["create", "cfg", "--topic-config", "novalue", *b], 2, ("expected KEY=VALUE",)),
        (["describe", "seeded", "a b", *b], 1, ("'a b'", "INVALID_TOPIC_EXCEPTION")),
        (["delete", "../etc", *b], 1, ("'../etc'", "INVALID_TOPIC_EXCEPTION")),
        (["list", "--bootstrap-server", "no-port"], 2, ("bootstrap server 'no-port': expected HOST:PORT",)),
        (["list", *b, "--data-dir", "/tmp"], 2, ("--bootstrap-server", "--data-dir", "give one")),
        (["list", "--data-dir", "/tmp", "--control-socket", "/tmp/s"], 2, ("give one",)),
        (["list", "--data-dir", "/nonexistent"], 1, ("/nonexistent/.appliance.sock",)),
        (["frobnicate"], 2, ("invalid choice",)),
    ]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda case: topics(*case[0]), script))
    results += [in_this_process(args) for args, _, _ in in_process]
    for (args, status, phrases), result in zip(script + in_process, results, strict=True):
        assert result.returncode == status, (args, result.stderr)
        for phrase in phrases:
            assert phrase in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert ok(over_tcp(appliance, "list")) == before, "nothing was created or deleted"


def in_this_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``appliance topics ARGS`` run by ``topics_cli.main`` in this process (what the script calls)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = topics_cli.main(args)
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def test_the_broker_itself_refuses_bad_counts_and_names(appliance: Appliance) -> None:
    """What the CLI checks first, the broker checks again for any client (here through KafkaAdmin)."""
    with KafkaAdmin(appliance.bootstrap) as admin:
        with pytest.raises(ConfigError, match=r"partitions 0: must be at least 1 \(INVALID_PARTITIONS\)"):
            admin.create_topic("zero", 0)
        with pytest.raises(ConfigError, match="INVALID_REPLICATION_FACTOR"):
            admin.create_topic("zero", 1, replication_factor=-7)
        with pytest.raises(ConfigError, match="INVALID_TOPIC_EXCEPTION"):
            admin.create_topic("", 1)
        with pytest.raises(TopicExistsError, match="'seeded' already exists"):
            admin.create_topic("seeded", 1)
        with pytest.raises(UnknownTopicOrPartitionError, match="'gone'"):
            admin.describe_topics(["seeded", "gone"])
        assert "zero" not in admin.list_topics()


def test_help_names_the_default_bootstrap_server() -> None:
    assert "default 127.0.0.1:9092" in ok(topics("list", "--help"))
