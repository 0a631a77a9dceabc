"""``appliance.Producer`` against a real ``appliance serve``: round trips read back from the log, acks,
compression, bulk sends, idempotence, errors, back-pressure and time-outs.

Every test talks to real processes (``support.harness.Appliance``: the supervisor and its partition
writers) through the control socket and shared-memory rings, and reads the partition logs back with the
storage reader.  Crashes (producers SIGKILLed, writers SIGKILLed) are in test_producer_crash.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.harness import Appliance
from support.producer_helpers import TOPICS, by_offset, log_records, make_producer, wait_for_records

from appliance.client.accumulator import PUBLISHED, ProducerBatch
from appliance.client.partitioner import KeyPartitioner
from appliance.client.producer import Producer, RecordHandle, RecordMetadata
from appliance.client.producer_config import ProducerConfig
from appliance.client.route import BatchChannel, LocalRoute
from ipc.ring_publisher import RingPublisher, publish_and_wait
from storage.batch_builder import ByteColumn, build_batch
from storage.batch_header import COMPRESSION_ZSTD, CRC_OFFSET, parse_header
from storage.compression import COMPRESSION_GZIP
from storage.errors import (
    ApplianceError,
    BackPressureError,
    ConfigError,
    CorruptRecordError,
    InvalidRecordError,
    RequestTimeoutError,
    UnknownTopicOrPartitionError,
)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    serve = Appliance(None, *TOPICS, "listeners=PLAINTEXT://127.0.0.1:0")
    try:
        serve.start()
        yield serve
    finally:
        serve.close()


# -- round trips ---------------------------------------------------------------------------------------------


def test_send_round_trip_keys_headers_timestamps_nulls_read_back_from_the_log(appliance: Appliance) -> None:
    sent: list[tuple[Any, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int | None]] = []
    called: list[tuple[ApplianceError | None, RecordMetadata]] = []
    with make_producer(appliance) as producer:
        for i in range(300):
            key = None if i % 3 == 0 else b"user-%d" % (i % 17)
            value = None if i % 50 == 7 else b"value %d " % i + b"x" * (i % 40)
            headers = (("trace", b"t%d" % i), ("empty", None)) if i % 4 == 0 else ()
            timestamp = 1_700_000_000_000 + i if i % 5 == 0 else None
            partition = 2 if i % 11 == 0 else None
            handle = producer.send("rt", value, key=key, headers=list(headers) or None, partition=partition,
                                   timestamp=timestamp, callback=lambda e, m: called.append((e, m)))
            sent.append((handle, key, value, headers, timestamp))
        before_ms = time.time() * 1000
        metadata = [handle.get(10) for handle, *_ in sent]
    assert len(called) == 300 and all(error is None for error, _ in called)
    assert sorted(called, key=lambda c: (c[1].partition, c[1].offset)) == sorted(
        ((None, m) for m in metadata), key=lambda c: (c[1].partition, c[1].offset))
    logs = {p: by_offset(appliance, "rt", p) for p in range(3)}
    assert sum(len(records) for records in logs.values()) == 300, "each record once"
    keys = KeyPartitioner(3)
    for (_, key, value, headers, timestamp), meta in zip(sent, metadata, strict=True):
        record = logs[meta.partition][meta.offset]
        assert (record.key, record.value, record.headers) == (key, value, headers)
        if timestamp is not None:
            assert record.timestamp == meta.timestamp == timestamp
        else:
            assert record.timestamp == meta.timestamp and before_ms - 60_000 < record.timestamp <= before_ms
        if key is not None and meta.partition != 2:
            assert meta.partition == keys.partition(key), "Kafka's murmur2 partitioner"
    for p in range(3):  # offsets dense and in send order per partition
        assert sorted(logs[p]) == list(range(len(logs[p])))


record_specs = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=30)),  # value
        st.one_of(st.none(), st.binary(max_size=8)),  # key
        st.lists(st.tuples(st.sampled_from(["a", "bé"]), st.one_of(st.none(), st.binary(max_size=5))),
                 max_size=2),  # headers
        st.one_of(st.none(), st.integers(0, 2**42)),  # timestamp
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=record_specs, batch_size=st.sampled_from([200, 1000, 1 << 20]))
def test_any_mix_of_per_record_paths_reads_back_as_sent(appliance: Appliance, specs: list[Any],
                                                       batch_size: int) -> None:
    """The value-only fast path and the general path (keys, headers, timestamps) share batches."""
    with make_producer(appliance, batch_size=batch_size, linger_ms=60_000) as producer:
        handles = []
        for value, key, headers, timestamp in specs:
            if value is not None and key is None and not headers and timestamp is None:
                handles.append(producer.send("mix", value))  # the fast path
            else:
                handles.append(producer.send("mix", value, key=key, headers=headers or None,
                                             timestamp=timestamp))
        producer.flush()
        metadata = [h.get(0) for h in handles]
    logged = by_offset(appliance, "mix", 0)
    for (value, key, headers, timestamp), meta in zip(specs, metadata, strict=True):
        record = logged[meta.offset]
        assert (record.value, record.key, record.headers) == (value, key, tuple(headers))
        assert record.timestamp == meta.timestamp
        if timestamp is not None:
            assert record.timestamp == timestamp


@pytest.mark.parametrize("codec", [COMPRESSION_ZSTD, COMPRESSION_GZIP], ids=["zstd", "gzip"])
def test_compressed_batches_round_trip(appliance: Appliance, codec: int) -> None:
    name = {COMPRESSION_ZSTD: "zstd", COMPRESSION_GZIP: "gzip"}[codec]
    client = appliance.client()
    topic = f"compressed-{name}"
    client.create_topic(topic, 1)
    client.close()
    lines = [b'{"level":"INFO","n":%d,"msg":"request ok"}' % i for i in range(2000)]
    with make_producer(appliance, compression_type=name) as producer:
        handles = [producer.send(topic, line, key=b"k%d" % (i % 3)) for i, line in enumerate(lines[:1000])]
        bulk = producer.send_many(topic, lines[1000:])
        producer.flush()
        assert [h.get(0).offset for h in handles] == list(range(1000))
        assert bulk.get(0).offsets.tolist() == list(range(1000, 2000))
    batches = appliance.batches(topic, 0)
    assert batches and all(parse_header(b).compression == codec for b in batches)
    assert sum(len(b) for b in batches) < sum(len(line) for line in lines) / 2, "really compressed"
    assert [r.value for r in log_records(appliance, topic, 0)] == lines


def test_send_many_accepts_lists_arrays_offsets_and_columns(appliance: Appliance) -> None:
    rows = np.frombuffer(b"".join(b"row-%06d" % i + bytes(90) for i in range(5000)), np.uint8)
    rows = rows.reshape(5000, -1)
    flat = b"".join(b"flat-%d" % i for i in range(20_000))
    ends = np.cumsum([len(b"flat-%d" % i) for i in range(20_000)])
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    listed = [b"list-%d" % i if i % 9 else None for i in range(700)]
    keys = [b"key-%d" % (i % 13) for i in range(700)]
    stamps = np.arange(700, dtype=np.int64) + 1_600_000_000_000
    with make_producer(appliance, batch_size=64 * 1024) as producer:
        a = producer.send_many("bulk", rows, partition=1)
        b = producer.send_many("bulk", (flat, offsets))
        c = producer.send_many("bulk", listed, keys=keys, timestamps=stamps)
        d = producer.send_many("bulk", ByteColumn.from_list([b"col-0", b"col-1"]), partition=3)
        e = producer.send_many("bulk", [])
        metas = [h.get(20) for h in (a, b, c, d, e)]
    logs = {p: by_offset(appliance, "bulk", p) for p in range(4)}
    assert set(metas[0].partitions.tolist()) == {1}
    assert [logs[1][o].value for o in metas[0].offsets.tolist()] == [bytes(r) for r in rows]
    assert len(set(metas[1].partitions.tolist())) > 1, "no keys: whole batches go to sticky partitions"
    assert [logs[p][o].value for p, o in zip(metas[1].partitions.tolist(), metas[1].offsets.tolist(),
                                              strict=True)] == [b"flat-%d" % i for i in range(20_000)]
    partitioner = KeyPartitioner(4)
    for i, (p, o, t) in enumerate(zip(metas[2].partitions.tolist(), metas[2].offsets.tolist(),
                                      metas[2].timestamps.tolist(), strict=True)):
        assert p == partitioner.partition(keys[i])
        assert (logs[p][o].key, logs[p][o].value, logs[p][o].timestamp, t) == (keys[i], listed[i], stamps[i],
                                                                               stamps[i])
    assert [logs[3][o].value for o in metas[3].offsets.tolist()] == [b"col-0", b"col-1"]
    assert len(metas[4].offsets) == 0 and e.done()
    total = sum(len(records) for records in logs.values())
    assert total == 5000 + 20_000 + 700 + 2, "each record once"
    for p in range(4):
        sent_here = [int(o) for m in metas for q, o in zip(m.partitions, m.offsets, strict=True) if q == p]
        assert sorted(sent_here) == sorted(logs[p]), f"partition {p}: metadata offsets = log offsets"


# -- acks and idempotence ------------------------------------------------------------------------------------


def test_a_callback_that_sends_to_the_same_partition_at_acks_0_loses_and_repeats_nothing(
        appliance: Appliance) -> None:
    """acks=0 completes a batch as it is published, on the publishing thread, while the batches queued
    behind it wait: a callback that sends more to the partition publishes them itself (nested)."""
    client = appliance.client()
    client.create_topic("nested", 1)
    client.close()
    values = [b"queued %03d" % i for i in range(60)]
    again = [b"from the callback %d" % i for i in range(40)]
    with make_producer(appliance, acks="0", batch_size=1000, linger_ms=1000) as producer:
        def send_more(error: Exception | None, metadata: object) -> None:
            producer.send_many("nested", again, partition=0)
            producer.send("nested", b"one more", partition=0)

        producer.send("nested", values[0], partition=0, callback=send_more)
        for value in values[1:]:
            producer.send("nested", value, partition=0)
        producer.flush()
        producer.flush()
    records = wait_for_records(appliance, "nested", 0, 101)
    got = [r.value for r in records]
    assert sorted(got) == sorted(values + again + [b"one more"]), "every record once"
    assert [v for v in got if v.startswith(b"queued")] == values, "the queued ones in order"


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_semantics(appliance: Appliance, acks: str) -> None:
    client = appliance.client()
    topic = f"acks-{acks}"
    client.create_topic(topic, 1)
    client.close()
    with make_producer(appliance, acks=acks, batch_size=4096) as producer:
        handles = [producer.send(topic, b"record %d" % i) for i in range(500)]
        producer.flush()
        assert all(h.done() for h in handles), "flush waits for every record"
        offsets = [h.get(0).offset for h in handles]
        producer_id = producer.producer_id
    records = wait_for_records(appliance, topic, 0, 500)  # acks=0: flush returns once they are in the ring
    assert [r.value for r in records] == [b"record %d" % i for i in range(500)], "acks=0 never drops either"
    headers = [parse_header(b) for b in appliance.batches(topic, 0)]
    if acks == "0":
        assert offsets == [-1] * 500, "acks=0: nobody waited for the offsets (Kafka returns -1)"
    else:
        assert offsets == list(range(500))
    if acks == "all":  # idempotent: producer id and one sequence run
        assert {h.producer_id for h in headers} == {producer_id}
        assert [h.base_sequence for h in headers] == [h.base_offset for h in headers]
    else:  # Kafka switches idempotence off when acks is not all
        assert {h.producer_id for h in headers} == {-1}


class _DuplicatingChannel:
    """Publishes every batch twice, the second time exactly as a retry would (same records, same sequence,
    same timestamp): what the writer must append once.  Acks of the copies are checked and swallowed."""

    def __init__(self, inner: BatchChannel) -> None:
        self.inner = inner
        self.copies: dict[int, ProducerBatch] = {}
        self.copy_results: list[tuple[int, int]] = []
        self.originals: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def publish_into(self, max_bytes: int, build: Callable[[np.ndarray], int], token: ProducerBatch, *,
                     timeout_ms: int | None = None) -> int:
        seq = self.inner.publish_into(max_bytes, build, token, timeout_ms=timeout_ms)
        copy = ProducerBatch(token.waiter, token.topic, token.partition, 0)
        copy.state = PUBLISHED
        self.copies[id(copy)] = token
        self.inner.publish_into(max_bytes, build, copy, timeout_ms=timeout_ms)
        return seq

    def take_completed(self) -> list[tuple[ProducerBatch, int]]:
        kept = []
        for token, result in self.inner.take_completed():
            original = self.copies.pop(id(token), None)
            if original is None:
                self.originals[id(token)] = result
                kept.append((token, result))
            else:
                token.complete(result, None)
                self.copy_results.append((self.originals.get(id(original), -999), result))
        return kept


class _DuplicatingRoute(LocalRoute):
    def __init__(self, path: str) -> None:
        super().__init__(path, timeout_ms=10_000)
        self.channels: list[_DuplicatingChannel] = []

    def open_channel(self, *args: Any, **kwargs: Any) -> BatchChannel:
        kwargs["max_in_flight"] = 10  # room for each batch and its copy (the writer keeps the last 5 batches)
        channel = _DuplicatingChannel(super().open_channel(*args, **kwargs))
        self.channels.append(channel)
        return channel  # type: ignore[return-value]


def test_a_batch_published_again_with_its_sequence_is_appended_once(appliance: Appliance) -> None:
    route = _DuplicatingRoute(str(appliance.socket_path))
    producer = Producer(route=route, batch_size=2048, linger_ms=1)
    try:
        handles = [producer.send("dup", b"once %d" % i) for i in range(400)]
        producer.flush()
        offsets = [h.get(0).offset for h in handles]
    finally:
        producer.close()
    assert offsets == list(range(400))
    assert [r.value for r in log_records(appliance, "dup", 0)] == [b"once %d" % i for i in range(400)]
    copies = route.channels[0].copy_results
    assert len(copies) == len(appliance.batches("dup", 0)) >= 4, "every batch went twice, in once"
    assert all(original == copy for original, copy in copies), "a copy is acknowledged with the original's"


# -- errors --------------------------------------------------------------------------------------------------


class _GenerousRoute(LocalRoute):
    """Tells the producer a topic takes batches up to 1 MiB, so the writer is the one to refuse them."""

    def partitions_for(self, topic: str) -> tuple[int, int]:
        count, _ = super().partitions_for(topic)
        return count, 1 << 20


def test_a_refused_batch_fails_alone_and_the_batches_behind_it_are_renumbered(appliance: Appliance) -> None:
    client = appliance.client()
    client.create_topic("small", 1, configs={"max.message.bytes": 3000})
    client.close()
    producer = Producer(route=_GenerousRoute(str(appliance.socket_path), timeout_ms=10_000),
                        batch_size=1000, linger_ms=1000)
    try:
        before = [producer.send("small", b"a%03d" % i + bytes(150)) for i in range(30)]
        big = producer.send("small", bytes(5000))
        after = [producer.send("small", b"b%03d" % i + bytes(150)) for i in range(30)]
        producer.flush()
        with pytest.raises(InvalidRecordError, match=r"small-0.*MESSAGE_TOO_LARGE") as refused:
            big.get(0)
        assert "records" in str(refused.value)
        offsets = [h.get(0).offset for h in before + after]
    finally:
        producer.close()
    assert offsets == list(range(60))
    values = [r.value[:4] for r in log_records(appliance, "small", 0)]
    assert values == [b"a%03d" % i for i in range(30)] + [b"b%03d" % i for i in range(30)]
    sequences = [(h.base_sequence, h.base_offset) for h in map(parse_header, appliance.batches("small", 0))]
    assert all(seq == offset for seq, offset in sequences), "one sequence run: the failed batch's freed"


def test_a_refusal_first_seen_by_the_publish_of_the_next_batch_loses_none_of_the_batches_behind_it(
        appliance: Appliance) -> None:
    """Every in-flight slot is taken by a batch the writer refuses and four behind it; the producer reads
    all five answers only when the next batch is about to go, so that collect starts and ends the recovery
    (the four go back to the front of the queue, renumbered).  Those four go first, and flush() returns only
    once every record sent before it is acknowledged or failed.  (What it guards against: the batch about to
    go published all the same, out of order, and the first batch put back dropped from the queue: never
    sent, never completed, and not waited for by flush().)"""
    client = appliance.client()
    client.create_topic("renumber", 2, configs={"max.message.bytes": 3000})
    client.close()
    writer = 0  # the partition's writer, started by the first batches below
    producer = Producer(route=_GenerousRoute(str(appliance.socket_path), timeout_ms=10_000),
                        batch_size=1000, linger_ms=10_000)  # 5 records of 154 bytes to a batch

    def b(i: int) -> bytes:
        return b"b%03d" % i + bytes(150)

    after: list[RecordHandle] = []
    resumed: list[int] = []

    def with_the_lock_held(error: ApplianceError | None, metadata: RecordMetadata) -> None:
        # a callback runs under the producer's lock, on whichever thread collected its ack: no other
        # thread reads the answers the writer gives meanwhile
        os.kill(writer, signal.SIGCONT)
        resumed.append(1)
        time.sleep(0.3)  # the writer answers its five frames (if it is slower, this test proves nothing)
        after.append(producer.send("renumber", b(25), partition=0))  # the open batch is full: sealed

    try:
        before = [producer.send("renumber", b"a%03d" % i + bytes(150), partition=0) for i in range(10)]
        producer.flush()
        writer = _writer_pid(appliance, "renumber")
        os.kill(writer, signal.SIGSTOP)
        try:
            big = producer.send("renumber", bytes(5000), partition=0)  # refused: MESSAGE_TOO_LARGE
            # four batches go behind it (five in flight, every slot taken); a fifth, full, stays open
            after += [producer.send("renumber", b(i), partition=0) for i in range(25)]
            producer.send("renumber", b"trigger", partition=1, callback=with_the_lock_held).get(10)
        finally:
            if not resumed:
                os.kill(writer, signal.SIGCONT)
        after += [producer.send("renumber", b(i), partition=0) for i in range(26, 30)]
        producer.flush()
        with pytest.raises(InvalidRecordError, match=r"renumber-0.*MESSAGE_TOO_LARGE"):
            big.get(0)
        offsets = [h.get(0).offset for h in before + after]
    finally:
        producer.close()
    assert offsets == list(range(40))
    values = [r.value[:4] for r in log_records(appliance, "renumber", 0)]
    assert values == [b"a%03d" % i for i in range(10)] + [b"b%03d" % i for i in range(30)]
    headers = map(parse_header, appliance.batches("renumber", 0))
    sequences = [(h.base_sequence, h.base_offset) for h in headers]
    assert all(seq == offset for seq, offset in sequences), "one sequence run: the failed batch's freed"


def test_bad_records_are_refused_at_send_and_change_nothing(appliance: Appliance) -> None:
    with make_producer(appliance, max_request_size=10_000) as producer:
        with pytest.raises(TypeError, match=r"must be bytes.*encode"):
            producer.send("one", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be bytes"):
            producer.send("one", b"v", key=42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="header"):
            producer.send("one", b"v", headers=[("h",)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="timestamp"):
            producer.send("one", b"v", timestamp=-5)
        with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0..0, not 1"):
            producer.send("one", b"v", partition=1)
        with pytest.raises(InvalidRecordError, match=r"max.request.size 10000"):
            producer.send("one", bytes(20_000))
        with pytest.raises(InvalidRecordError, match=r"record 1 .*max.request.size"):
            producer.send_many("one", [b"ok", bytes(20_000)])
        with pytest.raises(ValueError, match="2 keys for 3 values"):
            producer.send_many("one", [b"a", b"b", b"c"], keys=[b"k", b"k"])
        start = appliance.batches("one", 0)
        good = producer.send("one", b"good")
        assert good.get(10).offset == sum(parse_header(b).records_count for b in start)
    assert log_records(appliance, "one", 0)[-1].value == b"good"


def test_settings_are_checked_with_kafkas_rules() -> None:
    with pytest.raises(ConfigError, match=r"'linger\.mss' is unknown \(did you mean 'linger\.ms'"):
        ProducerConfig.from_settings({"linger.mss": 5})
    with pytest.raises(ConfigError, match="acks='2'"):
        ProducerConfig.from_settings({"acks": "2"})
    with pytest.raises(ConfigError, match=r"enable.idempotence=true conflicts with acks='1'"):
        ProducerConfig.from_settings({"acks": "1", "enable.idempotence": True})
    with pytest.raises(ConfigError, match=r"max.in.flight.requests.per.connection=6"):
        ProducerConfig.from_settings({"enable.idempotence": "true",
                                      "max.in.flight.requests.per.connection": 6})
    with pytest.raises(ConfigError, match="expected one of none, gzip, snappy, lz4, zstd"):
        ProducerConfig.from_settings(compression_type="lzo")
    assert [ProducerConfig.from_settings(compression_type=name).compression
            for name in ("none", "gzip", "snappy", "lz4", "zstd")] == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError, match=r"linger.ms=-1"):
        ProducerConfig.from_settings(linger_ms=-1)
    assert ProducerConfig.from_settings({"acks": 1}).idempotent is False, "Kafka: default follows acks"
    assert ProducerConfig.from_settings().idempotent is True and ProducerConfig.from_settings().acks == -1
    config = ProducerConfig.from_settings({"appliance.data.dir": "/srv/x"}, linger_ms=7)
    assert (config.linger_ms, config.control_socket) == (7, "/srv/x/.appliance.sock")
    with pytest.raises(ConfigError, match=r"acks"):  # acks=0 over TCP is refused, not silently changed
        Producer({"bootstrap.servers": "127.0.0.1:9092", "acks": 0})


def test_no_appliance_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(ApplianceError, match=f"{tmp_path}/.appliance.sock.*appliance serve"):
        Producer({"appliance.data.dir": str(tmp_path)})


# -- the piece the broker reuses -----------------------------------------------------------------------------


def test_publish_and_wait_hands_a_built_batch_to_the_writer(appliance: Appliance) -> None:
    client = appliance.client()
    attachment = client.attach("raw", 0)
    publisher: RingPublisher[object] = RingPublisher.attach(attachment.names, topic="raw", partition=0)
    try:
        assert publish_and_wait(publisher, build_batch([b"a", b"b"]), timeout_ms=10_000) == 0
        corrupt = bytearray(build_batch([b"c"]))
        corrupt[CRC_OFFSET] ^= 0xFF
        with pytest.raises(CorruptRecordError, match=r"raw-0.*CORRUPT_MESSAGE"):
            publish_and_wait(publisher, corrupt, timeout_ms=10_000)
        assert publish_and_wait(publisher, build_batch([b"d"]), timeout_ms=10_000) == 2, "the ring goes on"
    finally:
        publisher.close()
        client.close()
    assert [r.value for r in log_records(appliance, "raw", 0)] == [b"a", b"b", b"d"]


# -- back-pressure and time-outs -----------------------------------------------------------------------------


@pytest.fixture
def small_rings() -> Iterator[Appliance]:
    serve = Appliance(None, "topics.slow.partitions=1", "appliance.ring.bytes=65536",
                      "listeners=PLAINTEXT://127.0.0.1:0", "appliance.writer.idle.ms=-1")  # a writer to stop
    try:
        serve.start()
        yield serve
    finally:
        serve.close()


def _writer_pid(serve: Appliance, topic: str) -> int:
    """The running writer of the topic's partition 0 (never 0: os.kill(0, ...) signals the test's group)."""
    client = serve.client()
    try:
        pid = client.metadata([topic]).topics[topic].partitions[0].writer_pid
    finally:
        client.close()
    assert pid > 0, f"no writer runs for {topic}-0"
    return pid


def test_records_sent_while_every_slot_is_taken_gather_in_one_batch(small_rings: Appliance) -> None:
    """While max.in.flight batches await acks the open batch is not sealed when linger.ms runs out: records
    keep joining it, and once acks free a slot it goes as one batch, without any call from the sender."""
    writer = _writer_pid(small_rings, "slow")
    producer = make_producer(small_rings, linger_ms=0, max_in_flight_requests_per_connection=2,
                             batch_size=60_000)
    before = len(log_records(small_rings, "slow", 0))
    os.kill(writer, signal.SIGSTOP)
    try:
        handles = [producer.send("slow", b"early-%d" % i) for i in range(2)]  # one batch each, at once
        time.sleep(0.05)
        for group in range(2):
            handles += [producer.send("slow", b"held-%02d" % i) for i in range(group * 20, group * 20 + 20)]
            time.sleep(0.03)  # the timer thread runs many rounds meanwhile: still one open batch
    finally:
        os.kill(writer, signal.SIGCONT)
    try:
        records = wait_for_records(small_rings, "slow", 0, before + 42)[before:]
        assert [r.value for r in records] == [b"early-0", b"early-1"] + [b"held-%02d" % i for i in range(40)]
        counts = [parse_header(b).records_count for b in small_rings.batches("slow", 0)]
        assert counts[-3:] == [1, 1, 40], counts
        assert all(h.get(5).offset == records[0].offset + i for i, h in enumerate(handles))
    finally:
        producer.close()


@pytest.mark.slow
def test_a_stopped_writer_means_back_pressure_then_time_outs(small_rings: Appliance) -> None:
    writer = _writer_pid(small_rings, "slow")
    producer = make_producer(small_rings, max_block_ms=300, batch_size=8192, linger_ms=0,
                             delivery_timeout_ms=1500)
    os.kill(writer, signal.SIGSTOP)
    accepted = []
    try:
        with pytest.raises(BackPressureError, match=r"max\.block\.ms|full for 300 ms"):
            for i in range(100_000):
                started = time.monotonic()
                accepted.append(producer.send("slow", b"%06d" % i + bytes(500)))
        assert time.monotonic() - started >= 0.29, "blocked for max.block.ms first"
        # linger.ms=0: the first records go alone, as soon as sent, until max.in.flight batches await acks;
        # then they gather in one open batch until it is full, whose publish blocks
        assert 5 < len(accepted) < 100_000, "max.in.flight batches awaiting acks, one more full"
        with pytest.raises(RequestTimeoutError, match=r"within 0\.2 s"):
            accepted[0].get(timeout=0.2)
        time.sleep(1.6)
        with pytest.raises(RequestTimeoutError, match=r"delivery.timeout.ms 1500.*may still be appended"):
            accepted[-1].get(timeout=5)
    finally:
        os.kill(writer, signal.SIGCONT)
    producer.close(timeout=10)
    values = [r.value[:6] for r in log_records(small_rings, "slow", 0)]
    assert values == [b"%06d" % i for i in range(len(values))], "in order, each once, none refused"
    assert len(values) <= len(accepted)
