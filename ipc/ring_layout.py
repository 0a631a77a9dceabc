"""Descriptor of a producer ring's shared memory: the layout, once, and a few derived sizes.

Also here: :func:`write_descriptor` (the creator's line 0) and :class:`RingMemory` (a mapped ring, its
descriptor checked, with typed views of its parts): accessors of this layout, nothing of the algorithm.

A ring is one POSIX shared-memory object holding a header page, the frame data region and the ack slots::

    byte 0          4096                         4096 + capacity            4096 + capacity + 16 * ack_slots
    +---------------+----------------------------+-------------------------+
    | ring header   | data: frames, contiguous,  | ack slots (16 B each),  |
    | (one page)    | 16-byte aligned, wrapping  | indexed by frame seq    |
    +---------------+----------------------------+-------------------------+

Ring header (little-endian, native), ruled in 32-bit rows; each 64-byte cache line has ONE writer so the
producer's and the consumer's stores never share a line::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+  line 0: written once by the creator,
    |                      magic "LARG" (u32)           @0          |  before the name is handed out
    +---------------------------------------------------------------+
    |                      version (u32)                @4          |
    +---------------------------------------------------------------+
    |                      capacity_bytes (i64)         @8          |  size of the data region
    |                                                               |
    +---------------------------------------------------------------+
    |                      ack_slots (i64)              @16         |  number of 16-byte ack slots
    |                                                               |
    +---------------------------------------------------------------+
    |                      data_offset (i64)            @24         |  = 4096 (page-aligned data)
    |                                                               |
    +---------------------------------------------------------------+
    |                      ack_offset (i64)             @32         |  = data_offset + capacity_bytes
    |                                                               |
    +---------------------------------------------------------------+
    |                      padding                      @40..63     |
    +===============================================================+  line 1: written by the PRODUCER
    |                      producer_pid (i64)           @64         |
    |                                                               |
    +---------------------------------------------------------------+
    |                      producer_start_ticks (i64)   @72         |  /proc/<pid>/stat starttime
    |                                                               |  (tells a reused pid apart)
    +---------------------------------------------------------------+
    |                      producer_state (i64)         @80         |  0 none, 1 attached, 2 closed
    |                                                               |
    +---------------------------------------------------------------+
    |                      producer_waiting (i64)       @88         |  0 awake, else its sleep generation
    |                                                               |
    +---------------------------------------------------------------+
    |                      padding                      @96..127    |
    +===============================================================+  line 2: written by the CONSUMER
    |                      head_position (i64)          @128        |  read cursor (logical byte
    |                                                               |  position), published after ack
    +---------------------------------------------------------------+
    |                      ack_seq (i64)                @136        |  every frame seq < ack_seq has
    |                                                               |  its ack slot written
    +---------------------------------------------------------------+
    |                      consumer_waiting (i64)       @144        |  0 awake, else its sleep generation
    |                                                               |
    +---------------------------------------------------------------+
    |                      consumer_pid (i64)           @152        |
    |                                                               |
    +---------------------------------------------------------------+
    |                      failed_position (i64)        @160        |  logical position of the bad frame
    |                                                               |
    +---------------------------------------------------------------+
    |                      failed_value (i64)           @168        |  the bad length / type / seq seen
    |                                                               |
    +---------------------------------------------------------------+
    |                      failed_code (i64)            @176        |  0 healthy, else a RING_FAILED_*
    |                                                               |  code; published last
    +---------------------------------------------------------------+
    |                      padding                      @184..4095  |
    +---------------------------------------------------------------+

Frame header, at every 16-byte-aligned frame start in the data region::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                  frame_length (i32)               @0          |  header + body bytes, unaligned;
    +-------------------------------+-------------------------------+  PUBLISHED LAST; <= 0: not yet
    |     frame_type (u16)  @4      |     frame_flags (u16)  @6     |  1 data, 2 padding; flags 0
    +-------------------------------+-------------------------------+
    |                  frame_seq (i64)                  @8          |  0, 1, 2, ... per ring; a padding
    |                                                               |  frame carries the next data seq
    +---------------------------------------------------------------+
    |                  body (a Kafka RecordBatch v2)    @16         |
    |                  ...  then zero padding to a 16-byte multiple |

Why: the length comes first and is a single aligned 4-byte word so that publishing a frame is one store and
"readers stop at a length <= 0" is one load.  16-byte alignment keeps every int64 field aligned (so atomic)
and guarantees that the tail end of the data region, when too short for a frame, still holds a padding
header.  Frames never straddle the end of the region: a Kafka batch must be contiguous to be written with
``writev`` and built in place by a numba kernel.

Ack slot, at ``ack_offset + 16 * (seq % ack_slots)``::

    +---------------------------------------------------------------+
    |                  ack_frame_seq (i64)              @0          |  which frame this slot answers
    |                                                               |
    +---------------------------------------------------------------+
    |                  ack_result (i64)                 @8          |  >= 0: base offset assigned;
    |                                                               |  < 0: minus a Kafka error code
    +---------------------------------------------------------------+

Positions are *logical*: byte counts since the ring was created, never reset; the physical index into the
data region is ``position % capacity_bytes``.  int64 positions never wrap in practice (2**63 bytes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipc.memory_order import load_int64
from ipc.shm import SharedSegment
from storage.errors import CorruptRecordError

__all__ = [
    "ACK_CURSOR_WORD",
    "ACK_ENTRY",
    "ACK_ENTRY_BYTES",
    "ACK_OFFSET_WORD",
    "ACK_RESULT_WORD",
    "ACK_SEQ_WORD",
    "ACK_SLOTS_WORD",
    "CAPACITY_BYTES_WORD",
    "CONSUMER_PID_WORD",
    "CONSUMER_WAITING_WORD",
    "DATA_OFFSET_WORD",
    "DEFAULT_ACK_SLOTS",
    "DEFAULT_CAPACITY_BYTES",
    "FAILED_CODE_WORD",
    "FAILED_POSITION_WORD",
    "FAILED_VALUE_WORD",
    "FRAME_ALIGNMENT",
    "FRAME_HEADER",
    "FRAME_HEADER_BYTES",
    "FRAME_LENGTH_OFFSET",
    "FRAME_SEQ_OFFSET",
    "FRAME_TYPE_DATA",
    "FRAME_TYPE_OFFSET",
    "FRAME_TYPE_PADDING",
    "HEADER_BYTES",
    "HEAD_POSITION_WORD",
    "MAX_CAPACITY_BYTES",
    "MIN_CAPACITY_BYTES",
    "PRODUCER_PID_WORD",
    "PRODUCER_START_TICKS_WORD",
    "PRODUCER_STATE_ATTACHED",
    "PRODUCER_STATE_CLOSED",
    "PRODUCER_STATE_NONE",
    "PRODUCER_STATE_WORD",
    "PRODUCER_WAITING_WORD",
    "RING_FAILED_BAD_LENGTH",
    "RING_FAILED_BAD_PADDING",
    "RING_FAILED_BAD_SEQ",
    "RING_FAILED_BAD_TYPE",
    "RING_FAILED_REASONS",
    "RING_HEADER",
    "RING_MAGIC",
    "RING_VERSION",
    "RingMemory",
    "ack_slots_for",
    "align_frame",
    "max_body_bytes",
    "segment_bytes",
    "write_descriptor",
]

HEADER_BYTES = 4096  # the header page; the data region starts page-aligned after it
CACHE_LINE_BYTES = 64

# The ring header, declared once.  Field offsets below come from this dtype and nowhere else.
RING_HEADER = np.dtype(
    {
        "names": [
            # line 0: creator, written once
            "magic", "version", "capacity_bytes", "ack_slots", "data_offset", "ack_offset",
            # line 1: producer
            "producer_pid", "producer_start_ticks", "producer_state", "producer_waiting",
            # line 2: consumer
            "head_position", "ack_seq", "consumer_waiting", "consumer_pid",
            "failed_position", "failed_value", "failed_code",
        ],
        "formats": ["<u4", "<u4", "<i8", "<i8", "<i8", "<i8",
                    "<i8", "<i8", "<i8", "<i8",
                    "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8"],
        "offsets": [0, 4, 8, 16, 24, 32,
                    64, 72, 80, 88,
                    128, 136, 144, 152, 160, 168, 176],
        "itemsize": HEADER_BYTES,
    }
)  # fmt: skip


def _field(dtype: np.dtype[Any], name: str) -> tuple[int, int]:
    """(byte offset, size in bytes) of field ``name`` of a structured dtype."""
    assert dtype.fields is not None
    field_type, offset = dtype.fields[name][:2]
    return int(offset), int(field_type.itemsize)


def _word(field: str) -> int:
    """Index of an int64 header field in ``memoryview(header).cast('q')``: its byte offset // 8."""
    offset, size = _field(RING_HEADER, field)
    assert size == 8 and offset % 8 == 0, field
    return offset // 8


