"""CreateTopics with real clients against one ``appliance serve``: every topic setting Kafka documents
round-trips through CreateTopics (and IncrementalAlterConfigs) and DescribeConfigs or is refused with its
reason; a wrong type is
INVALID_CONFIG naming the key and creates nothing; explicit replica assignments are honoured where the
appliance can keep them -- each partition's own replica set, held by the replicas of
``appliance.replica.dirs`` that it names, acks=all counting those -- and refused with
INVALID_REPLICA_ASSIGNMENT (or INVALID_REQUEST) naming why, changing nothing."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from support.kafka_appliance import Appliance, served_appliance

from appliance.config.topic_configs import CATALOG, Behaviour
from ipc.control import ControlClient, ControlError
from ipc.kafka.admin_messages import ConfigType
from storage.batch_reader import iter_records
from storage.log_reader import LogReader

TIMEOUT_S = 15

# Per setting: a value the appliance accepts and keeps (not Kafka's default where one is accepted), and for
# a setting refused for some values, one it refuses with the words the refusal must contain.
ACCEPTED = {
    "cleanup.policy": "delete",
    "compression.gzip.level": "5",
    "compression.lz4.level": "12",
    "compression.type": "producer",
    "compression.zstd.level": "7",
    "delete.retention.ms": "3600000",
    "file.delete.delay.ms": "1000",
    "flush.messages": "1000",
    "flush.ms": "5000",
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "8192",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": "86400000",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "2.8-IV1",
    "message.timestamp.after.max.ms": "9223372036854775807",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.difference.max.ms": "9223372036854775807",
    "message.timestamp.type": "LogAppendTime",
    "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "60000",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "1048576",
    "retention.ms": "3600000",
    "segment.bytes": "2097152",
    "segment.index.bytes": "65536",
    "segment.jitter.ms": "0",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "false",
}
REFUSED = {
    "compression.type": ("zstd", "never recompresses"),
    "follower.replication.throttled.replicas": ("0:1", "throttling is not built"),
    "leader.replication.throttled.replicas": ("*", "throttling is not built"),
    "local.retention.bytes": ("1000", "no tiered storage"),
    "local.retention.ms": ("1000", "no tiered storage"),
    "remote.log.copy.disable": ("true", "no tiered storage"),
    "remote.log.delete.on.disable": ("true", "no tiered storage"),
    "remote.storage.enable": ("true", "no tiered storage"),
    "segment.jitter.ms": ("1000", "no jitter"),
    "unclean.leader.election.enable": ("true", "promote one by hand"),
}
WRONG_TYPE = {ConfigType.INT: "12abc", ConfigType.LONG: "1.5", ConfigType.DOUBLE: "half",
              ConfigType.BOOLEAN: "maybe"}  # fmt: skip


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("topic-requests"), {})


@pytest.fixture(scope="module")
def admin(appliance: Appliance) -> AdminClient:
    return AdminClient({"bootstrap.servers": appliance.bootstrap})


def create(admin: AdminClient, topic: NewTopic) -> None:
    admin.create_topics([topic])[topic.topic].result(TIMEOUT_S)


def refused(admin: AdminClient, topic: NewTopic) -> tuple[str, str]:
    with pytest.raises(KafkaException) as raised:
        create(admin, topic)
    error = raised.value.args[0]
    return error.name(), error.str()


def assigned(name: str, assignment: list[list[int]]) -> NewTopic:
    """confluent-kafka's form: the partition count given too (librdkafka sends -1 with an assignment)."""
    return NewTopic(name, len(assignment), replica_assignment=assignment)


def topic_names(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=TIMEOUT_S).topics)


def topic_name(setting: str, what: str) -> str:
    return f"{what}-{setting.replace('.', '-')}"


# -- every documented setting ----------------------------------------------------------------------------


def test_the_samples_cover_every_documented_setting() -> None:
    assert set(ACCEPTED) == {row.name for row in CATALOG}
    assert set(REFUSED) == {row.name for row in CATALOG if row.behaviour is Behaviour.REFUSED}


