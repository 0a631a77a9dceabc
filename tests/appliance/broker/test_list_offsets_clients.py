"""ListOffsets by timestamp through real Kafka clients against ``appliance serve``: to the record.

confluent-kafka produces batches of many records with increasing, equal and out-of-order timestamps,
compressed and not; its delivery reports give each record's offset and timestamp (the list oracle).  Then
confluent-kafka's and kafka-python's ``offsets_for_times`` must both name the first record at or after each
target, and confluent-kafka's AdminClient ``list_offsets`` with ``OffsetSpec.max_timestamp()`` the first
record holding the largest timestamp.  Our local ``Consumer`` must give the same offsets.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kafka_appliance import Appliance, served_appliance

from appliance.client.consumer import Consumer

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.structs

BASE_MS = 1_700_000_000_000
LOG_APPEND_TIME = '"message.timestamp.type" = "LogAppendTime"'


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    extra = f"[topics.lat]\npartitions = 1\n{LOG_APPEND_TIME}\n"
    yield from served_appliance(tmp_path_factory.mktemp("appliance"), {"times": 1, "invalid": 1}, extra)


@pytest.fixture(scope="module")
def clients(appliance: Appliance) -> Iterator[dict[str, Any]]:
    common = {"bootstrap.servers": appliance.bootstrap, "linger.ms": 200, "batch.num.messages": 10_000}
    out = {
        "plain": confluent_kafka.Producer(common),
        "zstd": confluent_kafka.Producer({**common, "compression.type": "zstd"}),
        "ck": confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "t",
                                        "enable.auto.commit": False}),
        "kp": kafka.KafkaConsumer(bootstrap_servers=appliance.bootstrap),
        "local": Consumer({"log.dirs": str(appliance.data_dir)}),
        "records": [],
    }
    try:
        yield out
    finally:
        out["ck"].close()
        out["kp"].close()
        out["local"].close()


def _produce(producer: Any, topic: str, stamps: list[int]) -> list[tuple[int, int]]:
    """Produce one record per timestamp in one flush (so they share batches); (offset, timestamp) each."""
    reports: list[tuple[int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        reports.append((msg.offset(), msg.timestamp()[1]))

    for ts in stamps:
        producer.produce(topic, value=b"v" * 20, timestamp=ts, on_delivery=delivered)
    assert producer.flush(30) == 0
    return sorted(reports)


def _expected(records: list[tuple[int, int]], target: int) -> int:
    return next((offset for offset, ts in records if ts >= target), -1)


def _ck_offsets(consumer: Any, topic: str, target: int) -> int:
    [found] = consumer.offsets_for_times([TopicPartition(topic, 0, target)], timeout=10)
    assert found.error is None, found.error
    return int(found.offset)


def _kp_offsets(consumer: Any, topic: str, target: int) -> int:
    tp = kafka.structs.TopicPartition(topic, 0)
    found = consumer.offsets_for_times({tp: target})[tp]
    return -1 if found is None else int(found.offset)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(steps=st.lists(st.integers(0, 60), min_size=20, max_size=120), compressed=st.booleans(),
       increasing=st.booleans())
def test_offsets_for_times_name_the_first_record_reaching_the_target(
    clients: dict[str, Any], steps: list[int], compressed: bool, increasing: bool
) -> None:
    stamps = [BASE_MS + s for s in (sorted(steps) if increasing else steps)]
    records: list[tuple[int, int]] = clients["records"]
    records += _produce(clients["zstd" if compressed else "plain"], "times", stamps)
    targets = sorted({BASE_MS - 1, BASE_MS + 61, *stamps, *(s + 1 for s in stamps)})[:40]
    for target in targets:
        expected = _expected(records, target)
        assert _ck_offsets(clients["ck"], "times", target) == expected, target
        assert _kp_offsets(clients["kp"], "times", target) == expected, target
        local = clients["local"].offsets_for_times({("times", 0): target})
        assert [-1 if v is None else v for v in local.values()] == [expected], target


def test_max_timestamp_names_the_first_record_holding_it(appliance: Appliance,
                                                         clients: dict[str, Any]) -> None:
    records = _produce(clients["zstd"], "invalid", [BASE_MS + s for s in (5, 90, 3, 90, 7)])
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    futures = admin.list_offsets({TopicPartition("invalid", 0): OffsetSpec.max_timestamp()})
    answer = futures[TopicPartition("invalid", 0)].result(timeout=10)
    assert (answer.offset, answer.timestamp) == (records[1][0], BASE_MS + 90)


def test_a_timestamp_below_minus_3_is_refused_and_reads_nothing(clients: dict[str, Any]) -> None:
    _produce(clients["plain"], "invalid", [BASE_MS])
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        clients["ck"].offsets_for_times([TopicPartition("invalid", 0, -7)], timeout=10)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_TIMESTAMP
    assert _ck_offsets(clients["ck"], "invalid", 0) == 0  # the partition answers as before


def test_log_append_time_topics_answer_to_the_record(clients: dict[str, Any]) -> None:
    for _ in range(3):
        _produce(clients["plain"], "lat", [BASE_MS] * 30)
    reader = clients["local"]  # the oracle: the times the leader stamped, as stored
    reader.assign([("lat", 0)])
    reader.seek_to_beginning(("lat", 0))
    records = [(r.offset, r.timestamp) for r in reader.poll(5000)]
    assert len(records) == 90 and all(ts > BASE_MS for _, ts in records)
    for target in sorted({ts for _, ts in records} | {BASE_MS, records[-1][1] + 1}):
        expected = _expected(records, target)
        assert _ck_offsets(clients["ck"], "lat", target) == expected
        assert _kp_offsets(clients["kp"], "lat", target) == expected