# int64 word indexes of the header fields, derived from RING_HEADER (used with memoryview.cast('q')).
CAPACITY_BYTES_WORD = _word("capacity_bytes")
ACK_SLOTS_WORD = _word("ack_slots")
DATA_OFFSET_WORD = _word("data_offset")
ACK_OFFSET_WORD = _word("ack_offset")
PRODUCER_PID_WORD = _word("producer_pid")
PRODUCER_START_TICKS_WORD = _word("producer_start_ticks")
PRODUCER_STATE_WORD = _word("producer_state")
PRODUCER_WAITING_WORD = _word("producer_waiting")
HEAD_POSITION_WORD = _word("head_position")
ACK_CURSOR_WORD = _word("ack_seq")
CONSUMER_WAITING_WORD = _word("consumer_waiting")
CONSUMER_PID_WORD = _word("consumer_pid")
FAILED_POSITION_WORD = _word("failed_position")
FAILED_VALUE_WORD = _word("failed_value")
FAILED_CODE_WORD = _word("failed_code")


def _line(field: str) -> int:
    return _field(RING_HEADER, field)[0] // CACHE_LINE_BYTES


assert RING_HEADER.itemsize == HEADER_BYTES
_LINE_WRITERS = {
    0: ("magic", "version", "capacity_bytes", "ack_slots", "data_offset", "ack_offset"),
    1: ("producer_pid", "producer_start_ticks", "producer_state", "producer_waiting"),
    2: ("head_position", "ack_seq", "consumer_waiting", "consumer_pid", "failed_position", "failed_value",
        "failed_code"),
}  # fmt: skip
for _line_number, _names in _LINE_WRITERS.items():
    assert {_line(name) for name in _names} == {_line_number}, _names
