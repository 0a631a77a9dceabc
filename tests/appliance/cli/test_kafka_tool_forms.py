"""The tools as Kafka users type them: the command lines of Kafka's quickstart and operations pages against
``appliance serve`` through the real console script, the output held against what kafka-console-consumer
prints for the same records (its DefaultMessageFormatter's rules), and the flag combinations Kafka's tools
refuse, refused with the flags named."""

from __future__ import annotations

import io
import subprocess
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import confluent_kafka
import pytest
from support.consumer_fixtures import REPO
from support.kafka_appliance import Appliance, served_appliance

from appliance.cli import configs, consume, produce, topics
from appliance.cli.message_formatter import MessageFormatter
from appliance.client.consumer import ConsumerRecord

SCRIPT = str(REPO / ".venv" / "bin" / "appliance")


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("appliance"), {"plain": 1},
                                '"group.initial.rebalance.delay.ms" = 100\n')


def tool(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([SCRIPT, *args], input=stdin, capture_output=True, timeout=timeout, cwd=REPO)


def ok(*args: str, stdin: bytes = b"") -> str:
    """Run a command: ``topics`` and ``configs`` in this process (they are cheap to start, and import
    nothing heavy), the others as the console script."""
    if args[0] in ("topics", "configs") and not stdin:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = {"topics": topics.main, "configs": configs.main}[args[0]](list(args[1:]))
        assert status == 0, (args, err.getvalue())
        return out.getvalue()
    done = tool(*args, stdin=stdin)
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout.decode()


def test_quickstart_and_operations_command_lines(appliance: Appliance) -> None:
    b = ["--bootstrap-server", appliance.bootstrap]
    created = ok("topics", "--create", "--topic", "quickstart-events", "--partitions", "1",
                 "--replication-factor", "1", "--config", "retention.ms=86400000", *b)
    assert "Created topic quickstart-events" in created
    assert "PartitionCount: 1" in ok("topics", "--describe", "--topic", "quickstart-events", *b)
    ok("produce", "--topic", "quickstart-events", *b, "--property", "parse.key=true",
       "--property", "key.separator=:", stdin=b"k1:first event\nk2:second event\n")
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap})
    producer.produce("quickstart-events", value=b"no key", headers=[("h1", b"v1"), ("h2", b"v2")])
    assert producer.flush(30) == 0
    printed = ok("consume", "--topic", "quickstart-events", "--from-beginning",
                 "--property", "print.key=true", "--property", "print.timestamp=true",
                 "--max-messages", "3", *b)
    stamps = _create_times(appliance, "quickstart-events", 3)
    assert printed == (f"CreateTime:{stamps[0]}\tk1\tfirst event\nCreateTime:{stamps[1]}\tk2\tsecond event\n"
                       f"CreateTime:{stamps[2]}\tnull\tno key\n")  # kafka-console-consumer's lines
    everything = ok("consume", "--topic", "quickstart-events", "--partition", "0", "--offset", "2",
                    "--property", "print.partition=true", "--property", "print.offset=true", "--property",
                    "print.headers=true", "--property", "print.key=true", "--max-messages", "1", *b)
    assert everything == "Partition:0\tOffset:2\th1:v1,h2:v2\tnull\tno key\n"

    ok("topics", "--alter", "--topic", "quickstart-events", "--partitions", "2", *b)
    assert "PartitionCount: 2" in ok("topics", "--describe", "--topic", "quickstart-events", *b)
    overrides = ok("topics", "--describe", "--topics-with-overrides", "--exclude-internal", *b).splitlines()
    assert len(overrides) == 1 and "Topic: quickstart-events" in overrides[0]
    assert "PartitionCount: 2" in overrides[0] and "retention.ms=86400000" in overrides[0]
    assert ok("topics", "--describe", "--under-replicated-partitions", *b) == ""  # one replica, in sync
    assert ok("topics", "--describe", "--unavailable-partitions", *b) == ""
    assert "retention.ms=86400000" in ok("configs", "--topic", "quickstart-events", "--describe", *b)
    assert ok("topics", "--delete", "--topic", "no-such-topic", "--if-exists", *b) == ""
    committed = tool("consume", "--topic", "quickstart-events", "--from-beginning", "--isolation-level",
                     "read_committed", "--max-messages", "1", *b)
    assert committed.returncode == 0 and b"no transactions yet" in committed.stderr


