"""Topic administration over the Kafka protocol with real clients, against one ``appliance serve``:
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions, DeleteRecords (confluent-kafka's
and kafka-python's AdminClients), settings that take effect without a restart, and the commands
``appliance configs`` and ``appliance topics alter|delete-records``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from support.kafka_appliance import REPO, Appliance, served_appliance

from appliance.client.admin import KafkaAdmin
from ipc.kafka import ResourceType
from storage.errors import ConfigError

TIMEOUT_S = 15
SET = AlterConfigOpType.SET


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("topic-admin"), {"declared": 1})


@pytest.fixture(scope="module")
def admin(appliance: Appliance) -> AdminClient:
    return AdminClient({"bootstrap.servers": appliance.bootstrap})


def create(admin: AdminClient, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    futures[name].result(TIMEOUT_S)


def describe(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource("topic", name)
    return dict(admin.describe_configs([resource])[resource].result(TIMEOUT_S))


def incremental(admin: AdminClient, name: str, *entries: ConfigEntry, validate_only: bool = False) -> None:
    resource = ConfigResource("topic", name, incremental_configs=list(entries))
    admin.incremental_alter_configs([resource], validate_only=validate_only)[resource].result(TIMEOUT_S)


def kafka_error(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(KafkaException) as raised:
        call()
    error = raised.value.args[0]
    return error.name(), error.str()


def produce(appliance: Appliance, topic: str, count: int, partition: int = 0, size: int = 200) -> None:
    producer = Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 0})
    for i in range(count):  # one batch each
        producer.produce(topic, b"%06d" % i + b"x" * size, partition=partition)
        assert producer.flush(TIMEOUT_S) == 0


def segment_files(appliance: Appliance, topic: str, partition: int = 0) -> list[str]:
    return sorted(p.name for p in (appliance.data_dir / f"{topic}-{partition}").glob("*.log"))


def watermarks(appliance: Appliance, topic: str, partition: int = 0) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S)
        return int(low), int(high)
    finally:
        consumer.close()


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {TIMEOUT_S} s: {what}"
        time.sleep(0.1)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


# -- DescribeConfigs -------------------------------------------------------------------------------------


def test_describe_configs_lists_every_topic_setting_with_its_source(admin: AdminClient) -> None:
    create(admin, "described", config={"retention.ms": "3600000"})
    configs = describe(admin, "described")
    assert len(configs) >= 30 and "min.insync.replicas" in configs and "compression.type" in configs
    retention = configs["retention.ms"]
    assert retention.value == "3600000" and retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not retention.is_default and not retention.is_read_only
    synonyms = [(s.name, s.value, s.source) for s in retention.synonyms.values()]
    assert synonyms[0] == ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG.value) in synonyms
    segment = configs["segment.bytes"]
    assert segment.value == "1073741824" and segment.is_default
    assert configs["cleanup.policy"].value == "delete"


def test_describe_configs_of_unknown_topic_and_other_broker_are_refused(
    appliance: Appliance, admin: AdminClient
) -> None:
    name, _ = kafka_error(lambda: describe(admin, "no-such-topic"))
    assert name == "UNKNOWN_TOPIC_OR_PART"  # librdkafka's name of UNKNOWN_TOPIC_OR_PARTITION
    # (librdkafka sends a broker resource to that broker: ask this one about node 7 with our admin client)
    with KafkaAdmin(appliance.bootstrap) as ours, pytest.raises(ConfigError, match=r"node\.id 0"):
        ours.describe_configs(ResourceType.BROKER, "7")


def test_broker_settings_are_described_read_only_and_cannot_be_altered(admin: AdminClient) -> None:
    broker = ConfigResource("broker", "0")
    configs = admin.describe_configs([broker])[broker].result(TIMEOUT_S)
    assert configs["segment.bytes"].value == "1073741824" and configs["segment.bytes"].is_read_only
    altered = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    name, message = kafka_error(lambda: admin.incremental_alter_configs([altered])[altered].result(TIMEOUT_S))
    assert name == "INVALID_REQUEST" and "restart" in message


# -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------------------


def test_alter_configs_replaces_the_topics_overrides(admin: AdminClient) -> None:
    create(admin, "replaced", config={"retention.ms": "3600000"})
    resource = ConfigResource("topic", "replaced", set_config={"segment.bytes": "1048576"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # confluent-kafka prefers the incremental form
        admin.alter_configs([resource])[resource].result(TIMEOUT_S)
    configs = describe(admin, "replaced")
    assert configs["segment.bytes"].value == "1048576"
    assert configs["retention.ms"].value == "604800000" and configs["retention.ms"].is_default


def test_incremental_alter_configs_sets_deletes_and_appends(admin: AdminClient) -> None:
    create(admin, "incremental", config={"retention.ms": "3600000"})
    incremental(admin, "incremental",
                ConfigEntry("retention.bytes", "1000000", incremental_operation=SET),
                ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    configs = describe(admin, "incremental")
    assert configs["retention.bytes"].value == "1000000"
    assert configs["retention.ms"].value == "604800000" and configs["retention.ms"].is_default
    appended = ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)
    incremental(admin, "incremental", appended)
    assert describe(admin, "incremental")["cleanup.policy"].value == "delete"  # already there: unchanged


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (ConfigEntry("retention.msx", "1", incremental_operation=AlterConfigOpType.SET), "retention.msx"),
        (ConfigEntry("segment.bytes", "5", incremental_operation=AlterConfigOpType.SET), "segment.bytes"),
        (ConfigEntry("segment.bytes", "5", incremental_operation=AlterConfigOpType.APPEND), "segment.bytes"),
        (ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET),
         "compression.type"),
    ],
    ids=["unknown-key", "out-of-range", "append-to-a-non-list", "refused-value"],
)
def test_bad_settings_are_invalid_config_naming_the_key_and_change_nothing(
    admin: AdminClient, entry: ConfigEntry, named: str
) -> None:
    topic = f"bad-{named.replace('.', '-')}-{entry.incremental_operation.value}"
    create(admin, topic, config={"retention.ms": "3600000"})
    before = {k: (e.value, e.source) for k, e in describe(admin, topic).items()}
    good = ConfigEntry("retention.bytes", "5000", incremental_operation=AlterConfigOpType.SET)
    name, message = kafka_error(lambda: incremental(admin, topic, good, entry))
    assert name == "INVALID_CONFIG" and named in message
    assert {k: (e.value, e.source) for k, e in describe(admin, topic).items()} == before


def test_validate_only_changes_nothing(admin: AdminClient) -> None:
    create(admin, "validated")
    incremental(admin, "validated",
                ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET),
                validate_only=True)  # fmt: skip
    assert describe(admin, "validated")["retention.ms"].is_default


def test_a_new_segment_bytes_rolls_a_running_writers_log_without_a_restart(
    appliance: Appliance, admin: AdminClient
) -> None:
    create(admin, "rolls")
    produce(appliance, "rolls", 20)  # the partition's writer runs from here on
    assert len(segment_files(appliance, "rolls")) == 1
    incremental(admin, "rolls", ConfigEntry("segment.bytes", "2048", incremental_operation=SET))
    produce(appliance, "rolls", 40)
    assert len(segment_files(appliance, "rolls")) > 3
    assert watermarks(appliance, "rolls") == (0, 60)


def test_a_shorter_retention_ms_deletes_old_segments_without_a_restart(
    appliance: Appliance, admin: AdminClient
) -> None:
    create(admin, "ages", config={"segment.bytes": "2048"})
    produce(appliance, "ages", 60)
    segments = len(segment_files(appliance, "ages"))
    assert segments > 3 and watermarks(appliance, "ages") == (0, 60)
    incremental(admin, "ages", ConfigEntry("retention.ms", "1", incremental_operation=SET))
    # the log start offset moves first (its checkpoint is written before any file is unlinked), then
    # the segments below it go
    wait_until(lambda: watermarks(appliance, "ages")[0] > 0
               and len(segment_files(appliance, "ages")) < segments, "retention deleted the closed segments")
    assert watermarks(appliance, "ages")[1] == 60


# -- CreatePartitions ------------------------------------------------------------------------------------


def test_create_partitions_adds_partitions_seen_in_metadata_at_once(
    appliance: Appliance, admin: AdminClient
) -> None:
    create(admin, "grows", 2)
    admin.create_partitions([NewPartitions("grows", 5)])["grows"].result(TIMEOUT_S)
    assert len(admin.list_topics("grows", timeout=TIMEOUT_S).topics["grows"].partitions) == 5
    produce(appliance, "grows", 3, partition=4)
    assert watermarks(appliance, "grows", 4) == (0, 3)
    same = NewPartitions("grows", 5)
    name, _ = kafka_error(lambda: admin.create_partitions([same])["grows"].result(TIMEOUT_S))
    assert name == "INVALID_PARTITIONS"
    assigned = NewPartitions("grows", 6, replica_assignment=[[3]])
    name, message = kafka_error(lambda: admin.create_partitions([assigned])["grows"].result(TIMEOUT_S))
    assert name == "INVALID_REPLICA_ASSIGNMENT" and "node 3" in message
    checked = NewPartitions("grows", 7)
    admin.create_partitions([checked], validate_only=True)["grows"].result(TIMEOUT_S)
    assert len(admin.list_topics("grows", timeout=TIMEOUT_S).topics["grows"].partitions) == 5


# -- DeleteRecords ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(AdminClient, "delete_records"), reason="no delete_records in confluent-kafka")
def test_delete_records_moves_the_log_start_offset(appliance: Appliance, admin: AdminClient) -> None:
    create(admin, "trimmed", 2)
    produce(appliance, "trimmed", 50)
    (future,) = admin.delete_records([TopicPartition("trimmed", 0, 30)]).values()
    assert future.result(TIMEOUT_S).low_watermark == 30
    assert watermarks(appliance, "trimmed") == (30, 50)
    (future,) = admin.delete_records([TopicPartition("trimmed", 0, 51)]).values()
    name, _ = kafka_error(lambda: future.result(TIMEOUT_S))
    assert name == "OFFSET_OUT_OF_RANGE"
    assert watermarks(appliance, "trimmed") == (30, 50)
    (future,) = admin.delete_records([TopicPartition("trimmed", 0, -1)]).values()  # the high watermark
    assert future.result(TIMEOUT_S).low_watermark == 50
    (future,) = admin.delete_records([TopicPartition("trimmed", 1, 0)]).values()  # a partition with no writer
    assert future.result(TIMEOUT_S).low_watermark == 0


# -- kafka-python ----------------------------------------------------------------------------------------


def test_kafka_python_describes_configs_and_creates_partitions(
    appliance: Appliance, admin: AdminClient
) -> None:
    with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource as KafkaConfigResource
        from kafka.admin import ConfigResourceType
        from kafka.admin import NewPartitions as KafkaNewPartitions

    create(admin, "python-admin", 1, config={"retention.ms": "7200000"})
    client = KafkaAdminClient(bootstrap_servers=appliance.bootstrap)
    try:
        described = client.describe_configs([KafkaConfigResource(ConfigResourceType.TOPIC, "python-admin")])
        text = json.dumps(described, default=str)
        assert '"retention.ms": {"value": "7200000"' in text and "DYNAMIC_TOPIC_CONFIG" in text
        client.create_partitions({"python-admin": KafkaNewPartitions(3)})
    finally:
        client.close()
    assert len(admin.list_topics("python-admin", timeout=TIMEOUT_S).topics["python-admin"].partitions) == 3


# -- the commands ----------------------------------------------------------------------------------------


def test_configs_command_describes_and_alters(appliance: Appliance, admin: AdminClient) -> None:
    create(admin, "commanded")
    where = ["--bootstrap-server", appliance.bootstrap, "--entity-type", "topics",
             "--entity-name", "commanded"]
    done = cli("configs", *where, "--alter", "--add-config", "retention.ms=5000000,cleanup.policy=[delete]")
    assert done.returncode == 0, done.stderr
    shown = cli("configs", *where, "--describe")
    assert shown.returncode == 0, shown.stderr
    assert "Dynamic configs for topic commanded are:" in shown.stdout
    assert "retention.ms=5000000 sensitive=false" in shown.stdout and "segment.bytes" not in shown.stdout
    assert "segment.bytes=1073741824" in cli("configs", *where, "--describe", "--all").stdout
    refused = cli("configs", *where, "--alter", "--add-config", "segment.bytes=1")
    assert refused.returncode == 1 and "segment.bytes = 1" in refused.stderr, refused.stderr
    assert cli("configs", *where, "--alter", "--delete-config", "retention.ms").returncode == 0
    assert describe(admin, "commanded")["retention.ms"].is_default


def test_topics_alter_and_delete_records_commands(
    appliance: Appliance, admin: AdminClient, tmp_path: Path
) -> None:
    create(admin, "altered", 1)
    server = ["--bootstrap-server", appliance.bootstrap]
    grown = cli("topics", "alter", "--topic", "altered", "--partitions", "3", *server)
    assert grown.returncode == 0, grown.stderr
    assert len(admin.list_topics("altered", timeout=TIMEOUT_S).topics["altered"].partitions) == 3
    produce(appliance, "altered", 10)
    trimmed = cli("topics", "delete-records", "--topic", "altered", "--partition", "0", "--offset", "4",
                  *server)
    assert trimmed.returncode == 0, trimmed.stderr
    assert "Low watermark: 4" in trimmed.stdout
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": "altered", "partition": 0, "offset": 7}]}))
    trimmed = cli("topics", "delete-records", "--offset-json-file", str(offsets), *server)
    assert trimmed.returncode == 0, trimmed.stderr
    assert watermarks(appliance, "altered") == (7, 10)
    shrunk = cli("topics", "alter", "altered", "--partitions", "2", *server)
    assert shrunk.returncode == 1 and "must be larger" in shrunk.stderr, shrunk.stderr


def test_a_raised_min_insync_replicas_refuses_the_next_acks_all_produce(
        appliance: Appliance, admin: AdminClient) -> None:
    """min.insync.replicas altered above the topic's replicas: Kafka answers acks=all NOT_ENOUGH_REPLICAS
    from then on (acks=1 still appends)."""
    create(admin, "min-isr")

    def deliver(acks: str) -> str | None:
        outcome: list[str | None] = []
        producer = Producer({"bootstrap.servers": appliance.bootstrap, "acks": acks, "retries": 0,
                             "message.timeout.ms": 10_000, "enable.idempotence": False})
        producer.produce("min-isr", b"v", on_delivery=lambda error, _: outcome.append(
            None if error is None else error.name()))
        producer.flush(TIMEOUT_S)
        return outcome[0]

    assert deliver("all") is None
    incremental(admin, "min-isr", ConfigEntry("min.insync.replicas", "2", incremental_operation=SET))
    assert deliver("all") == "NOT_ENOUGH_REPLICAS"
    assert deliver("1") is None
