"""A follower's Fetch encoded once and patched, and the fixed part of its answers read without the codec's
decode: both must give exactly what the codec gives (``replicas.leader_connection``: ``send_follower_fetch``,
``_AnswerShape``).

The requests are checked as the peer decodes them; the answers' fixed parts against
``ipc.kafka.decode_response`` for clean answers of any values, and for answers of other shapes (errors, a
session, aborted transactions, two partitions, another correlation id), which must be left to the codec.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_leader_connection import api_versions, connect, scripted_leader

from ipc.kafka import (
    AbortedTransaction,
    ApiKey,
    FetchableTopicResponse,
    FetchResponse,
    PartitionData,
    Request,
    RequestHeader,
    decode_response,
    encode_response,
)
from replicas.leader_connection import FollowerFetch, _AnswerShape

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
TOPICS = st.text(alphabet="abcxyz0189._-", min_size=1, max_size=40)


def records_of(n: int) -> bytes:
    return bytes(range(256)) * (n // 256) + bytes(n % 256)


@settings(max_examples=40, deadline=None)
@given(topic=TOPICS, partition=st.integers(0, 1 << 20), epoch=INT32, max_bytes=st.integers(1, (1 << 31) - 1),
       offsets=st.lists(st.tuples(INT64, INT64), min_size=1, max_size=4))
def test_a_patched_follower_fetch_is_the_codecs_encoding(
    topic: str, partition: int, epoch: int, max_bytes: int, offsets: list[tuple[int, int]],
) -> None:
    fetch = FollowerFetch(replica_id=7, topic=topic, partition=partition, current_leader_epoch=epoch,
                          max_wait_ms=500, min_bytes=1, max_bytes=max_bytes)
    seen: list[Request] = []

    def answer(request: Request) -> bytes:
        seen.append(request)
        data = PartitionData(partition_index=partition, error_code=0, high_watermark=3, last_stable_offset=3,
                             log_start_offset=0, records=b"")
        answer = FetchResponse(responses=[FetchableTopicResponse(topic, [data])])
        return encode_response(request.header, answer)

    with scripted_leader(api_versions, *[answer] * len(offsets)) as address, connect(address) as conn:
        sent = [conn.send_follower_fetch(fetch, offset, log_start) for offset, log_start in offsets]
        for one in sent:
            answer_, streamed = conn.receive_fetch(one, lambda view, final: len(view))
            assert answer_.responses[0].partitions[0].high_watermark == 3 and not streamed  # no records
        version = conn.version_for(ApiKey.FETCH)
        client_id = conn.client_id
    assert len(seen) == len(offsets)
    for request, one, (fetch_offset, log_start) in zip(seen, sent, offsets, strict=True):
        expected = fetch.request(fetch_offset, log_start)
        assert request.header == RequestHeader(ApiKey.FETCH, version, one.correlation_id, client_id)
        assert request.body == expected


def clean_answer(topic: str, partition: int, values: tuple[int, int, int, int]) -> FetchResponse:
    throttle_ms, high_watermark, last_stable, log_start = values
    return FetchResponse(throttle_time_ms=throttle_ms, error_code=0, session_id=0, responses=[
        FetchableTopicResponse(topic, [PartitionData(
            partition_index=partition, error_code=0, high_watermark=high_watermark,
            last_stable_offset=last_stable, log_start_offset=log_start, records=b"")])])


def prefix_of(answer: FetchResponse, correlation_id: int, version: int, records_bytes: int) -> bytes:
    """The answer's frame up to its records (after the size prefix), its records' length as given."""
    answer.responses[0].partitions[0].records = records_of(records_bytes)
    frame = encode_response(RequestHeader(ApiKey.FETCH, version, correlation_id, "x"), answer)
    return frame[4:len(frame) - records_bytes]


def decoded(prefix: bytes, version: int) -> Any:
    patched = bytearray(prefix)
    patched[-4:] = b"\0\0\0\0"
    return decode_response(memoryview(patched), ApiKey.FETCH, version)


@settings(max_examples=150, deadline=None)
@given(version=st.integers(4, 11), topic=TOPICS, partition=st.integers(0, (1 << 31) - 1),
       correlation_id=st.integers(0, (1 << 31) - 1), values=st.tuples(INT32, INT64, INT64, INT64),
       records_bytes=st.integers(0, 300))
def test_a_clean_answers_fixed_part_reads_as_the_codec_decodes_it(version: int, topic: str, partition: int,
                                                                  correlation_id: int,
                                                                  values: tuple[int, int, int, int],
                                                                  records_bytes: int) -> None:
    shape = _AnswerShape(version, topic, partition, "x")
    prefix = prefix_of(clean_answer(topic, partition, values), correlation_id, version, records_bytes)
    assert len(prefix) == shape.prefix_bytes
    fast = shape.parse(memoryview(prefix), correlation_id)
    if version < 5 or shape.layout is None:  # no log_start_offset field, or a value equal to a marker
        assert fast is None  # (found twice, so the shape cannot tell the fields apart): left to the codec
        return
    head = decoded(prefix, version)
    assert head.correlation_id == correlation_id
    head.body.responses[0].partitions[0].records = b""
    assert fast == head.body
    assert shape.parse(memoryview(prefix), correlation_id + 1) is None  # another request's answer


def other_shapes(topic: str, partition: int) -> list[FetchResponse]:
    values = (0, 10, 10, 0)
    error = clean_answer(topic, partition, values)
    error.error_code = 7
    partition_error = clean_answer(topic, partition, values)
    partition_error.responses[0].partitions[0].error_code = 1
    session = clean_answer(topic, partition, values)
    session.session_id = 5
    aborted = clean_answer(topic, partition, values)
    aborted.responses[0].partitions[0].aborted_transactions = [AbortedTransaction(1, 2)]
    no_aborted = clean_answer(topic, partition, values)
    no_aborted.responses[0].partitions[0].aborted_transactions = []
    replica = clean_answer(topic, partition, values)
    replica.responses[0].partitions[0].preferred_read_replica = 2
    other_partition = clean_answer(topic, partition + 1, values)
    other_topic = clean_answer(topic + "x", partition, values)
    two = clean_answer(topic, partition, values)
    two.responses[0].partitions.append(clean_answer(topic, partition + 1, values).responses[0].partitions[0])
    return [error, partition_error, session, aborted, no_aborted, replica, other_partition, other_topic, two]


@settings(max_examples=60, deadline=None)
@given(version=st.integers(5, 11), topic=TOPICS, partition=st.integers(0, 1000), which=st.integers(0, 8),
       cut=st.integers(-8, 8))
def test_answers_of_another_shape_are_left_to_the_codec(version: int, topic: str, partition: int, which: int,
                                                        cut: int) -> None:
    shape = _AnswerShape(version, topic, partition, "x")
    prefix = prefix_of(other_shapes(topic, partition)[which], 9, version, 100)
    if version < 7 and which in (0, 2):  # no top-level error code or session id before v7: a clean answer
        return
    if version < 11 and which == 5:  # no preferred_read_replica before v11
        return
    assert shape.parse(memoryview(prefix), 9) is None
    if cut:  # a fixed part of another length, at either end
        wrong = prefix[:cut] if cut < 0 else prefix + bytes(cut)
        assert shape.parse(memoryview(wrong), 9) is None