@pytest.mark.parametrize("row", CATALOG, ids=lambda row: row.name)
def test_every_setting_round_trips_through_create_topics_and_describe_configs(
    admin: AdminClient, row: object
) -> None:
    name = row.name  # type: ignore[attr-defined]
    topic = topic_name(name, "kept")
    create(admin, NewTopic(topic, 1, 1, config={name: ACCEPTED[name]}))
    resource = ConfigResource("topic", topic)
    entry = admin.describe_configs([resource])[resource].result(TIMEOUT_S)[name]
    assert (entry.value, entry.source) == (ACCEPTED[name], ConfigSource.DYNAMIC_TOPIC_CONFIG.value)


def test_every_setting_is_accepted_by_name_in_incremental_alter_configs(admin: AdminClient) -> None:
    create(admin, NewTopic("altered-all", 1, 1))
    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
               for name, value in ACCEPTED.items()]  # fmt: skip
    resource = ConfigResource("topic", "altered-all", incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    described = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert {name: described[name].value for name in ACCEPTED} == ACCEPTED


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_value_the_appliance_cannot_honour_is_refused_with_its_reason(
    admin: AdminClient, name: str
) -> None:
    value, why = REFUSED[name]
    topic = topic_name(name, "refused")
    code, message = refused(admin, NewTopic(topic, 1, 1, config={name: value}))
    assert code == "INVALID_CONFIG" and name in message and why in message, message
    assert topic not in topic_names(admin)


@pytest.mark.parametrize("row", [row for row in CATALOG if row.type in WRONG_TYPE], ids=lambda row: row.name)
def test_a_wrong_type_is_invalid_config_naming_the_key_and_creates_nothing(
    admin: AdminClient, row: object
) -> None:
    name, kind = row.name, row.type  # type: ignore[attr-defined]
    topic = topic_name(name, "wrong")
    config = {"retention.ms": "1000", name: WRONG_TYPE[kind]}
    code, message = refused(admin, NewTopic(topic, 1, 1, config=config))
    assert code == "INVALID_CONFIG" and name in message, message
    assert topic not in topic_names(admin)


# -- replica assignments ---------------------------------------------------------------------------------


def test_an_assignment_naming_this_node_is_honoured(admin: AdminClient) -> None:
    create(admin, assigned("assigned", [[0], [0], [0]]))
    described = admin.list_topics("assigned", timeout=TIMEOUT_S).topics["assigned"]
    assert described.error is None
    assert {p.id: (p.leader, list(p.replicas)) for p in described.partitions.values()} == {
        0: (0, [0]),
        1: (0, [0]),
        2: (0, [0]),
    }


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        ([[7]], "node 7 does not exist"),
        ([[0], [0, 1]], "every partition needs the same replication factor"),
        ([[0, 0]], "name a node twice"),
    ],
    ids=["unknown-node", "unequal-lengths", "duplicate-node"],
)
def test_an_assignment_that_cannot_be_honoured_is_refused_naming_why(
    admin: AdminClient, assignment: list[list[int]], said: str
) -> None:
    code, message = refused(admin, assigned("misassigned", assignment))
    assert code == "INVALID_REPLICA_ASSIGNMENT" and said in message, message
    assert "misassigned" not in topic_names(admin)


