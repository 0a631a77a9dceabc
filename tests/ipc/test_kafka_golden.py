"""Golden bytes: our codec against kafka-python 3.0.12, an implementation nobody here wrote.

kafka-python generates its request/response classes from Kafka's own JSON message definitions.  For every
API and version we speak (ApiVersions v0-v3, Metadata, Produce, Fetch, ListOffsets and all the others), with
seeded values at the edges of each field:

* the frames we encode are byte-for-byte the frames kafka-python encodes from the same values;
* kafka-python decodes our frames to the same values, and we decode kafka-python's frames to the same values.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest

with warnings.catch_warnings():
    # kafka-python 3.0.12 loads its JSON schemas with importlib.resources.read_text, deprecated since 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.protocol.admin as kp_admin
    import kafka.protocol.consumer as kp_consumer
    import kafka.protocol.metadata as kp_metadata
    import kafka.protocol.producer as kp_producer
    import kafka.protocol.sasl as kp_sasl

from ipc.kafka import (
    ApiKey,
    ApiVersionsResponse,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    maybe_unsupported_version_reply,
    supported_api_versions,
)
from ipc.kafka.apis import ApiSpec
from ipc.kafka.errors import UnsupportedVersionError
from ipc.kafka.samples import all_api_versions, random_message
from ipc.kafka.schema import Array, Kind, Struct, present_fields

KP_MODULES = (kp_metadata, kp_producer, kp_consumer, kp_admin, kp_sasl)
SAMPLES_PER_VERSION = 10


def kp_class(name: str) -> Any:
    for module in KP_MODULES:
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


# kafka-python renames Metadata's authorized-operations int32 fields and holds them as a set of bit numbers
# (None for INT32_MIN, Kafka's "not requested"); we keep Kafka's names and the int32.
# DescribeGroups' per-group field has Kafka's name and kafka-python's set the same way.
KP_RENAMED = {
    "cluster_authorized_operations": "authorized_operations",
    "topic_authorized_operations": "authorized_operations",
    "authorized_operations": "authorized_operations",
}


def bits_to_kp(value: int) -> set[int] | None:
    if value == -(1 << 31):
        return None
    return {bit for bit in range(32) if (value & 0xFFFFFFFF) >> bit & 1}


def bits_from_kp(bits: set[int] | None) -> int:
    raw = sum(1 << bit for bit in (bits if bits is not None else {31}))
    return raw - (1 << 32) if raw >= 1 << 31 else raw


def is_struct_array(kind: Kind) -> bool:
    return isinstance(kind, Array) and not isinstance(kind.element, Kind)


def to_kp(kp_cls: Any, obj: Struct, version: int, flexible: bool, top: bool = True) -> Any:
    """Build the kafka-python object holding the same values as ``obj``."""
    kp_fields = kp_cls.fields
    kwargs = {}
    for spec in present_fields(type(obj), version, flexible):
        value = getattr(obj, spec.name)
        if spec.tag is not None and value == spec.make_default():
            continue  # an unset tagged field is not written, by either side
        if is_struct_array(spec.kind) and value is not None:
            value = [to_kp(kp_fields[spec.name].data_class, item, version, flexible, False) for item in value]
        elif isinstance(value, memoryview):
            value = bytes(value)
        elif spec.name in KP_RENAMED:
            value = bits_to_kp(value)
        kwargs[KP_RENAMED.get(spec.name, spec.name)] = value
    return kp_cls[version](**kwargs) if top else kp_cls(**kwargs)


def our_dict(obj: Struct, version: int, flexible: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in present_fields(type(obj), version, flexible):
        value = getattr(obj, spec.name)
        if is_struct_array(spec.kind) and value is not None:
            value = [our_dict(item, version, flexible) for item in value]
        elif isinstance(value, memoryview | bytearray):
            value = bytes(value)
        out[spec.name] = value
    return out


def kp_dict(kp_obj: Any, version: int, nested: bool = False) -> dict[str, Any]:
    """kafka-python's values for the fields present at ``version`` (its own ``to_dict`` does not filter
    nested structs by version)."""
    out: dict[str, Any] = {}
    for field in kp_obj.fields.values():
        if not field.for_version_q(version):
            continue
        value = getattr(kp_obj, field.name)
        name = field.name
        if field.is_struct_array() and value is not None:
            value = [kp_dict(item, version, nested=True) for item in value]
        elif name == "authorized_operations":
            if type(kp_obj).__name__.startswith("Metadata"):
                name = "topic_authorized_operations" if nested else "cluster_authorized_operations"
            value = bits_from_kp(value)
        out[name] = value
    return out


CASES = [(spec, version) for spec, version in all_api_versions() if spec.advertised]  # Kafka's APIs only
CASE_IDS = [f"{spec.name}-v{version}" for spec, version in CASES]


@pytest.mark.parametrize(("spec", "version"), CASES, ids=CASE_IDS)
def test_requests_match_kafka_python_both_ways(spec: ApiSpec, version: int) -> None:
    rng = random.Random(f"golden-request-{spec.api_key}-{version}")
    flexible = spec.is_flexible(version)
    kp_cls = kp_class(spec.request.__name__)
    for _ in range(SAMPLES_PER_VERSION):
        body = random_message(spec.request, version, flexible, rng)
        client_id = rng.choice(["kafka-python", "", "é"])
        header = RequestHeader(spec.api_key, version, rng.getrandbits(31), client_id)
        ours = encode_request(header, body)

        theirs_obj = to_kp(kp_cls, body, version, flexible)
        theirs_obj.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
        theirs = bytes(theirs_obj.encode(header=True, framed=True))
        assert ours == theirs, f"{spec.name} v{version}: our bytes differ from kafka-python's"

        # kafka-python reads our frame ...
        decoded_by_them = kp_cls.decode(ours, version=version, header=True, framed=True)
        assert kp_dict(decoded_by_them, version) == our_dict(body, version, flexible)
        assert decoded_by_them.header.correlation_id == header.correlation_id
        # ... and we read theirs.
        request = decode_request(theirs[4:])
        assert request.header == header
        assert our_dict(request.body, version, flexible) == kp_dict(theirs_obj, version)


@pytest.mark.parametrize(("spec", "version"), CASES, ids=CASE_IDS)
def test_responses_match_kafka_python_both_ways(spec: ApiSpec, version: int) -> None:
    rng = random.Random(f"golden-response-{spec.api_key}-{version}")
    flexible = spec.is_flexible(version)
    kp_cls = kp_class(spec.response.__name__)
    for _ in range(SAMPLES_PER_VERSION):
        body = random_message(spec.response, version, flexible, rng)
        if spec.api_key == ApiKey.API_VERSIONS:
            body.error_code = 0  # kafka-python reads any error as v0; the error reply is tested below
        header = RequestHeader(spec.api_key, version, rng.getrandbits(31), "c")
        ours = encode_response(header, body)

        theirs_obj = to_kp(kp_cls, body, version, flexible)
        theirs_obj.with_header(correlation_id=header.correlation_id)
        theirs = bytes(theirs_obj.encode(header=True, framed=True))
        assert ours == theirs, f"{spec.name} v{version}: our bytes differ from kafka-python's"

        decoded_by_them = kp_cls.decode(ours, version=version, header=True, framed=True)
        assert kp_dict(decoded_by_them, version) == our_dict(body, version, flexible)
        response = decode_response(theirs[4:], spec.api_key, version)
        assert response.correlation_id == header.correlation_id
        assert our_dict(response.body, version, flexible) == kp_dict(theirs_obj, version)


def test_api_versions_v3_response_header_has_no_tagged_fields() -> None:
    body = ApiVersionsResponse(error_code=0, api_keys=supported_api_versions(), throttle_time_ms=0)
    frame = encode_response(RequestHeader(ApiKey.API_VERSIONS, 3, 0x01020304, "c"), body)
    # size, correlation id, then straight into the body: error_code 0, compact array of 18 + 1 entries.
    assert frame[4:8] == b"\x01\x02\x03\x04"
    assert frame[8:11] == b"\x00\x00" + bytes([len(body.api_keys) + 1])
    kp_response = kp_metadata.ApiVersionsResponse.decode(frame, version=3, header=True, framed=True)
    assert [(a.api_key, a.min_version, a.max_version) for a in kp_response.api_keys] == [
        (a.api_key, a.min_version, a.max_version) for a in body.api_keys
    ]


@pytest.mark.parametrize("asked_version", [4, 5, 127])
def test_unsupported_api_versions_gets_a_v0_reply_kafka_python_understands(asked_version: int) -> None:
    """kafka-python probes with ApiVersions v4 (flexible header v2); we answer v0 UNSUPPORTED_VERSION listing
    what we speak, and it learns our maximum (3) from the reply, as its connection code does."""
    probe = kp_metadata.ApiVersionsRequest[4](client_software_name="kp", client_software_version="3")
    probe.with_header(correlation_id=77, client_id="kp")
    frame = bytes(probe.encode(header=True, framed=True))
    frame = frame[:6] + asked_version.to_bytes(2, "big") + frame[8:]
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(frame[4:])
    assert info.value.header == RequestHeader(ApiKey.API_VERSIONS, asked_version, 77, "kp")
    reply = maybe_unsupported_version_reply(info.value)
    assert reply is not None
    theirs = kp_metadata.ApiVersionsResponse.decode(reply, version=4, header=True, framed=True)
    assert theirs.error_code == 35
    assert theirs.header.correlation_id == 77
    by_key = {a.api_key: a.max_version for a in theirs.api_keys}
    assert by_key[ApiKey.API_VERSIONS] == 3
    ours = decode_response(reply[4:], ApiKey.API_VERSIONS, 3)
    assert ours.body.error_code == 35 and ours.body.api_keys == supported_api_versions()