assert sum(len(names) for names in _LINE_WRITERS.values()) == len(RING_HEADER.names or ())

RING_MAGIC = 0x4752414C  # b"LARG" read as a little-endian u32
RING_VERSION = 1

PRODUCER_STATE_NONE = 0
PRODUCER_STATE_ATTACHED = 1
PRODUCER_STATE_CLOSED = 2

# The frame header, declared once.
FRAME_HEADER = np.dtype(
    {
        "names": ["frame_length", "frame_type", "frame_flags", "frame_seq"],
        "formats": ["<i4", "<u2", "<u2", "<i8"],
        "offsets": [0, 4, 6, 8],
        "itemsize": 16,
    }
)
FRAME_HEADER_BYTES = FRAME_HEADER.itemsize
FRAME_LENGTH_OFFSET = _field(FRAME_HEADER, "frame_length")[0]
FRAME_TYPE_OFFSET = _field(FRAME_HEADER, "frame_type")[0]
FRAME_SEQ_OFFSET = _field(FRAME_HEADER, "frame_seq")[0]
FRAME_ALIGNMENT = 16
FRAME_TYPE_DATA = 1
FRAME_TYPE_PADDING = 2

assert (FRAME_LENGTH_OFFSET, FRAME_TYPE_OFFSET, FRAME_SEQ_OFFSET, FRAME_HEADER_BYTES) == (0, 4, 8, 16)
assert FRAME_LENGTH_OFFSET % 4 == 0 and FRAME_SEQ_OFFSET % 8 == 0
# A padding frame must fit in whatever is left at the end of the data region.
assert FRAME_ALIGNMENT >= FRAME_HEADER_BYTES and FRAME_ALIGNMENT % 8 == 0