def test_a_group_member_reads_from_the_groups_committed_offsets(appliance: Appliance) -> None:
    b = ["--bootstrap-server", appliance.bootstrap]
    ok("produce", "--topic", "plain", *b, stdin=b"one\ntwo\nthree\n")
    first = tool("consume", "--topic", "plain", "--group", "console", "--from-beginning",
                 "--max-messages", "2", *b)
    assert first.returncode == 0 and first.stdout == b"one\ntwo\n", first.stderr
    again = tool("consume", "--topic", "plain", "--group", "console", "--from-beginning",
                 "--max-messages", "1", "--consumer-property", "group.id=console", *b)  # said twice: agrees
    assert again.returncode == 0 and again.stdout == b"three\n", again.stderr  # from the group's commit
    clash = tool("consume", "--topic", "plain", "--group", "console", "--consumer-property",
                 "group.id=other", *b)
    assert clash.returncode == 2 and b"--group console" in clash.stderr and b"group.id=other" in clash.stderr


def _create_times(appliance: Appliance, topic: str, count: int) -> list[int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "oracle"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        stamps: list[int] = []
        deadline = time.monotonic() + 30
        while len(stamps) < count and time.monotonic() < deadline:
            stamps += [m.timestamp()[1] for m in consumer.consume(num_messages=count, timeout=0.5)]
        return stamps
    finally:
        consumer.close()


def test_the_server_file_flag_cannot_be_taken_for_a_topic_setting(appliance: Appliance,
                                                                  tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'"log.dirs" = ["{appliance.data_dir}"]\n')
    created = ok("topics", "create", "made-here", "--config", "retention.ms=1000", "--appliance-config",
                 str(config))
    assert created == "Created topic made-here with 1 partitions.\n"
    described = ok("topics", "describe", "made-here", "--appliance-config", str(config))
    assert "retention.ms=1000" in described
    refused = tool("topics", "create", "other", "--config", str(config))
    assert refused.returncode != 0 and b"KEY=VALUE" in refused.stderr


def _refused(main: object, argv: list[str]) -> str:
    err = io.StringIO()
    with redirect_stderr(err):
        status = main(argv)  # type: ignore[operator]
    assert status == 2, (argv, err.getvalue())
    return err.getvalue()


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (topics.main, ["--create", "--list", "--topic", "t"], ["--create", "--list"]),
        (topics.main, ["--alter", "--topic", "t", "--partitions", "2", "--replication-factor", "2"],
         ["--replication-factor", "--alter"]),
        (topics.main, ["--list", "--partitions", "3"], ["--partitions", "--list"]),
        (topics.main, ["--create", "--partitions", "1"], ["--create", "--topic"]),
        (topics.main, ["--describe", "--under-replicated-partitions", "--topics-with-overrides"],
         ["--under-replicated-partitions", "--topics-with-overrides"]),
        (topics.main, ["--describe", "--at-min-isr-partitions", "--topics-with-overrides"],
         ["--at-min-isr-partitions", "--topics-with-overrides"]),
        (topics.main, ["--list", "--under-min-isr-partitions"], ["--under-min-isr-partitions", "--list"]),
        (topics.main, ["--list", "--topic", "a[b"], ["--topic", "a[b", "invalid regex"]),
        (topics.main, ["--delete", "--topic", "t", "--data-dir", "/d", "--command-config", "/f"],
         ["--command-config", "--data-dir"]),
        (consume.main, ["--topic", "a", "--key-deserializer", "io.confluent.KafkaAvroDeserializer"],
         ["--key-deserializer", "io.confluent.KafkaAvroDeserializer", "StringDeserializer"]),
        (consume.main, ["--topic", "a", "--property",
                        "value.deserializer=org.apache.kafka.common.serialization.LongDeserializer"],
         ["value.deserializer", "LongDeserializer"]),
        (produce.main, ["--topic", "a", "--property", "headers.delimiter=,", "--property",
                        "headers.separator=,"], ["headers.delimiter", "headers.separator"]),
        (produce.main, ["--topic", "a", "--property", "null.marker=\t"], ["null.marker", "key.separator"]),
        (topics.main, ["--delete", "--topic", "t", "--if-not-exists"], ["--if-not-exists", "--delete"]),
        (consume.main, ["--topic", "a", "--include", "a.*"], ["--topic", "--include"]),
        (consume.main, ["--topic", "a", "--offset", "5"], ["--offset", "--partition"]),
        (consume.main, ["--topic", "a", "--partition", "0", "--offset", "3", "--from-beginning"],
         ["--offset", "--from-beginning"]),
        (consume.main, ["--topic", "a", "--group", "g", "--partition", "0"], ["--group", "--partition"]),
        (consume.main, ["--topic", "a", "--partition", "0", "--consumer-property", "group.id=g"],
         ["--group", "--partition"]),
        (consume.main, ["--topic", "a", "--formatter", "kafka.tools.LoggingMessageFormatter"],
         ["--formatter"]),
        (consume.main, ["--topic", "a", "--property", "print.everything=true"], ["print.everything"]),
        (produce.main, ["--topic", "a", "--broker-list", "h:1", "--bootstrap-server", "h:2"],
         ["--bootstrap-server", "--broker-list"]),
        (produce.main, ["a", "--topic", "b"], ["TOPIC", "--topic"]),
        (configs.main, ["--topic", "a", "--entity-type", "topics", "--describe"],
         ["--topic", "--entity-type"]),
        (configs.main, ["--topic", "a", "--alter", "--all", "--add-config", "retention.ms=1"], ["--all"]),
    ],
)
def test_combinations_kafkas_tools_refuse_are_refused_naming_the_flags(main: object, argv: list[str],
                                                                       named: list[str]) -> None:
    message = _refused(main, argv)
    for flag in named:
        assert flag in message, (flag, message)


