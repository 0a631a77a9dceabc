"""Descriptor of the Kafka RecordBatch v2 (magic 2) header: the layout, once, and its accessors.

Byte layout (big-endian, as Kafka writes it), ruled in 32-bit rows::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                    baseOffset (int64)            @0           |
    |                                                               |
    +---------------------------------------------------------------+
    |                    batchLength (int32)           @8           |  bytes after this field
    +---------------------------------------------------------------+
    |                partitionLeaderEpoch (int32)      @12          |  not under the CRC
    +---------------+-----------------------------------------------+
    | magic (int8)  |            crc (uint32)          @17          |  magic @16
    +---------------+-------------------------------+---------------+
    | crc (cont.)   |  attributes (int16)   @21     | lastOffset... |
    +---------------+-------------------------------+---------------+
    |        ...Delta (int32)                       @23             |
    +---------------------------------------------------------------+
    |      baseTimestamp (int64) @27,  maxTimestamp (int64) @35     |
    |      producerId (int64) @43,  producerEpoch (int16) @51       |
    |      baseSequence (int32) @53,  recordsCount (int32) @57      |
    +---------------------------------------------------------------+
    |      records ...                                  @61          |

Why the fields sit where they do:

* ``baseOffset`` and ``batchLength`` come first so a reader can walk a file batch by batch reading only
  12 bytes per batch (``total size = batchLength + LOG_OVERHEAD``).
* ``partitionLeaderEpoch`` sits before ``magic`` and ``crc``: the CRC-32C covers ``attributes`` to the end of
  the batch, so the appending broker can stamp ``baseOffset`` and ``partitionLeaderEpoch`` without
  recomputing the checksum.  That is what lets bytes pass producer -> ring -> segment -> consumer unchanged.
* ``magic`` at a fixed position (16) lets a reader tell formats apart before trusting anything else.

Attributes (int16): bits 0-2 compression codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd); bit 3 timestamp
type (0 CreateTime, 1 LogAppendTime); bit 4 transactional; bit 5 control batch; bit 6 delete horizon set.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c as _crc32c

from storage.errors import CorruptRecordError

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "BATCH_HEADER",
    "BATCH_LENGTH_OFFSET",
    "CHECK_BAD_COUNTS",
    "CHECK_BAD_CRC",
    "CHECK_BAD_LENGTH",
    "CHECK_BAD_MAGIC",
    "CHECK_TRUNCATED",
    "COMPRESSION_CODEC_MASK",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "CONTROL_FLAG_MASK",
    "CRC_OFFSET",
    "HEADER_SIZE",
    "LAST_OFFSET_DELTA_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAGIC_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "RECORDS_OFFSET",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "BatchHeader",
    "check_batch",
    "compute_crc",
    "parse_header",
    "stamp",
    "validate_batch",
]

# The layout, declared once.  Every other offset below is derived from it.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_FIELDS = (
    ("base_offset", 8),
    ("batch_length", 4),
    ("partition_leader_epoch", 4),
    ("magic", 1),
    ("crc", 4),
    ("attributes", 2),
    ("last_offset_delta", 4),
    ("base_timestamp", 8),
    ("max_timestamp", 8),
    ("producer_id", 8),
    ("producer_epoch", 2),
    ("base_sequence", 4),
    ("records_count", 4),
)
_OFFSETS: dict[str, int] = {}
_pos = 0
for _name, _size in _FIELDS:
    _OFFSETS[_name] = _pos
    _pos += _size

BASE_OFFSET_OFFSET = _OFFSETS["base_offset"]
BATCH_LENGTH_OFFSET = _OFFSETS["batch_length"]
PARTITION_LEADER_EPOCH_OFFSET = _OFFSETS["partition_leader_epoch"]
MAGIC_OFFSET = _OFFSETS["magic"]
CRC_OFFSET = _OFFSETS["crc"]
ATTRIBUTES_OFFSET = _OFFSETS["attributes"]
LAST_OFFSET_DELTA_OFFSET = _OFFSETS["last_offset_delta"]
BASE_TIMESTAMP_OFFSET = _OFFSETS["base_timestamp"]
MAX_TIMESTAMP_OFFSET = _OFFSETS["max_timestamp"]
PRODUCER_ID_OFFSET = _OFFSETS["producer_id"]
PRODUCER_EPOCH_OFFSET = _OFFSETS["producer_epoch"]
BASE_SEQUENCE_OFFSET = _OFFSETS["base_sequence"]
RECORDS_COUNT_OFFSET = _OFFSETS["records_count"]
RECORDS_OFFSET = _pos
HEADER_SIZE = _pos
LOG_OVERHEAD = BATCH_LENGTH_OFFSET + 4  # baseOffset + batchLength: bytes not counted by batchLength

assert HEADER_SIZE == BATCH_HEADER.size == 61
assert (MAGIC_OFFSET, CRC_OFFSET, ATTRIBUTES_OFFSET, RECORDS_COUNT_OFFSET) == (16, 17, 21, 57)
assert LOG_OVERHEAD == 12

MAGIC = 2
COMPRESSION_CODEC_MASK = 0x07
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 4
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# check_batch codes (hot path: returned, never raised; validate_batch raises with the full story)
CHECK_TRUNCATED = -1  # fewer bytes than a header
CHECK_BAD_MAGIC = -2
CHECK_BAD_LENGTH = -3  # batchLength + LOG_OVERHEAD is not exactly the buffer's length
CHECK_BAD_COUNTS = -4  # lastOffsetDelta or recordsCount negative
CHECK_BAD_CRC = -5

_STAMP = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")


class BatchHeader(NamedTuple):
    """The 61-byte header, decoded.  Field names follow Kafka's DefaultRecordBatch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Whole batch size in bytes, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Decode the header at ``position`` without validating anything but its presence."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"record batch at position {position}: {len(buf) - position} bytes, "
            f"need {HEADER_SIZE} for a header"
        )
    return BatchHeader._make(BATCH_HEADER.unpack_from(buf, position))