# The ack slot, declared once.
ACK_ENTRY = np.dtype({"names": ["ack_frame_seq", "ack_result"], "formats": ["<i8", "<i8"], "offsets": [0, 8]})
ACK_ENTRY_BYTES = ACK_ENTRY.itemsize
ACK_SEQ_WORD = _field(ACK_ENTRY, "ack_frame_seq")[0] // 8  # int64 index inside a slot
ACK_RESULT_WORD = _field(ACK_ENTRY, "ack_result")[0] // 8
assert ACK_ENTRY_BYTES == 16 and (ACK_SEQ_WORD, ACK_RESULT_WORD) == (0, 1)

# Why a ring failed (header field failed_code).  The consumer writes these; the producer reports them.
RING_FAILED_BAD_LENGTH = 1  # length < header, or the frame runs past the end of the data region
RING_FAILED_BAD_TYPE = 2  # frame_type neither data nor padding
RING_FAILED_BAD_SEQ = 3  # frame_seq is not the next one expected
RING_FAILED_BAD_PADDING = 4  # a padding frame that does not end exactly at the end of the data region
RING_FAILED_REASONS = {
    RING_FAILED_BAD_LENGTH: "bad frame length",
    RING_FAILED_BAD_TYPE: "bad frame type",
    RING_FAILED_BAD_SEQ: "frame sequence out of order",
    RING_FAILED_BAD_PADDING: "bad padding frame",
}

MIN_CAPACITY_BYTES = 4096
MAX_CAPACITY_BYTES = 1 << 30  # frame lengths are int32; a padding frame may span almost the whole region
DEFAULT_CAPACITY_BYTES = 16 << 20
DEFAULT_ACK_SLOTS = 8192