def test_kafka_python_creates_with_an_assignment_and_counts_must_be_minus_one(appliance: Appliance) -> None:
    with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import KafkaAdminClient
        from kafka.admin import NewTopic as KafkaPythonNewTopic
        from kafka.errors import InvalidReplicationAssignmentError, InvalidRequestError

    def topic(name: str, partitions: int, factor: int, assignment: dict[int, list[int]]) -> object:
        return KafkaPythonNewTopic(name, partitions, factor, replica_assignments=assignment)

    client = KafkaAdminClient(bootstrap_servers=appliance.bootstrap)
    try:
        client.create_topics([topic("kp-assigned", -1, -1, {0: [0], 1: [0]})])
        with pytest.raises(InvalidRequestError, match=r"send num_partitions and replication_factor as -1"):
            client.create_topics([topic("kp-both", 2, 1, {0: [0], 1: [0]})])
        with pytest.raises(InvalidReplicationAssignmentError, match=r"expected each of 0\.\.1 once"):
            client.create_topics([topic("kp-gap", -1, -1, {0: [0], 2: [0]})])
        described = {t["name"]: t for t in client.describe_topics(["kp-assigned"])}
        assert len(described["kp-assigned"]["partitions"]) == 2
        assert not {"kp-both", "kp-gap"} & set(client.list_topics())
    finally:
        client.close()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """An appliance running two replicas of its own (nodes 1 and 2, each in its own directory)."""
    tmp = tmp_path_factory.mktemp("assigned-replicas")
    dirs = ", ".join(f'"{tmp / f"replica{n}"}"' for n in (1, 2))
    settings = f'"appliance.replica.dirs" = [{dirs}]\n"replica.fetch.backoff.ms" = 50'
    yield from served_appliance(tmp, {}, settings)


def replica_dir(appliance: Appliance, node: int) -> Path:
    return appliance.data_dir.parent / f"replica{node}"


def held(directory: Path, topic: str) -> set[int]:
    """The partitions of ``topic`` that have a log directory in ``directory``."""
    return {int(d.name.rsplit("-", 1)[1]) for d in directory.glob(f"{topic}-*") if d.is_dir()}


def values(directory: Path) -> list[bytes]:
    """Every record value of a partition's log, in offset order (none: no log yet)."""
    if not directory.is_dir():
        return []
    with LogReader(str(directory)) as reader:
        return [r.value or b"" for batch in reader.batches() for r in iter_records(batch)]


def test_an_assignment_of_different_replica_sets_per_partition_is_honoured(replicated: Appliance) -> None:
    admin = AdminClient({"bootstrap.servers": replicated.bootstrap})
    assignment = [[0, 1], [2, 0], [0, 2]]  # partition 1 names node 2 first: its preferred leader
    create(admin, NewTopic("spread", 3, replica_assignment=assignment, config={"min.insync.replicas": "2"}))
    # CreatePartitions records each new partition's replicas the same way; an unknown node changes nothing
    unknown = NewPartitions("spread", 5, replica_assignment=[[1, 0], [0, 9]])
    with pytest.raises(KafkaException, match="partition 4: node 9 does not exist"):
        admin.create_partitions([unknown])["spread"].result(TIMEOUT_S)
    admin.create_partitions([NewPartitions("spread", 5, replica_assignment=[[1, 0], [0, 2]])])[
        "spread"].result(TIMEOUT_S)  # fmt: skip
    described = admin.list_topics("spread", timeout=TIMEOUT_S).topics["spread"]
    assert {p.id: (p.leader, list(p.replicas)) for p in described.partitions.values()} == {
        0: (0, [0, 1]), 1: (0, [2, 0]), 2: (0, [0, 2]), 3: (0, [1, 0]), 4: (0, [0, 2])}  # fmt: skip

    producer = Producer({"bootstrap.servers": replicated.bootstrap, "acks": "all", "linger.ms": 0})
    failures: list[object] = []
    produced = {p: [b"p%d-%03d" % (p, i) for i in range(20)] for p in range(5)}
    for partition, batch in produced.items():
        for value in batch:
            producer.produce("spread", value, partition=partition,
                             on_delivery=lambda err, _msg: failures.append(err) if err else None)
    assert producer.flush(TIMEOUT_S * 2) == 0
    assert failures == []  # acks=all with min.insync.replicas 2: each partition's own follower has them

    expected = {1: {0, 3}, 2: {1, 2, 4}}
    deadline = time.monotonic() + TIMEOUT_S * 2
    while time.monotonic() < deadline and not all(
            values(replica_dir(replicated, node) / f"spread-{p}") == produced[p]
            for node, partitions in expected.items() for p in partitions):  # fmt: skip
        time.sleep(0.1)
    for node, partitions in expected.items():
        assert held(replica_dir(replicated, node), "spread") == partitions, node
        for p in partitions:
            assert values(replica_dir(replicated, node) / f"spread-{p}") == produced[p], (node, p)
    described = admin.list_topics("spread", timeout=TIMEOUT_S).topics["spread"]
    assert {p.id: sorted(p.isrs) for p in described.partitions.values()} == {
        0: [0, 1], 1: [0, 2], 2: [0, 2], 3: [0, 1], 4: [0, 2]}  # fmt: skip
    shown = describe(replicated, "spread")
    assert "Partition: 1\tLeader: 0\tReplicas: 2,0\tIsr: " in shown, shown
    assert describe(replicated, "spread", "--under-replicated-partitions") == "", "all caught up"