def _record(**fields: object) -> ConsumerRecord:
    base = {"topic": "someTopic", "partition": 9, "offset": 9876, "timestamp": 1234, "timestamp_type": 0,
            "key": b"someKey", "value": b"someValue", "headers": (("h1", b"v1"), ("h2", b"v2"))}
    return ConsumerRecord(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("properties", "fields", "expected"),
    [
        ({"print.value": "false"}, {}, b""),
        ({"print.key": "true", "print.value": "false"}, {}, b"someKey\n"),
        ({}, {}, b"someValue\n"),
        ({"print.timestamp": "true", "print.value": "false"}, {"timestamp_type": 1}, b"LogAppendTime:1234\n"),
        ({"print.headers": "true", "print.value": "false"}, {"headers": ()}, b"NO_HEADERS\n"),
        ({"print.key": "true", "print.timestamp": "true", "print.partition": "true", "print.offset": "true",
          "print.headers": "true"}, {},
         b"CreateTime:1234\tPartition:9\tOffset:9876\th1:v1,h2:v2\tsomeKey\tsomeValue\n"),
        ({"key.separator": "|", "line.separator": "^", "headers.separator": "#", "print.key": "true",
          "print.timestamp": "true", "print.partition": "true", "print.offset": "true",
          "print.headers": "TRUE"},
         {}, b"CreateTime:1234|Partition:9|Offset:9876|h1:v1#h2:v2|someKey|someValue^"),
        ({"print.key": "true", "print.partition": "true"}, {}, b"Partition:9\tsomeKey\tsomeValue\n"),
        ({"print.key": "true"}, {"value": None, "key": None}, b"null\tnull\n"),
        ({"print.key": "true", "print.headers": "true", "null.literal": "NULL"},
         {"value": None, "headers": (("h", None),)}, b"h:NULL\tsomeKey\tNULL\n"),
        ({"print.key": "true", "print.headers": "true",
          "key.deserializer": "org.apache.kafka.common.serialization.StringDeserializer",
          "value.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
          "headers.deserializer": "org.apache.kafka.common.serialization.StringDeserializer"},
         {"key": b"k\xff", "value": b"v\xff", "headers": (("h", b"\xfe"),)},
         b"h:\xef\xbf\xbd\tk\xef\xbf\xbd\tv\xff\n"),
    ],
)
def test_the_default_formatter_writes_what_kafkas_writes(properties: dict[str, str],
                                                         fields: dict[str, object], expected: bytes) -> None:
    assert MessageFormatter.from_properties(properties).format(_record(**fields)) == expected


def test_version_names_the_protocol() -> None:
    for argv in (["--version"], ["version"]):
        printed = ok(*argv)
        assert printed.startswith("appliance ") and "Produce(0): " in printed and "Fetch(1): " in printed


