"""Seeded sample messages and malformed variants of them: a corpus for tests and fuzzers.

Everything is driven by the schema, so every API and version gets samples without per-message code, and
everything is driven by a caller's ``random.Random``, so a failure is reproduced from its seed.  No I/O.

* :func:`random_message` -- a valid message of a struct class at a version, with values at the edges of
  each field's kind (min, max, -1, 0, null where allowed, non-ASCII strings, empty and non-empty arrays).
* :func:`sample_requests` / :func:`sample_responses` -- one valid frame (size prefix included) per API and
  version we speak; by default only the advertised APIs (those a broker answers), with
  ``advertised_only=False`` every API the codec speaks.
* :func:`mutate` -- a malformed variant of a frame body: truncated, bit-flipped, overwritten with random
  bytes or with absurd lengths, spliced, or with trailing bytes.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from ipc.kafka.apis import APIS, ApiSpec
from ipc.kafka.codec import encode_request, encode_response
from ipc.kafka.framing import RequestHeader
from ipc.kafka.schema import BOOL, BYTES, RECORDS, STRING, Array, Kind, Struct, field_specs

__all__ = [
    "Sample",
    "all_api_versions",
    "mutate",
    "random_message",
    "sample_requests",
    "sample_responses",
]

_INT_RANGES = {"b": 8, "h": 16, "i": 32, "q": 64}
_TEXT = ["", "a", "topic-1", "é", "日本語", "\U0001f600", "x" * 40, "__consumer_offsets", "a.b_c-d"]


class Sample(NamedTuple):
    """A valid frame and what it encodes."""

    spec: ApiSpec
    version: int
    header: RequestHeader
    body: Struct
    frame: bytes  # size prefix included


def all_api_versions(*, advertised_only: bool = False) -> list[tuple[ApiSpec, int]]:
    """Every (API, version) this codec speaks (or only the advertised APIs'), by api key then version."""
    return [
        (spec, version)
        for spec in sorted(APIS.values(), key=lambda s: s.api_key)
        if spec.advertised or not advertised_only
        for version in range(spec.min_version, spec.max_version + 1)
    ]


def _random_int(fmt: str, rng: random.Random) -> int:
    if fmt == "I":
        return rng.choice([0, 1, 0xFFFFFFFF, rng.randrange(1 << 32)])
    bits = _INT_RANGES[fmt]
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return rng.choice([lo, hi, -1, 0, 1, rng.randint(lo, hi), rng.randint(0, min(hi, 1000))])


def _random_value(kind: Kind, nullable: bool, version: int, flexible: bool, rng: random.Random,
                  depth: int) -> Any:
    if nullable and rng.random() < 0.2:
        return None
    if kind is BOOL:
        return rng.random() < 0.5
    if kind.fmt is not None:
        return _random_int(kind.fmt, rng)
    if kind is STRING:
        return rng.choice(_TEXT)
    if kind is BYTES or kind is RECORDS:
        return rng.randbytes(rng.choice([0, 1, 7, rng.randrange(200)]))
    if isinstance(kind, Array):
        n = rng.choice([0, 1, 2, 3]) if depth < 3 else rng.choice([0, 1])
        element = kind.element
        if isinstance(element, Kind):
            return [_random_value(element, False, version, flexible, rng, depth + 1) for _ in range(n)]
        return [random_message(element, version, flexible, rng, depth + 1) for _ in range(n)]
    raise AssertionError(f"no sample for kind {kind!r}")


def random_message(
    cls: type[Struct], version: int, flexible: bool, rng: random.Random, depth: int = 0
) -> Any:
    """A valid ``cls`` for ``version``: fields on the wire get random values, the others their defaults."""
    kwargs = {}
    for spec in field_specs(cls):
        if spec.present(version) and (spec.tag is None or flexible):
            nullable = spec.nullable(version)
            kwargs[spec.name] = _random_value(spec.kind, nullable, version, flexible, rng, depth)
    return cls(**kwargs)


def _header(spec: ApiSpec, version: int, rng: random.Random) -> RequestHeader:
    client_id = rng.choice([None, "", "appliance-test", "é"])
    return RequestHeader(spec.api_key, version, rng.randint(-(1 << 31), (1 << 31) - 1), client_id)


def sample_requests(rng: random.Random, *, advertised_only: bool = True) -> list[Sample]:
    """One valid request frame per API and version (of the advertised APIs only, by default)."""
    out = []
    for spec, version in all_api_versions(advertised_only=advertised_only):
        body = random_message(spec.request, version, spec.is_flexible(version), rng)
        header = _header(spec, version, rng)
        out.append(Sample(spec, version, header, body, encode_request(header, body)))
    return out


def sample_responses(rng: random.Random, *, advertised_only: bool = True) -> list[Sample]:
    """One valid response frame per API and version (the header is the request's it answers)."""
    out = []
    for spec, version in all_api_versions(advertised_only=advertised_only):
        body = random_message(spec.response, version, spec.is_flexible(version), rng)
        header = _header(spec, version, rng)
        out.append(Sample(spec, version, header, body, encode_response(header, body)))
    return out


# Lengths no honest frame holds: int32 max/min, -2, int16 extremes, over-long and overflowing varints.
_ABSURD = [
    b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00", b"\xff\xff", b"\x7f\xff", b"\x80\x00",
    b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x00\x10\x00\x00",
]


def mutate(body: bytes, rng: random.Random) -> bytes:
    """A variant of a frame body (no size prefix) that is very likely malformed."""
    data = bytearray(body)
    n = len(data)
    kind = rng.randrange(8)
    if kind == 0 and n:  # truncate
        del data[rng.randrange(n):]
    elif kind == 1 and n:  # flip 1-8 bits
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif kind == 2 and n:  # overwrite a few bytes with random ones
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(n)] = rng.randrange(256)
    elif kind == 3 and n:  # an absurd length or count somewhere
        value = rng.choice(_ABSURD)
        at = rng.randrange(n)
        data[at : at + len(value)] = value
    elif kind == 4:  # trailing bytes
        data += rng.randbytes(rng.randint(1, 8))
    elif kind == 5 and n:  # delete or duplicate a slice
        a = rng.randrange(n)
        b = min(n, a + rng.randint(1, 16))
        if rng.random() < 0.5:
            del data[a:b]
        else:
            data[a:a] = data[a:b]
    elif kind == 6:  # random bytes, keeping the header's api key and version most of the time
        keep = data[:4] if rng.random() < 0.8 else b""
        data = bytearray(keep + rng.randbytes(rng.randrange(64)))
    else:  # a random header in front of the rest
        data[:4] = rng.randbytes(4)
    return bytes(data)
