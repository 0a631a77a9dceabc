"""The codec's front door: whole requests and responses to and from bytes.

Encoders return complete frames, size prefix included, ready for ``sendall``.  Decoders take a frame *body*
(what :class:`~ipc.kafka.framing.FrameReader` returns, without the size prefix), must consume it exactly,
and raise only :class:`ProtocolError` (or its subclasses from :mod:`ipc.kafka.errors`).

Broker side::

    request = decode_request(frame)              # Request(header, body)
    ...
    parts = encode_response_parts(request.header, FetchResponse(...))   # bytes and FileRegion parts

Client side::

    frame = encode_request(RequestHeader(ApiKey.FETCH, 11, correlation_id, "me"), FetchRequest(...))
    ...
    response = decode_response(frame_body, ApiKey.FETCH, 11)            # Response(correlation_id, body)

Unknown API key: :class:`UnknownApiKeyError` -- close the connection (Kafka does).  Unsupported version of
a known API: :class:`UnsupportedVersionError` -- send :func:`maybe_unsupported_version_reply` if it returns
bytes (ApiVersions), otherwise close the connection (Kafka does).  Any other :class:`ProtocolError`: the
frame is malformed; close the connection.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from ipc.kafka import primitives as p
from ipc.kafka.apis import APIS, ApiKey, ApiSpec, api_for_request, api_for_response, supported_api_versions
from ipc.kafka.errors import ErrorCode, UnsupportedVersionError
from ipc.kafka.framing import (
    SIZE_PREFIX,
    RequestHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
)
from ipc.kafka.messages import ApiVersionsResponse
from ipc.kafka.regions import FileRegion
from ipc.kafka.schema import Struct, Writer, decoder_for, encoder_for
from storage.errors import ProtocolError

__all__ = [
    "BytesLike",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "frame_size",
    "maybe_unsupported_version_reply",
    "peek_correlation_id",
]

BytesLike = bytes | bytearray | memoryview

# What a decoder may meet on malformed input besides its own ProtocolError: translated, never let out.
_MALFORMED = (struct.error, ValueError, IndexError, OverflowError)


class Request(NamedTuple):
    header: RequestHeader
    body: Any  # the API's request dataclass, e.g. FetchRequest


class Response(NamedTuple):
    correlation_id: int
    body: Any  # the API's response dataclass, e.g. FetchResponse


def _view(data: BytesLike) -> memoryview:
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _decode_body(cls: type[Struct], mv: memoryview, pos: int, version: int, flexible: bool, what: str) -> Any:
    try:
        body, end = decoder_for(cls, version, flexible)(mv, pos)
    except ProtocolError as e:
        raise ProtocolError(f"{what}: {e}") from None
    except _MALFORMED as e:
        raise ProtocolError(f"{what}: malformed body ({type(e).__name__}: {e})") from None
    if end != len(mv):
        raise ProtocolError(f"{what}: {len(mv) - end} trailing bytes after the body ends at position {end}")
    return body


# -- requests --------------------------------------------------------------------------------------------


def decode_request(frame: BytesLike) -> Request:
    """Decode one request frame body.  ``records`` fields are views into ``frame``."""
    mv = _view(frame)
    header, pos = decode_request_header(mv)
    spec = APIS[header.api_key]
    version = header.api_version
    if not spec.supports(version):
        raise UnsupportedVersionError(
            f"{spec.name} v{version} is not supported (we speak v{spec.min_version}-v{spec.max_version}; "
            f"correlation id {header.correlation_id}, client {header.client_id!r})",
            header=header,
        )
    what = f"{spec.name} v{version} request (correlation id {header.correlation_id})"
    return Request(header, _decode_body(spec.request, mv, pos, version, spec.is_flexible(version), what))


def encode_request(header: RequestHeader, body: Struct) -> bytes:
    """One request frame (size prefix included).  ``header.api_key`` must match the body's API."""
    spec = api_for_request(body)
    _check(spec, header.api_key, header.api_version)
    w = Writer()
    w.buf += b"\0\0\0\0"
    encode_request_header(w.buf, header)
    encoder_for(spec.request, header.api_version, spec.is_flexible(header.api_version))(w, body)
    return _join(_finish(w.all_parts()))


# -- responses -------------------------------------------------------------------------------------------