def describe(appliance: Appliance, *args: str) -> str:
    """``appliance topics describe ARGS`` over the broker: its output."""
    done = subprocess.run([sys.executable, "-m", "appliance.cli", "topics", "describe", *args,
                           "--bootstrap-server", appliance.bootstrap], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done
    return done.stdout


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        ([[0, 1], [0, 7]], "partition 1: node 7 does not exist (the nodes are 0, 1, 2)"),
        ([[0, 1], [1, 2]], "partition 1: replicas [1, 2] do not name node 0"),
        ([[0, 1], [0]], "every partition needs the same replication factor"),
    ],
    ids=["unknown-node", "without-this-node", "unequal-lengths"],
)
def test_an_assignment_with_replicas_that_cannot_hold_it_changes_nothing(
    replicated: Appliance, assignment: list[list[int]], said: str, request: pytest.FixtureRequest
) -> None:
    admin = AdminClient({"bootstrap.servers": replicated.bootstrap})
    code, message = refused(admin, assigned("misplaced", assignment))
    assert code == "INVALID_REPLICA_ASSIGNMENT" and said in message, message
    assert "misplaced" not in topic_names(admin)
    # a topic created after it: once both replicas hold it, they would hold "misplaced" too, had it been made
    after = f"after-{request.node.callspec.id}"
    create(admin, assigned(after, [[0, 1], [0, 2]]))
    deadline = time.monotonic() + TIMEOUT_S * 2
    while time.monotonic() < deadline and (held(replica_dir(replicated, 1), after), held(
            replica_dir(replicated, 2), after)) != ({0}, {1}):  # fmt: skip
        time.sleep(0.05)
    assert (held(replica_dir(replicated, 1), after), held(replica_dir(replicated, 2), after)) == ({0}, {1})
    for directory in (replicated.data_dir, replica_dir(replicated, 1), replica_dir(replicated, 2)):
        assert held(directory, "misplaced") == set(), directory


@pytest.mark.parametrize(
    "replicas", [[1, 2], [0, 0], [0], "0,1"], ids=["without-this-node", "twice", "too-few", "not-a-list"]
)
def test_the_supervisor_refuses_replicas_it_cannot_record(replicated: Appliance, replicas: object) -> None:
    """The supervisor checks the replicas a create carries again (a client of the control socket other than
    the broker): this node among them, distinct, as many as the replication factor."""
    with ControlClient.connect(replicated.data_dir / ".appliance.sock") as client:
        with pytest.raises(ControlError, match=r"replicas") as raised:
            client.request({"op": "create_topic", "topic": "raw-replicas", "replication_factor": 2,
                            "replicas": replicas})  # fmt: skip
    assert raised.value.error == "INVALID_REPLICA_ASSIGNMENT"
    admin = AdminClient({"bootstrap.servers": replicated.bootstrap})
    assert "raw-replicas" not in topic_names(admin)