def compute_crc(buf: bytes | bytearray | memoryview, position: int, size: int) -> int:
    """CRC-32C over attributes..end of the batch of ``size`` bytes at ``position``."""
    view = memoryview(buf)[position + ATTRIBUTES_OFFSET : position + size]
    return int(_crc32c.crc32c(view))


def validate_batch(
    buf: bytes | bytearray | memoryview, position: int = 0, *, where: str = "buffer"
) -> BatchHeader:
    """Check magic, length and CRC of the batch at ``position``; return its header.

    A batch is valid iff (1) at least a header's worth of bytes remains, (2) magic is 2, (3) batchLength
    covers at least the header and the whole batch lies inside ``buf``, (4) lastOffsetDelta and
    recordsCount are not negative, and (5) the stored CRC equals CRC-32C over attributes..end.
    Raises :class:`CorruptRecordError` naming ``where``, the position and the expected and actual values.
    """
    available = len(buf) - position
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"{where}: truncated record batch at position {position}: {available} bytes, "
            f"need at least {HEADER_SIZE}"
        )
    header = BatchHeader._make(BATCH_HEADER.unpack_from(buf, position))
    if header.magic != MAGIC:
        raise CorruptRecordError(
            f"{where}: record batch at position {position} (base offset {header.base_offset}): "
            f"magic {header.magic}, expected {MAGIC}"
        )
    size = header.batch_length + LOG_OVERHEAD
    if size < HEADER_SIZE or size > available:
        raise CorruptRecordError(
            f"{where}: record batch at position {position} (base offset {header.base_offset}): "
            f"batchLength {header.batch_length} gives {size} bytes, {available} available, "
            f"minimum {HEADER_SIZE}"
        )
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptRecordError(
            f"{where}: record batch at position {position} (base offset {header.base_offset}): "
            f"lastOffsetDelta {header.last_offset_delta}, recordsCount {header.records_count}"
        )
    computed = compute_crc(buf, position, size)
    if computed != header.crc:
        raise CorruptRecordError(
            f"{where}: record batch at position {position} (offsets {header.base_offset}.."
            f"{header.last_offset}): stored CRC {header.crc:#010x}, computed {computed:#010x}"
        )
    return header


def check_batch(view: memoryview, position: int = 0, *, whole: bool = True) -> BatchHeader | int:
    """The hot-path twin of :func:`validate_batch`: the header of the batch at ``position`` if it is valid,
    else a negative ``CHECK_*`` code (never an exception).

    Same rules as :func:`validate_batch` (1)-(5), the batch lying inside ``view`` (a 1-D byte memoryview);
    with ``whole`` (a ring frame) it must also end exactly at the end of ``view``.  One unpack and one CRC
    call over a slice of ``view``; call :func:`validate_batch` on a refused batch for the message that says
    why (the cold path).
    """
    available = len(view) - position
    if available < HEADER_SIZE:
        return CHECK_TRUNCATED
    fields = _UNPACK_HEADER(view, position)
    if fields[_MAGIC_FIELD] != MAGIC:
        return CHECK_BAD_MAGIC
    size = fields[_LENGTH_FIELD] + LOG_OVERHEAD
    if size != available and (whole or size > available or size < HEADER_SIZE):
        return CHECK_BAD_LENGTH
    if fields[_DELTA_FIELD] < 0 or fields[_COUNT_FIELD] < 0:
        return CHECK_BAD_COUNTS
    if _crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + size]) != fields[_CRC_FIELD]:
        return CHECK_BAD_CRC
    return _new_tuple(BatchHeader, fields)  # BatchHeader._make without its length check


_UNPACK_HEADER = BATCH_HEADER.unpack_from
_new_tuple = tuple.__new__
_FIELD_NAMES = [name for name, _ in _FIELDS]
_MAGIC_FIELD = _FIELD_NAMES.index("magic")
_LENGTH_FIELD = _FIELD_NAMES.index("batch_length")
_DELTA_FIELD = _FIELD_NAMES.index("last_offset_delta")
_COUNT_FIELD = _FIELD_NAMES.index("records_count")
_CRC_FIELD = _FIELD_NAMES.index("crc")
assert tuple(_FIELD_NAMES) == BatchHeader._fields


def stamp(
    buf: bytearray | memoryview, position: int, base_offset: int, partition_leader_epoch: int | None = None
) -> None:
    """Write ``baseOffset`` (and ``partitionLeaderEpoch``) in place; the CRC does not cover them."""
    _STAMP.pack_into(buf, position + BASE_OFFSET_OFFSET, base_offset)
    if partition_leader_epoch is not None:
        _EPOCH.pack_into(buf, position + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def write_crc(buf: bytearray | memoryview, position: int, size: int) -> int:
    """Compute and store the CRC of a freshly built batch; return it."""
    crc = compute_crc(buf, position, size)
    _CRC.pack_into(buf, position + CRC_OFFSET, crc)
    return crc