def ack_slots_for(capacity_bytes: int) -> int:
    """Ack slots for a ring of ``capacity_bytes``: one per 64 bytes of data, at most
    :data:`DEFAULT_ACK_SLOTS`.  A frame takes at least 80 bytes (its header and a RecordBatch header), so a
    ring never holds more frames than it has slots; a small ring then keeps its slots small too."""
    return max(1, min(DEFAULT_ACK_SLOTS, capacity_bytes // 64))


def align_frame(frame_bytes: int) -> int:
    """Bytes a frame of ``frame_bytes`` (header + body) occupies in the data region."""
    return (frame_bytes + FRAME_ALIGNMENT - 1) & ~(FRAME_ALIGNMENT - 1)


def max_body_bytes(capacity_bytes: int) -> int:
    """Largest body the ring accepts: any frame up to half the region always fits once the ring drains.

    (An empty ring at physical index x has max(capacity - x, x) >= capacity / 2 contiguous free bytes; one
    alignment unit is kept free behind every frame for the zeroed next length word.)
    """
    return capacity_bytes // 2 - FRAME_HEADER_BYTES - FRAME_ALIGNMENT


def segment_bytes(capacity_bytes: int, ack_slots: int) -> int:
    """Size of the whole shared-memory object, rounded up to a page."""
    raw = HEADER_BYTES + capacity_bytes + ACK_ENTRY_BYTES * ack_slots
    return (raw + HEADER_BYTES - 1) // HEADER_BYTES * HEADER_BYTES


def write_descriptor(buf: memoryview, capacity_bytes: int, ack_slots: int) -> None:
    """Write line 0 of a fresh, zeroed ring; the magic goes last so a half-written ring never looks valid."""
    header_u32 = buf[:8].cast("I")
    header = buf[:HEADER_BYTES].cast("q")
    header[CAPACITY_BYTES_WORD] = capacity_bytes
    header[ACK_SLOTS_WORD] = ack_slots
    header[DATA_OFFSET_WORD] = HEADER_BYTES
    header[ACK_OFFSET_WORD] = HEADER_BYTES + capacity_bytes
    header_u32[1] = RING_VERSION
    header_u32[0] = RING_MAGIC
    header_u32.release()
    header.release()


class RingMemory:
    """A mapped ring: checks the descriptor line and offers typed views of the header, data and ack slots.

    ``header``, ``words32``, ``words64`` and ``data_bytes`` are memoryviews (Python-side loads and stores);
    ``data``, ``data32``, ``data64`` and ``acks`` are numpy arrays over the same memory (numba kernels).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.segment = SharedSegment.open(name)
        try:
            self._map_views()
        except BaseException:
            self.segment.close()
            raise

    def _map_views(self) -> None:
        buf = self.segment.buf
        if len(buf) < HEADER_BYTES:
            raise CorruptRecordError(
                f"ring {self.name}: {len(buf)} bytes, smaller than its {HEADER_BYTES}-byte header"
            )
        magic_version = buf[:8].cast("I")
        magic, version = magic_version[0], magic_version[1]
        magic_version.release()
        if magic != RING_MAGIC or version != RING_VERSION:
            raise CorruptRecordError(
                f"ring {self.name}: magic {magic:#010x} version {version}, "
                f"expected {RING_MAGIC:#010x} version {RING_VERSION}"
            )
        self.header = buf[:HEADER_BYTES].cast("q")
        capacity = self.header[CAPACITY_BYTES_WORD]
        slots = self.header[ACK_SLOTS_WORD]
        data_offset = self.header[DATA_OFFSET_WORD]
        ack_offset = self.header[ACK_OFFSET_WORD]
        if not (
            MIN_CAPACITY_BYTES <= capacity <= MAX_CAPACITY_BYTES
            and capacity % FRAME_ALIGNMENT == 0
            and slots >= 1
            and data_offset == HEADER_BYTES
            and ack_offset == data_offset + capacity
            and len(buf) >= segment_bytes(capacity, slots)
        ):
            raise CorruptRecordError(
                f"ring {self.name}: descriptor capacity {capacity} ack_slots {slots} data_offset "
                f"{data_offset} ack_offset {ack_offset} does not fit a {len(buf)}-byte segment"
            )
        self.capacity_bytes: int = capacity
        self.ack_slots: int = slots
        data = buf[data_offset : data_offset + capacity]
        self.words32 = data.cast("i")  # frame lengths and types, for Python-side stores
        self.words64 = data.cast("q")  # frame seqs
        self.data_bytes = data  # bodies, for Python-side copies
        self.data = np.frombuffer(buf, np.uint8, capacity, data_offset)
        self.data32 = self.data.view(np.int32)  # the same words, for numba kernels
        self.data64 = self.data.view(np.int64)
        self.acks = np.frombuffer(buf, np.int64, (ACK_ENTRY_BYTES // 8) * slots, ack_offset)

    def failure(self) -> tuple[int, int, int]:
        """(code, position, value) of the ring's failure; code 0 if healthy."""
        code = load_int64(self.header, FAILED_CODE_WORD)
        return code, self.header[FAILED_POSITION_WORD], self.header[FAILED_VALUE_WORD]

    def close(self) -> None:
        for view in (self.header, self.words32, self.words64, self.data_bytes):
            view.release()
        self.data = np.empty(0, np.uint8)
        self.data32 = self.data.view(np.int32)
        self.data64 = self.data.view(np.int64)
        self.acks = np.empty(0, np.int64)
        self.segment.close()
