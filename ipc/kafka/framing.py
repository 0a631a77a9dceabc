"""Frames and headers: the envelope around every Kafka request and response.

Every message on a Kafka connection is a frame: a 4-byte big-endian size, then that many bytes::

    +---------------------+----------------------------------------------------------+
    | size (int32)    @0  | header | body                                  @4 .. 4+size |
    +---------------------+----------------------------------------------------------+

Request header v1 / v2 (the version follows from the API and its version, see :mod:`ipc.kafka.apis`)::

    api_key (int16) @0 | api_version (int16) @2 | correlation_id (int32) @4 | client_id (nullable string) @8
    v2 only: tagged fields (uvarint count, ...)

The three fixed fields come first so a server can tell which API and version it is reading -- and so what
header version follows -- before parsing anything variable.  ``client_id`` keeps the classic int16 length even
in v2, so that any broker can read the header of an ApiVersions request of any version.

Response header v0 is ``correlation_id (int32)``; v1 adds a tagged-fields section.

:class:`FrameReader` is sans-IO, h11-style: feed it whatever bytes arrived, ask it for complete frames;
``None`` means "need more bytes".  A size above ``max_frame_bytes`` (Kafka's ``socket.request.max.bytes``)
raises :class:`FrameTooLargeError` as soon as the 4 size bytes are seen, before any of the body is buffered.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ipc.kafka import primitives as p
from ipc.kafka.apis import APIS
from ipc.kafka.errors import FrameTooLargeError, UnknownApiKeyError
from storage.errors import ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "REQUEST_HEADER_FIXED",
    "SIZE_PREFIX",
    "FrameReader",
    "RequestHeader",
    "decode_request_header",
    "decode_response_header",
    "encode_request_header",
    "encode_response_header",
]

DEFAULT_MAX_FRAME_BYTES = 104_857_600  # socket.request.max.bytes
SIZE_PREFIX = struct.Struct(">i")  # frame size, bytes after this field
REQUEST_HEADER_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
assert SIZE_PREFIX.size == 4 and REQUEST_HEADER_FIXED.size == 8

_COMPACT_AT_BYTES = 64 * 1024  # drop consumed bytes from the buffer once this many have piled up


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


def decode_request_header(mv: memoryview) -> tuple[RequestHeader, int]:
    """Parse the request header at the start of a frame body; return it and the body's position.

    Raises :class:`UnknownApiKeyError` for an API key we do not know (the header version, hence the
    header's length, is then unknowable) and :class:`ProtocolError` for a malformed header.  The version is
    *not* checked here: see :func:`ipc.kafka.codec.decode_request`.
    """
    if len(mv) < REQUEST_HEADER_FIXED.size:
        raise ProtocolError(f"request header truncated: {len(mv)} bytes, the fixed part alone is 8")
    api_key, api_version, correlation_id = REQUEST_HEADER_FIXED.unpack_from(mv, 0)
    spec = APIS.get(api_key)
    if spec is None:
        raise UnknownApiKeyError(
            f"unknown api key {api_key} (version {api_version}, correlation id {correlation_id})",
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
        )
    try:
        client_id, pos = p.read_nullable_string(mv, REQUEST_HEADER_FIXED.size)
        if spec.request_header_version(api_version) >= 2:
            _, pos = p.read_tagged_fields(mv, pos)
    except ProtocolError as e:
        raise ProtocolError(
            f"{spec.name} v{api_version} request header (correlation id {correlation_id}): {e}"
        ) from None
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def encode_request_header(out: bytearray, header: RequestHeader) -> None:
    spec = APIS.get(header.api_key)
    if spec is None:
        raise ValueError(f"unknown api key {header.api_key}")
    out += REQUEST_HEADER_FIXED.pack(header.api_key, header.api_version, header.correlation_id)
    p.write_string(out, header.client_id)
    if spec.request_header_version(header.api_version) >= 2:
        out.append(0)  # no tagged fields


def encode_response_header(out: bytearray, correlation_id: int, header_version: int) -> None:
    out += p.INT32.pack(correlation_id)
    if header_version >= 1:
        out.append(0)  # no tagged fields


def decode_response_header(mv: memoryview, header_version: int) -> tuple[int, int]:
    """Return ``(correlation_id, body position)``."""
    correlation_id, pos = p.read_int32(mv, 0)
    if header_version >= 1:
        _, pos = p.read_tagged_fields(mv, pos)
    return correlation_id, pos


class FrameReader:
    """Splits a byte stream into frames.  ``feed`` bytes as they arrive; ``next_frame`` returns one complete
    frame body (without its size prefix) or ``None`` when more bytes are needed.

    After a :class:`ProtocolError` the stream cannot be resynchronised; the reader keeps raising it.
    """

    __slots__ = ("_buf", "_dropped_bytes", "_error", "_start", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._start = 0  # position of the next unread frame in _buf
        self._dropped_bytes = 0  # bytes of the stream already removed from _buf
        self._error: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._start

    def bytes_needed(self) -> int:
        """How many more bytes complete the next frame (at least 1): a good size for the next ``recv``."""
        have = len(self._buf) - self._start
        if have < SIZE_PREFIX.size:
            return SIZE_PREFIX.size - have
        size = self._peek_size()
        return max(1, SIZE_PREFIX.size + size - have)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes.  Raises at once if the pending frame announces an impossible size."""
        if self._error is not None:
            raise self._error
        self._buf += data
        if len(self._buf) - self._start >= SIZE_PREFIX.size:
            self._peek_size()

    def next_frame(self) -> bytes | None:
        if self._error is not None:
            raise self._error
        have = len(self._buf) - self._start
        if have < SIZE_PREFIX.size:
            return None
        size = self._peek_size()
        if have < SIZE_PREFIX.size + size:
            return None
        begin = self._start + SIZE_PREFIX.size
        end = begin + size
        with memoryview(self._buf) as view:
            frame = bytes(view[begin:end])
        self._start = end
        if self._start == len(self._buf) or self._start >= _COMPACT_AT_BYTES:
            self._dropped_bytes += self._start
            del self._buf[: self._start]
            self._start = 0
        return frame

    def frames(self) -> list[bytes]:
        """Every complete frame now buffered, in order."""
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out

    def _peek_size(self) -> int:
        size: int = SIZE_PREFIX.unpack_from(self._buf, self._start)[0]
        stream_position = self._dropped_bytes + self._start
        if size < 0:
            self._error = ProtocolError(f"frame size {size} at stream position {stream_position} is negative")
            raise self._error
        if size > self.max_frame_bytes:
            self._error = FrameTooLargeError(
                f"frame size {size} at stream position {stream_position} exceeds "
                f"socket.request.max.bytes = {self.max_frame_bytes}",
                size_bytes=size,
                max_frame_bytes=self.max_frame_bytes,
            )
            raise self._error
        return size