def encode_response_parts(header: RequestHeader, body: Struct) -> list[bytes | FileRegion]:
    """The response to the request whose header is ``header``, as parts to send in order: ``bytes`` parts
    (send them) and :class:`FileRegion` parts (``os.sendfile`` them).  The first part starts with the frame's
    size prefix, which counts every region's ``size``.  Record ``bytes`` of 64 KiB or more become their own
    part without being copied."""
    spec = api_for_response(body)
    _check(spec, header.api_key, header.api_version)
    version = header.api_version
    w = Writer()
    w.buf += b"\0\0\0\0"
    encode_response_header(w.buf, header.correlation_id, spec.response_header_version(version))
    encoder_for(spec.response, version, spec.is_flexible(version))(w, body)
    return _finish(w.all_parts())


def encode_response(header: RequestHeader, body: Struct) -> bytes:
    """The response as one frame of bytes (size prefix included).  Records must be bytes, not FileRegions."""
    return _join(encode_response_parts(header, body))


def decode_response(frame: BytesLike, api_key: int, api_version: int) -> Response:
    """Decode one response frame body, knowing which request (API and version) it answers.

    ApiVersions: an UNSUPPORTED_VERSION answer is always in the v0 layout whatever version was asked (the
    broker did not speak it), so it is decoded as v0.
    """
    spec = APIS.get(api_key)
    if spec is None or not spec.supports(api_version):
        raise ValueError(f"api key {api_key} version {api_version} is not one this codec speaks")
    mv = _view(frame)
    what = f"{spec.name} v{api_version} response"
    correlation_id, pos = _decode_response_header(mv, spec.response_header_version(api_version), what)
    version = api_version
    if api_key == ApiKey.API_VERSIONS and _peek_error_code(mv, pos) == ErrorCode.UNSUPPORTED_VERSION:
        version = 0
    what = f"{spec.name} v{version} response (correlation id {correlation_id})"
    body = _decode_body(spec.response, mv, pos, version, spec.is_flexible(version), what)
    return Response(correlation_id, body)


def _decode_response_header(mv: memoryview, header_version: int, what: str) -> tuple[int, int]:
    try:
        return decode_response_header(mv, header_version)
    except ProtocolError as e:
        raise ProtocolError(f"{what} header: {e}") from None


def _peek_error_code(mv: memoryview, pos: int) -> int | None:
    if pos + 2 > len(mv):
        return None
    return int(p.INT16.unpack_from(mv, pos)[0])


def peek_correlation_id(frame: BytesLike) -> int:
    """The correlation id of a response frame body (its first 4 bytes, in every header version)."""
    mv = _view(frame)
    correlation_id, _ = p.read_int32(mv, 0)
    return correlation_id


def maybe_unsupported_version_reply(error: UnsupportedVersionError) -> bytes | None:
    """What to send for an unsupported version: the framed ApiVersions v0 reply with UNSUPPORTED_VERSION
    and our supported versions when the request was ApiVersions, else ``None`` (close the connection)."""
    header = error.header
    if not isinstance(header, RequestHeader) or header.api_key != ApiKey.API_VERSIONS:
        return None
    body = ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=supported_api_versions())
    return encode_response(header._replace(api_version=0), body)


def frame_size(parts: list[bytes | FileRegion]) -> int:
    """Total bytes the parts put on the wire (size prefix included)."""
    return sum(part.size if isinstance(part, FileRegion) else len(part) for part in parts)


# -- helpers ---------------------------------------------------------------------------------------------


def _check(spec: ApiSpec, api_key: int, version: int) -> None:
    if api_key != spec.api_key:
        raise ValueError(
            f"header api key {api_key} does not match the body's API {spec.name} ({spec.api_key:d})"
        )
    if not spec.supports(version):
        raise ValueError(f"{spec.name} v{version} is not supported (v{spec.min_version}-v{spec.max_version})")


def _finish(parts: list[bytearray | bytes | FileRegion]) -> list[bytes | FileRegion]:
    """Patch the size prefix at the start of the first part and freeze the buffers."""
    total = sum(part.size if isinstance(part, FileRegion) else len(part) for part in parts)
    first = parts[0]
    assert isinstance(first, bytearray)
    SIZE_PREFIX.pack_into(first, 0, total - SIZE_PREFIX.size)
    return [bytes(part) if isinstance(part, bytearray) else part for part in parts]


def _join(parts: list[bytes | FileRegion]) -> bytes:
    chunks = [part for part in parts if isinstance(part, bytes)]
    if len(chunks) != len(parts):
        raise ValueError("FileRegion records cannot be joined into bytes: use encode_response_parts")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
