"""Produce over the socket, against a running appliance: every batch goes through the partition writer's
ring, acks 0 / 1 / -1, per-partition errors that change nothing else, idempotent retries appended once,
and Fetch seeing what was acknowledged."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pytest
from support.kafka_appliance import Appliance, start_appliance, stop_appliance
from support.wire import WireClient, answers, offsets_in, produce, values_in

from ipc.kafka import (
    ApiKey,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
)
from storage.batch_builder import build_batch
from storage.batch_header import CRC_OFFSET, MAGIC_OFFSET


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    tmp = tmp_path_factory.mktemp("produce")
    running = start_appliance(
        tmp,
        {"p": 2, "idem": 1, "acks": 2},
        extra='[topics.small]\npartitions = 1\n"max.message.bytes" = 2000',
    )
    try:
        yield running
    finally:
        stop_appliance(running)
    assert "Traceback" not in running.log_text()


def client(appliance: Appliance) -> WireClient:
    host, port = appliance.bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)))








def latest(wire: WireClient, topic: str, partition: int) -> int:
    request = ListOffsetsRequest(
        topics=[ListOffsetsTopic(topic, [ListOffsetsPartition(partition, timestamp=-1)])]
    )
    return wire.call(ApiKey.LIST_OFFSETS, 5, request).topics[0].partitions[0].offset


def test_acks_1_and_all_answer_dense_base_offsets_and_fetch_sees_them(appliance: Appliance) -> None:
    wire = client(appliance)
    for version in range(3, 9):
        for acks in (1, -1):
            before = latest(wire, "acks", 0)
            batch = build_batch([b"v%d-%d" % (version, acks)] * 3)
            response = wire.call(ApiKey.PRODUCE, version, produce(acks, ("acks", 0, batch)))
            assert answers(response) == {("acks", 0): (0, before)}
            assert latest(wire, "acks", 0) == before + 3  # acknowledged means visible
            if version >= 5:
                assert response.responses[0].partition_responses[0].log_start_offset == 0
    wire.close()


def test_acks_0_gets_no_response_but_is_appended_in_order(appliance: Appliance) -> None:
    wire = client(appliance)
    before = latest(wire, "acks", 1)
    for i in range(5):
        wire.send(ApiKey.PRODUCE, 8, produce(0, ("acks", 1, build_batch([b"fire-and-forget-%d" % i]))))
    marker = wire.send(ApiKey.METADATA, 8, MetadataRequest(topics=[]))
    assert wire.recv(ApiKey.METADATA, 8)[0] == marker  # the next response is the next request's
    deadline = time.monotonic() + 5
    while latest(wire, "acks", 1) < before + 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert values_in(wire, "acks", 1)[before:] == [b"fire-and-forget-%d" % i for i in range(5)]
    wire.close()


def test_bad_batches_get_their_own_error_and_change_nothing_else(appliance: Appliance) -> None:
    wire = client(appliance)
    good = build_batch([b"good"])
    bad_crc = bytearray(build_batch([b"bad crc"]))
    bad_crc[CRC_OFFSET] ^= 0xFF
    old_magic = bytearray(build_batch([b"magic 1"]))
    old_magic[MAGIC_OFFSET] = 1
    two_batches = build_batch([b"one"]) + build_batch([b"two"])
    too_large = build_batch([b"x" * 3000])
    before = [latest(wire, "p", p) for p in (0, 1)]
    response = wire.call(
        ApiKey.PRODUCE,
        8,
        produce(
            1,
            ("p", 0, good),
            ("p", 1, bytes(bad_crc)),
            ("p", 7, good),
            ("nope", 0, good),
            ("small", 0, too_large),
        ),
    )
    assert answers(response) == {
        ("p", 0): (0, before[0]),
        ("p", 1): (ErrorCode.CORRUPT_MESSAGE, -1),
        ("p", 7): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("nope", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("small", 0): (ErrorCode.MESSAGE_TOO_LARGE, -1),
    }
    message = response.responses[0].partition_responses[1].error_message
    assert "CRC" in message
    for records, code in (
        (bytes(old_magic), ErrorCode.INVALID_RECORD),
        (two_batches, ErrorCode.INVALID_RECORD),
        (b"", ErrorCode.INVALID_RECORD),
        (good[:40], ErrorCode.CORRUPT_MESSAGE),
    ):
        assert answers(wire.call(ApiKey.PRODUCE, 8, produce(1, ("p", 1, records)))) == {("p", 1): (code, -1)}
    response = wire.call(ApiKey.PRODUCE, 8, produce(2, ("p", 1, good)))
    assert answers(response) == {("p", 1): (ErrorCode.INVALID_REQUIRED_ACKS, -1)}
    response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("p", 1, good), transactional_id="tx"))
    assert answers(response) == {("p", 1): (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)}
    assert [latest(wire, "p", p) for p in (0, 1)] == [before[0] + 1, before[1]]
    assert latest(wire, "small", 0) == 0
    wire.close()


def test_an_error_with_acks_0_closes_the_connection(appliance: Appliance) -> None:
    wire = client(appliance)
    wire.send(ApiKey.PRODUCE, 8, produce(0, ("nope", 0, build_batch([b"lost"]))))
    assert wire.is_closed_by_peer(5)
    wire.close()


def test_an_idempotent_retry_is_appended_once(appliance: Appliance) -> None:
    wire = client(appliance)
    ids = wire.call(
        ApiKey.INIT_PRODUCER_ID,
        1,
        InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000),
    )
    assert ids.error_code == 0 and ids.producer_id >= 0 and ids.producer_epoch >= 0
    first = build_batch(
        [b"once-%d" % i for i in range(4)],
        producer_id=ids.producer_id,
        producer_epoch=ids.producer_epoch,
        base_sequence=0,
    )
    second = build_batch(
        [b"twice"], producer_id=ids.producer_id, producer_epoch=ids.producer_epoch, base_sequence=4
    )
    a = answers(wire.call(ApiKey.PRODUCE, 8, produce(-1, ("idem", 0, first))))
    b = answers(wire.call(ApiKey.PRODUCE, 8, produce(-1, ("idem", 0, first))))  # a retry of the same batch
    c = answers(wire.call(ApiKey.PRODUCE, 8, produce(-1, ("idem", 0, second))))
    assert a == b == {("idem", 0): (0, 0)}
    assert c == {("idem", 0): (0, 4)}
    gap = build_batch(
        [b"gap"], producer_id=ids.producer_id, producer_epoch=ids.producer_epoch, base_sequence=9
    )
    d = answers(wire.call(ApiKey.PRODUCE, 8, produce(-1, ("idem", 0, gap))))
    assert d == {("idem", 0): (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)}
    assert values_in(wire, "idem", 0) == [b"once-0", b"once-1", b"once-2", b"once-3", b"twice"]
    wire.close()


def test_many_produce_requests_in_flight_on_one_connection_are_answered_in_order(
    appliance: Appliance,
) -> None:
    wire = client(appliance)
    before = latest(wire, "p", 0)
    sent = [
        wire.send(ApiKey.PRODUCE, 8, produce(1, ("p", 0, build_batch([b"pipelined-%d" % i]))))
        for i in range(50)
    ]
    got = [wire.recv(ApiKey.PRODUCE, 8) for _ in sent]
    assert [cid for cid, _ in got] == sent
    assert [answers(r)[("p", 0)] for _, r in got] == [(0, before + i) for i in range(50)]
    wire.close()


def test_frame_offsets_in_fetch_match_the_acks(appliance: Appliance) -> None:
    wire = client(appliance)
    base = answers(wire.call(ApiKey.PRODUCE, 8, produce(1, ("p", 1, build_batch([b"a", b"b", b"c"])))))[
        ("p", 1)
    ][1]
    request = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[
            FetchTopic("p", [FetchPartition(partition=1, fetch_offset=base, partition_max_bytes=1 << 20)])
        ],
    )
    records = wire.call(ApiKey.FETCH, 11, request).responses[0].partitions[0].records
    assert offsets_in(records)[-3:] == [base, base + 1, base + 2]
    assert struct.unpack_from(">q", bytes(records), 0)[0] <= base
    wire.close()