def test_topic_regexes_min_isr_reports_and_the_admin_settings_file(appliance: Appliance,
                                                                  tmp_path: Path) -> None:
    b = ["--bootstrap-server", appliance.bootstrap]
    for name in ("rx-a", "rx-b", "rxother"):
        ok("topics", "--create", "--topic", name, *b)
    assert ok("topics", "--list", "--topic", "rx-.*", *b) == "rx-a\nrx-b\n"
    assert ok("topics", "--list", "--topic", "'rx-a, rxother'", *b) == "rx-a\nrxother\n"  # Kafka's spelling
    ok("topics", "--alter", "--topic", "rx-.*", "--partitions", "2", *b)
    described = ok("topics", "--describe", "--topic", "rx-.*", *b)
    assert described.count("PartitionCount: 2") == 2 and "rxother" not in described
    at_min = ok("topics", "--describe", "--topic", "rx-.*", "--at-min-isr-partitions", *b).splitlines()
    assert len(at_min) == 4 and all(line.startswith("\tTopic: rx-") for line in at_min)  # ISR 1 = min 1
    assert ok("topics", "--describe", "--under-min-isr-partitions", "--exclude-internal", *b) == ""
    missing = tool("topics", "--describe", "--topic", "nomatch.*", *b)
    assert missing.returncode == 1 and b"Topic 'nomatch.*' does not exist as expected" in missing.stderr
    assert ok("topics", "--describe", "--topic", "nomatch.*", "--if-exists", *b) == ""
    settings = tmp_path / "admin.properties"
    settings.write_text(f"bootstrap.servers={appliance.bootstrap}\nclient.id=ops\nrequest.timeout.ms=20000\n")
    assert "rx-a" in ok("topics", "--list", "--command-config", str(settings)).split()
    assert "for topic rxother" in ok("configs", "--topic", "rxother", "--describe", "--command-config",
                                     str(settings))
    settings.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n")
    refused = _refused(topics.main, ["--list", "--command-config", str(settings), *b])
    assert "security.protocol=SASL_SSL" in refused and "sasl.mechanism" in refused
    assert str(settings) in refused
    assert ok("topics", "--delete", "--topic", "rx-.*", *b) == "Deleted topic rx-a.\nDeleted topic rx-b.\n"
    assert ok("topics", "--list", "--topic", "rx.*", *b) == "rxother\n"


def test_console_producer_headers_null_marker_and_sync(appliance: Appliance) -> None:
    b = ["--bootstrap-server", appliance.bootstrap]
    ok("topics", "--create", "--topic", "headed", *b)
    ok("produce", "--topic", "headed", *b, "--sync", "--property", "parse.headers=true", "--property",
       "parse.key=true", "--property", "null.marker=NULL", "--property", "ignore.error=true",
       stdin=b"h1:v1,h2:NULL\tk1\tval1\nNULL\tNULL\tval2\nh3:v3\tno key separator\n")
    printed = ok("consume", "--topic", "headed", "--from-beginning", "--max-messages", "3", "--property",
                 "print.headers=true", "--property", "print.key=true", "--property", "null.literal=<null>",
                 "--property", "headers.separator=;", "--value-deserializer",
                 "org.apache.kafka.common.serialization.StringDeserializer", *b)
    assert printed == "h1:v1;h2:<null>\tk1\tval1\nNO_HEADERS\t<null>\tval2\nh3:v3\t<null>\tno key separator\n"
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "oracle"})
    try:
        consumer.assign([confluent_kafka.TopicPartition("headed", 0, confluent_kafka.OFFSET_BEGINNING)])
        seen: list[confluent_kafka.Message] = []
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            seen += consumer.consume(num_messages=3, timeout=0.5)
    finally:
        consumer.close()
    assert [(m.headers(), m.key(), m.value()) for m in seen] == [
        ([("h1", b"v1"), ("h2", None)], b"k1", b"val1"), (None, None, b"val2"),
        ([("h3", b"v3")], None, b"no key separator")]
    malformed = tool("produce", "--topic", "headed", *b, "--property", "parse.headers=true",
                     stdin=b"h:v\tfine\nno delimiter\n")
    assert malformed.returncode == 1 and b"line 2: no headers delimiter" in malformed.stderr
