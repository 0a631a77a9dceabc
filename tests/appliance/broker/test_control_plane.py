"""The control plane never wedges: a slow topic creation past the client's timeout, other clients served
while a creation is held, a lost broker-supervisor connection, against a real ``appliance serve`` and
confluent-kafka.  (A topic of many partitions end to end: ``test_many_partitions.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harness import Appliance
from support.kafka_appliance import free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

KEEP = "keep"


class Running:
    """An appliance on a fixed port with a topic ``keep`` of 2 partitions."""

    def __init__(self, cwd: Path, *overrides: str) -> None:
        self.port = free_port()
        self.app = Appliance(cwd, f"listeners=PLAINTEXT://127.0.0.1:{self.port}", "num.partitions=2",
                             "topics.keep.partitions=2", *overrides)  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def topics(self) -> dict[str, int]:
        """Topic -> partition count as a Kafka client lists them; every topic and partition error-free.
        The internal topic ``__consumer_offsets`` (created by a consumer's first group request) is left
        out: these tests count the topics they create."""
        metadata = self.admin().list_topics(timeout=20)
        out = {}
        for name, topic in metadata.topics.items():
            if name == "__consumer_offsets":
                continue
            assert topic.error is None, (name, topic.error)
            for partition in topic.partitions.values():
                assert partition.error is None, (name, partition.id, partition.error)
            out[name] = len(topic.partitions)
        return out

    def status(self) -> dict[str, int]:
        with self.app.client() as client:
            return dict(client.status()["requests"])


@pytest.fixture
def running(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Running]:
    overrides = getattr(request, "param", ())
    app = Running(Path(tmp_path_factory.mktemp("control", numbered=True)), *overrides)
    try:
        app.app.start()
        yield app
        app.app.stop()
    finally:
        app.app.close()  # kills what is left, removes shared memory and the notify socket's directory


def wait_until(what: str, condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} in {timeout_s} s")
        time.sleep(0.1)


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                         "linger.ms": 50})  # fmt: skip
    for i in range(count):
        producer.produce(topic, f"{topic}-{i}".encode(), partition=i % partitions)
    assert producer.flush(60) == 0


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
    try:
        return [consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=20)[1]
                for p in range(partitions)]  # fmt: skip
    finally:
        consumer.close()


def create(running: Running, topic: str, partitions: int, timeout_s: float) -> Any:
    """CreateTopics with ``timeout_s`` as its timeout_ms; the KafkaError the client got, or None."""
    admin = running.admin()
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout_s,
                                  request_timeout=timeout_s + 30)  # fmt: skip
    try:
        futures[topic].result(timeout=timeout_s + 60)
    except confluent_kafka.KafkaException as exc:
        error: confluent_kafka.KafkaError = exc.args[0]
        return error
    return None


@pytest.mark.parametrize("running", [['appliance.test.faults=["create.slow:4000"]']], indirect=True)
def test_a_create_slower_than_its_timeout_times_out_and_still_completes(running: Running) -> None:
    produce(running.bootstrap, KEEP, 10, 2)
    error = create(running, "slow", 4, timeout_s=1.0)
    assert error is not None and error.code() == confluent_kafka.KafkaError.REQUEST_TIMED_OUT, error
    # the creation goes on in the supervisor; meanwhile every other topic is answered right
    assert running.topics() == {KEEP: 2}
    assert high_watermarks(running.bootstrap, KEEP, 2) == [5, 5]
    wait_until("slow is listed", lambda: running.topics() == {KEEP: 2, "slow": 4})
    # a retry of the same create is answered, not half-done; later requests work without a restart
    error = create(running, "slow", 4, timeout_s=10.0)
    assert error is not None and error.code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS, error
    assert create(running, "after", 3, timeout_s=10.0) is None
    produce(running.bootstrap, "slow", 8, 4)
    assert high_watermarks(running.bootstrap, "slow", 4) == [2, 2, 2, 2]
    assert running.topics() == {KEEP: 2, "slow": 4, "after": 3}


@pytest.mark.parametrize("running", [['appliance.test.faults=["create.slow:3000", "create.partition"]']],
                         indirect=True)  # fmt: skip
def test_a_slow_create_that_fails_rolls_back_and_a_retry_succeeds(running: Running) -> None:
    error = create(running, "doomed", 3, timeout_s=1.0)
    assert error is not None and error.code() == confluent_kafka.KafkaError.REQUEST_TIMED_OUT, error
    assert running.topics() == {KEEP: 2}
    wait_until("the roll-back is logged", lambda: "creating topic doomed failed after it was recorded"
               in running.app.log())  # fmt: skip
    wait_until("the roll-back finished", lambda: not any(
        p.name.startswith("doomed-") for p in running.app.data.iterdir()))  # fmt: skip
    assert running.topics() == {KEEP: 2}
    assert create(running, "doomed", 3, timeout_s=10.0) is None
    assert running.topics() == {KEEP: 2, "doomed": 3}


@pytest.mark.parametrize("running", [['appliance.test.faults=["create.drop_connection"]']], indirect=True)
def test_a_lost_control_connection_comes_back_by_itself(running: Running) -> None:
    produce(running.bootstrap, KEEP, 10, 2)
    error = create(running, "first", 2, timeout_s=5.0)
    # the supervisor closed the broker's control connection: a retriable error, never UNKNOWN_SERVER_ERROR
    assert error is not None and error.code() == confluent_kafka.KafkaError.REQUEST_TIMED_OUT, error
    assert "create.drop_connection" in running.app.log()
    # the broker still answers metadata and fetches, and reconnects on its own
    assert running.topics()[KEEP] == 2
    assert high_watermarks(running.bootstrap, KEEP, 2) == [5, 5]
    wait_until("a create works again", lambda: create(running, "first", 2, timeout_s=5.0) is None)
    assert "control connection to the supervisor re-established" in running.app.log()
    produce(running.bootstrap, KEEP, 10, 2)  # rings of the old connection are gone: new ones attached
    produce(running.bootstrap, "first", 4, 2)
    assert high_watermarks(running.bootstrap, KEEP, 2) == [10, 10]
    assert running.topics() == {KEEP: 2, "first": 2}


SLOW_MS = 8000  # the held creation: far longer than another client's Metadata and Produce take


@pytest.mark.parametrize("running", [[f'appliance.test.faults=["create.slow:{SLOW_MS}"]']], indirect=True)
def test_other_clients_are_answered_while_a_create_is_held(running: Running) -> None:
    produce(running.bootstrap, KEEP, 2, 2)
    finished: list[str] = []
    before = running.status().get("create_topic", 0)
    admin = running.admin()  # kept: the request is this client's
    futures = admin.create_topics([NewTopic("held", 3, 1)], operation_timeout=120, request_timeout=150)
    futures["held"].add_done_callback(lambda _: finished.append("create"))
    # the broker has sent the creation to the supervisor, which holds it for SLOW_MS
    wait_until("the supervisor got the creation", lambda: running.status().get("create_topic", 0) > before)
    # another client's Metadata and Produce on another topic are answered while the creation is held
    assert running.topics()[KEEP] == 2
    finished.append("metadata")
    produce(running.bootstrap, KEEP, 4, 2)
    finished.append("produce")
    assert futures["held"].result(timeout=120) is None
    assert finished == ["metadata", "produce", "create"], finished
    assert high_watermarks(running.bootstrap, KEEP, 2) == [3, 3]
    assert running.topics() == {KEEP: 2, "held": 3}
