"""Codec micro-benchmarks: the per-request work of a broker (decode Fetch/Produce, encode Fetch with file
regions) and of a client (decode Fetch responses).  Run with ``make bench`` or
``pytest bench/test_bench_codec.py --benchmark-enable``.

Each benchmark records partitions (or bytes) per second in ``extra_info``.  The byte-heavy ones also record
their ratio to a plain ``bytes`` copy of the same frame, measured in the same run (the physical floor for
"receive a frame and hand out its record bytes").
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from ipc.kafka import (
    ApiKey,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FileRegion,
    FrameReader,
    PartitionData,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
)

TOPICS = 10
PARTITIONS_PER_TOPIC = 100
PARTITIONS = TOPICS * PARTITIONS_PER_TOPIC
FETCH = RequestHeader(ApiKey.FETCH, 11, 1, "bench")
PRODUCE = RequestHeader(ApiKey.PRODUCE, 8, 1, "bench")


def fetch_request() -> FetchRequest:
    return FetchRequest(
        max_wait_ms=500,
        min_bytes=1,
        topics=[
            FetchTopic(
                f"topic-{t}",
                [FetchPartition(p, 5, 1_000_000 + p, 0, 1 << 20) for p in range(PARTITIONS_PER_TOPIC)],
            )
            for t in range(TOPICS)
        ],
    )


def fetch_response(records: Any) -> FetchResponse:
    return FetchResponse(
        responses=[
            FetchableTopicResponse(
                f"topic-{t}",
                [
                    PartitionData(p, 0, 2_000_000, 2_000_000, 0, None, -1, records(p))
                    for p in range(PARTITIONS_PER_TOPIC)
                ],
            )
            for t in range(TOPICS)
        ]
    )


def copy_seconds(data: bytes, rounds: int = 20) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        bytes(bytearray(data))
        best = min(best, time.perf_counter() - start)
    return best


def test_bench_decode_fetch_request_1000_partitions(benchmark: Any) -> None:
    frame = encode_request(FETCH, fetch_request())[4:]
    result = benchmark(decode_request, frame)
    assert len(result.body.topics) == TOPICS
    benchmark.extra_info["partitions_per_s"] = PARTITIONS / benchmark.stats.stats.median


def test_bench_encode_fetch_response_1000_file_regions(benchmark: Any) -> None:
    body = fetch_response(lambda p: FileRegion(7, p * 65536, 65536))
    parts = benchmark(encode_response_parts, FETCH, body)
    assert len(parts) == 2 * PARTITIONS
    benchmark.extra_info["partitions_per_s"] = PARTITIONS / benchmark.stats.stats.median


def test_bench_decode_fetch_response_1000_partitions_16k_records(benchmark: Any) -> None:
    records = os.urandom(16384)
    frame = encode_response(FETCH, fetch_response(lambda p: records))[4:]
    result = benchmark(decode_response, frame, ApiKey.FETCH, 11)
    assert result.body.responses[0].partitions[0].records == records
    median = benchmark.stats.stats.median
    benchmark.extra_info["partitions_per_s"] = PARTITIONS / median
    benchmark.extra_info["frame_bytes"] = len(frame)
    benchmark.extra_info["ratio_to_copying_the_frame"] = copy_seconds(frame) / median


def test_bench_frame_reader_and_decode_produce_100_partitions_64k(benchmark: Any) -> None:
    """A broker receiving a 6.5 MB Produce request in 64 KiB socket reads, then decoding it."""
    records = os.urandom(65536)
    body = ProduceRequest(
        acks=-1,
        timeout_ms=30000,
        topic_data=[TopicProduceData("events", [PartitionProduceData(p, records) for p in range(100)])],
    )
    frame = encode_request(PRODUCE, body)
    chunks = [frame[i : i + 65536] for i in range(0, len(frame), 65536)]

    def receive_and_decode() -> Any:
        reader = FrameReader()
        for chunk in chunks:
            reader.feed(chunk)
        frame_body = reader.next_frame()
        assert frame_body is not None
        return decode_request(frame_body)

    result = benchmark(receive_and_decode)
    assert result.body.topic_data[0].partition_data[99].records == records
    median = benchmark.stats.stats.median
    benchmark.extra_info["bytes_per_s"] = len(frame) / median
    benchmark.extra_info["ratio_to_copying_the_frame"] = copy_seconds(frame) / median


@pytest.mark.parametrize("partitions", [1, 1000])
def test_bench_encode_fetch_request(benchmark: Any, partitions: int) -> None:
    body = fetch_request()
    if partitions == 1:
        body.topics = [FetchTopic("t", [FetchPartition(0, 5, 0, 0, 1 << 20)])]
    frame = benchmark(encode_request, FETCH, body)
    assert frame
    benchmark.extra_info["requests_per_s"] = 1 / benchmark.stats.stats.median
