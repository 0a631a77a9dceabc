"""Fuzzing: malformed frames against the codec.  Only ProtocolError (and its subclasses) may come out.

A seeded mutator (ipc.kafka.samples.mutate: truncation, bit flips, random bytes, absurd lengths, spliced
slices, trailing bytes, random headers) runs over valid frames of every API and version: 100,000 malformed
requests and 30,000 malformed responses.  Whatever the decoder accepts must be a real message: it re-encodes
and decodes to the same value.  Hypothesis adds raw garbage behind valid and invalid headers.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.kafka import (
    FrameReader,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from ipc.kafka.samples import all_api_versions, mutate, sample_requests, sample_responses
from storage.errors import ProtocolError

MALFORMED_REQUESTS = 100_000
MALFORMED_RESPONSES = 30_000


def request_corpus() -> list[bytes]:
    rngs = [random.Random(seed) for seed in range(4)]
    return [s.frame[4:] for rng in rngs for s in sample_requests(rng, advertised_only=False)]


def test_100k_malformed_requests_raise_only_protocol_error() -> None:
    corpus = request_corpus()
    rng = random.Random(0x4B41464B41)
    outcomes: Counter[str] = Counter()
    for i in range(MALFORMED_REQUESTS):
        data = mutate(rng.choice(corpus), rng)
        try:
            request = decode_request(data)
        except ProtocolError as e:
            outcomes[type(e).__name__] += 1
            continue
        except Exception as e:  # anything else is a codec bug: show the input that caused it
            raise AssertionError(f"iteration {i}: {type(e).__name__}: {e}; input {data.hex()}") from e
        # Accepted (a mutation can land on a value field): it must be a real request.
        again = decode_request(encode_request(request.header, request.body)[4:])
        assert again == request, f"iteration {i}: accepted input does not round-trip: {data.hex()}"
        outcomes["accepted"] += 1
    rejected = MALFORMED_REQUESTS - outcomes["accepted"]
    assert rejected > MALFORMED_REQUESTS // 2, outcomes
    assert (
        outcomes["UnknownApiKeyError"] and outcomes["UnsupportedVersionError"] and outcomes["ProtocolError"]
    )


def test_30k_malformed_responses_raise_only_protocol_error() -> None:
    samples = [
        s for seed in range(3) for s in sample_responses(random.Random(seed), advertised_only=False)
    ]
    rng = random.Random(0x5245)
    accepted = 0
    for i in range(MALFORMED_RESPONSES):
        sample = rng.choice(samples)
        data = mutate(sample.frame[4:], rng)
        try:
            response = decode_response(data, sample.spec.api_key, sample.version)
        except ProtocolError:
            continue
        except Exception as e:
            raise AssertionError(f"iteration {i}: {type(e).__name__}: {e}; input {data.hex()}") from e
        header = RequestHeader(sample.spec.api_key, sample.version, response.correlation_id)
        if sample.spec.name != "ApiVersions":  # an ApiVersions error answer re-reads as v0, checked elsewhere
            again = decode_response(
                encode_response(header, response.body)[4:], sample.spec.api_key, sample.version
            )
            assert again == response, f"iteration {i}: accepted input does not round-trip: {data.hex()}"
        accepted += 1
    assert accepted < MALFORMED_RESPONSES // 2


def test_frame_reader_meets_garbage_streams() -> None:
    """Random streams cut in random chunks, through a reader with a small limit: frames or ProtocolError."""
    corpus = request_corpus()
    rng = random.Random(7)
    for _ in range(2_000):
        stream = b"".join(
            rng.choice(corpus) if rng.random() < 0.5 else rng.randbytes(rng.randrange(12))
            for _ in range(rng.randint(1, 4))
        )
        reader = FrameReader(max_frame_bytes=rng.choice([16, 300, 5000]))
        try:
            position = 0
            while position < len(stream):
                step = rng.randint(1, 64)
                reader.feed(stream[position : position + step])
                position += step
                for frame in reader.frames():
                    try:
                        decode_request(frame)
                    except ProtocolError:
                        pass
        except ProtocolError:
            with pytest.raises(ProtocolError):  # a broken stream stays broken
                reader.next_frame()


VALID_PREFIXES = [
    spec.api_key.to_bytes(2, "big") + version.to_bytes(2, "big") for spec, version in all_api_versions()
]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    try:
        decode_request(data)
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(VALID_PREFIXES), st.binary(max_size=300))
def test_random_bodies_behind_valid_headers_raise_only_protocol_error(prefix: bytes, rest: bytes) -> None:
    try:
        decode_request(prefix + rest)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(all_api_versions()), st.binary(max_size=300))
def test_random_response_bodies_raise_only_protocol_error(case: tuple, data: bytes) -> None:  # type: ignore[type-arg]
    spec, version = case
    try:
        decode_response(data, spec.api_key, version)
    except ProtocolError:
        pass
