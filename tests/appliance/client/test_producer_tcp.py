"""``appliance.Producer`` over TCP (``bootstrap.servers``, ``appliance.client.tcp_route``) against a real
``appliance serve`` (supervisor, partition writers, broker on a loopback port): what ``send_many`` sends is
in the log once, in order, where Kafka would put it -- also when Produce answers are lost and batches are
sent again, and when the broker refuses a batch in the middle.  The CLI and ``send`` over TCP, and a broker
killed mid-stream, are in test_produce_remote.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from support.consumer_fixtures import free_port
from support.harness import Appliance

from appliance.client.consumer import Consumer, ConsumerRecord
from appliance.client.partitioner import murmur2, to_positive
from appliance.client.producer import Producer
from appliance.client.producer_config import ProducerConfig
from appliance.client.tcp_route import FrameBuffer, ProduceFrame, TcpRoute
from ipc.kafka import (
    ApiKey,
    MetadataRequest,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_request,
    encode_request,
)
from ipc.kafka_client import BrokerConnectionError, KafkaConnection
from storage.errors import InvalidRecordError

pytestmark = pytest.mark.slow

TOPICS = {"plain": 3, "retry": 1, "order": 2, "small": 1, "zstd": 2, "keys": 4}


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    port = free_port()
    overrides = [f"listeners=PLAINTEXT://127.0.0.1:{port}", "auto.create.topics.enable=false",
                 "topics.small.max.message.bytes=2000"]
    overrides += [f"topics.{name}.partitions={count}" for name, count in TOPICS.items()]
    serve = Appliance(None, *overrides, patch={"EXTRA_CHILDREN": ("appliance.broker.process:child_spec",)})
    try:
        serve.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                with KafkaConnection("127.0.0.1", port, connect_timeout_ms=500) as conn:
                    if {t.name for t in conn.request(MetadataRequest(topics=None)).topics} >= set(TOPICS):
                        break
            except BrokerConnectionError:
                pass
            assert time.monotonic() < deadline, serve.log()
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
        assert serve.stop() == 0, serve.log()
        assert "Traceback" not in serve.log(), serve.log()
    finally:
        serve.close()


def read(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, list[ConsumerRecord]]:
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 20
        got = 0
        while got < count and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200, max_records=10_000):
                out[record.partition].append(record)
                got += 1
        assert consumer.poll(timeout_ms=200) == []
    return out


def test_send_many_lands_once_with_keys_headers_timestamps(bootstrap: str) -> None:
    keys = [None if i % 5 == 0 else b"user-%d" % (i % 37) for i in range(2000)]
    values = [b"v%05d" % i for i in range(2000)]
    headers = [[("i", b"%d" % i)] if i % 2 else [] for i in range(2000)]
    stamps = [1_600_000_000_000 + i for i in range(2000)]
    with Producer({"bootstrap.servers": bootstrap, "batch.size": 4096}) as producer:
        assert producer.producer_id >= 0
        sent = producer.send_many("plain", values, keys=keys, headers=headers, timestamps=stamps)
        sent.get()
        placed = sent.batches
    assert sum(b.record_count for b in placed) == 2000
    assert len(placed) > 10  # cut into many batches, pipelined
    log = read(bootstrap, "plain", 3, 2000)
    got = {r.value: r for records in log.values() for r in records}
    assert len(got) == 2000
    for i, value in enumerate(values):
        record = got[value]
        assert (record.key, list(record.headers), record.timestamp) == (keys[i], headers[i], stamps[i])
        if keys[i] is not None:  # Kafka's partitioner: toPositive(murmur2(key)) % partitions
            assert record.partition == to_positive(murmur2(keys[i])) % 3
    for records in log.values():  # dense offsets, each partition in send order
        assert [r.offset for r in records] == list(range(len(records)))
        assert [r.value for r in records] == sorted(r.value for r in records)


def test_lost_responses_are_resent_and_appended_once(bootstrap: str) -> None:
    """The connection breaks as Produce responses arrive, with several requests in flight: the broker
    appended those batches, the producer resends everything unacknowledged with the same sequences, and the
    broker answers the duplicates with their first offsets."""
    values = [b"r%04d" % i for i in range(2000)]
    config = {"bootstrap.servers": bootstrap, "batch.size": 1024}
    route = TcpRoute(ProducerConfig.from_settings(config))
    with Producer(config, route=route) as producer:
        first = producer.send_many("retry", values[:100], partition=0)
        first.get()
        route.faults["lose-response"] = 6
        rest = producer.send_many("retry", values[100:], partition=0)
        rest.get(timeout=20)
        placed = first.batches + rest.batches
        assert route.faults["lose-response"] == 0  # every fault fired
    offsets = [(b.base_offset, b.record_count) for b in placed]
    assert offsets == [(sum(n for _, n in offsets[:i]), n) for i, (_, n) in enumerate(offsets)]
    log = read(bootstrap, "retry", 1, 2000)[0]
    assert [r.value for r in log] == values  # once each, in order
    assert [r.offset for r in log] == list(range(2000))


def test_many_batches_in_flight_keep_their_order(bootstrap: str) -> None:
    rows = np.frombuffer(np.random.default_rng(7).bytes(100 * 20_000), np.uint8).reshape(-1, 100)
    with Producer({"bootstrap.servers": bootstrap, "batch.size": 16384}) as producer:
        first = producer.send_many("order", rows, partition=0)
        second = producer.send_many("order", rows[:5000], partition=1)
        first.get()
        assert len(first.batches) > 100
        second.get()
    log = read(bootstrap, "order", 2, 25_000)
    assert b"".join(r.value for r in log[0]) == rows.tobytes()
    assert b"".join(r.value for r in log[1]) == rows[:5000].tobytes()


def test_a_refused_batch_fails_alone_and_the_ones_behind_it_are_renumbered(bootstrap: str) -> None:
    """The topic takes batches of at most 2000 bytes; one record alone makes a larger batch.  The broker
    refuses that batch (MESSAGE_TOO_LARGE); the batches behind it, already numbered after it, move down
    into its sequence numbers and are appended (a gap would make the broker refuse them all)."""
    values = [b"s%03d" % i + b"." * 60 for i in range(60)]
    values[25] = b"x" * 3000
    with Producer({"bootstrap.servers": bootstrap, "batch.size": 800}) as producer:
        result = producer.send_many("small", values, partition=0)
        with pytest.raises(InvalidRecordError, match=r"small-0.*MESSAGE_TOO_LARGE"):
            result.get()
        producer.send_many("small", [b"after"], partition=0).get()  # the sequence goes on
    log = read(bootstrap, "small", 1, 60)[0]
    assert [r.value for r in log] == [v for i, v in enumerate(values) if i != 25] + [b"after"]


def test_zstd_batches_read_back(bootstrap: str) -> None:
    lines = [b'{"service": "api", "n": %d, "msg": "request served"}' % i for i in range(3000)]
    with Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd"}) as producer:
        producer.send_many("zstd", lines, partition=1).get()
    assert [r.value for r in read(bootstrap, "zstd", 2, 3000)[1]] == lines


@pytest.mark.parametrize("version", [3, 8])
def test_a_produce_frame_built_in_place_is_the_codecs_encoding(version: int) -> None:
    """The frame a batch is built into (``ProduceFrame``) is, byte for byte, what the codec encodes for the
    same request, and decodes back to it; the shared buffer serves frames of other sizes after it."""
    buffer = FrameBuffer()
    frames = {name: ProduceFrame(version=version, client_id="c", topic=name, partition=3, acks=-1,
                                 timeout_ms=30_000, buffer=buffer)
              for name in ("topic", "a-much-longer-name")}
    for name, records in (("topic", b"x" * 1000), ("a-much-longer-name", b"batch"), ("topic", b"y" * 10)):

        def build(region: np.ndarray, records: bytes = records) -> int:
            region[: len(records)] = np.frombuffer(records, np.uint8)
            return len(records)

        frame = frames[name].build(2000, build)
        assert frame is not None
        built = bytes(ProduceFrame.with_correlation_id(frame, 77))
        request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30_000,
                                 topic_data=[TopicProduceData(name, [PartitionProduceData(3, records)])])
        assert built == encode_request(RequestHeader(ApiKey.PRODUCE, version, 77, "c"), request)
        decoded = decode_request(built[4:])
        assert decoded.header.correlation_id == 77
        assert bytes(decoded.body.topic_data[0].partition_data[0].records) == records
    assert frames["topic"].build(2000, lambda region: 0) is None  # the builder wrote nothing
