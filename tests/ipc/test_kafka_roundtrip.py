"""Round trips: every API, every version, requests and responses, encode -> frame reader -> decode == input.

Values come from hypothesis strategies derived from the schema itself (every field on the wire at that
version gets a strategy covering its whole range, null where allowed).  The main APIs get more examples.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc.kafka import (
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    FrameReader,
    MetadataRequest,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from ipc.kafka.apis import ApiSpec
from ipc.kafka.samples import all_api_versions, random_message
from ipc.kafka.schema import BOOL, BYTES, RECORDS, STRING, Array, Kind, Struct, field_specs

MAIN_APIS = {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.LIST_OFFSETS}
INT_BITS = {"b": 8, "h": 16, "i": 32, "q": 64}


def kind_strategy(kind: Kind, nullable: bool, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    s: st.SearchStrategy[Any]
    if kind is BOOL:
        s = st.booleans()
    elif kind.fmt == "I":
        s = st.integers(0, (1 << 32) - 1)
    elif kind.fmt is not None:
        bits = INT_BITS[kind.fmt]
        s = st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    elif kind is STRING:
        s = st.text(max_size=12)
    elif kind is BYTES or kind is RECORDS:
        s = st.binary(max_size=40)
    elif isinstance(kind, Array):
        element = kind.element
        inner = (
            kind_strategy(element, False, version, flexible)
            if isinstance(element, Kind)
            else struct_strategy(element, version, flexible)
        )
        s = st.lists(inner, max_size=3)
    else:
        raise AssertionError(kind)
    return st.none() | s if nullable else s


def struct_strategy(cls: type[Struct], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    fields = {
        spec.name: kind_strategy(spec.kind, spec.nullable(version), version, flexible)
        for spec in field_specs(cls)
        if spec.present(version) and (spec.tag is None or flexible)
    }
    return st.builds(cls, **fields)


headers = st.builds(
    lambda cid, client: (cid, client),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.none() | st.text(max_size=10),
)

CASES = [(spec, version) for spec, version in all_api_versions()]
CASE_IDS = [f"{spec.name}-v{version}" for spec, version in CASES]


def roundtrip_request(spec: ApiSpec, version: int, body: Struct, cid: int, client: str | None) -> None:
    header = RequestHeader(spec.api_key, version, cid, client)
    frame = encode_request(header, body)
    reader = FrameReader()
    reader.feed(frame)
    frames = reader.frames()
    assert len(frames) == 1 and reader.buffered_bytes == 0
    request = decode_request(frames[0])
    assert request.header == header
    assert request.body == body


def roundtrip_response(spec: ApiSpec, version: int, body: Struct, cid: int) -> None:
    header = RequestHeader(spec.api_key, version, cid, "c")
    frame = encode_response(header, body)
    assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
    response = decode_response(frame[4:], spec.api_key, version)
    assert response.correlation_id == cid
    assert response.body == body


@pytest.mark.parametrize(("spec", "version"), CASES, ids=CASE_IDS)
def test_every_api_and_version_round_trips(spec: ApiSpec, version: int) -> None:
    flexible = spec.is_flexible(version)
    examples = 40 if spec.api_key in MAIN_APIS else 12

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        request=struct_strategy(spec.request, version, flexible),
        response=struct_strategy(spec.response, version, flexible),
        header=headers,
    )
    def check(request: Struct, response: Struct, header: tuple[int, str | None]) -> None:
        cid, client = header
        roundtrip_request(spec, version, request, cid, client)
        if spec.api_key == ApiKey.API_VERSIONS and getattr(response, "error_code", 0) == 35:
            response.error_code = 0  # an UNSUPPORTED_VERSION answer is always read as v0: tested apart
        roundtrip_response(spec, version, response, cid)

    check()


@pytest.mark.parametrize(("spec", "version"), CASES, ids=CASE_IDS)
def test_seeded_edge_values_round_trip(spec: ApiSpec, version: int) -> None:
    """Values at the edges (min/max ints, -1, nulls, non-ASCII) from the seeded sample generator."""
    rng = random.Random(f"{spec.api_key}-{version}")
    flexible = spec.is_flexible(version)
    for _ in range(20):
        request = random_message(spec.request, version, flexible, rng)
        roundtrip_request(spec, version, request, rng.getrandbits(31), "x")
        response = random_message(spec.response, version, flexible, rng)
        if spec.api_key == ApiKey.API_VERSIONS:
            response.error_code = 0
        roundtrip_response(spec, version, response, rng.getrandbits(31))


def test_fields_absent_from_a_version_decode_to_their_defaults() -> None:
    body = FetchRequest(
        max_wait_ms=100,
        min_bytes=1,
        isolation_level=1,
        session_id=9,
        rack_id="rack-a",
        topics=[
            FetchTopic(
                "t",
                [
                    FetchPartition(
                        0, current_leader_epoch=7, fetch_offset=5, log_start_offset=3, partition_max_bytes=100
                    )
                ],
            )
        ],
    )
    v4 = decode_request(encode_request(RequestHeader(ApiKey.FETCH, 4, 1, None), body)[4:]).body
    assert (v4.isolation_level, v4.session_id, v4.rack_id) == (1, 0, "")  # isolation 4+, session 7+, rack 11+
    part = v4.topics[0].partitions[0]
    assert (part.current_leader_epoch, part.fetch_offset, part.log_start_offset) == (-1, 5, -1)
    v11 = decode_request(encode_request(RequestHeader(ApiKey.FETCH, 11, 1, None), body)[4:]).body
    assert v11 == body


def test_metadata_null_topics_means_all_and_empty_means_none() -> None:
    for topics in (None, []):
        frame = encode_request(RequestHeader(ApiKey.METADATA, 8, 1, "c"), MetadataRequest(topics=topics))
        assert decode_request(frame[4:]).body.topics == topics


def test_produce_records_decode_as_views_into_the_frame_without_copying() -> None:
    records = bytes(range(256)) * 64
    body = ProduceRequest(
        acks=-1, timeout_ms=1000, topic_data=[TopicProduceData("t", [PartitionProduceData(0, records)])]
    )
    frame = encode_request(RequestHeader(ApiKey.PRODUCE, 8, 1, "c"), body)[4:]
    decoded = decode_request(frame).body.topic_data[0].partition_data[0].records
    assert isinstance(decoded, memoryview)
    assert decoded.obj is frame  # a slice of the frame, not a copy
    assert decoded == records
