"""The ring's hot kernels, sans-IO: scanning published frames and writing ack slots, over numpy arrays.

``scan_frames`` is step P1 of the consumer (see ``ipc/ring.py``): it walks frame headers in the mapped data
region, checks every length, type and seq, and returns the frames that form one contiguous chunk, or a named
negative status for the first frame it cannot trust.  ``write_acks`` is the slot half of step A1.  Both are
numba kernels whose pure-Python twins (``.py_func``) are tested against them; they take arrays and integers
only, so they run on a real ring's mapping and on any byte garbage alike.  :class:`Chunk` is what the
consumer hands out for one scan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from ipc.memory_order import full_fence, load_acquire
from ipc.ring_layout import (
    ACK_ENTRY_BYTES,
    ACK_RESULT_WORD,
    ACK_SEQ_WORD,
    FRAME_ALIGNMENT,
    FRAME_HEADER_BYTES,
    FRAME_SEQ_OFFSET,
    FRAME_TYPE_DATA,
    FRAME_TYPE_OFFSET,
    FRAME_TYPE_PADDING,
    HEADER_BYTES,
    RING_FAILED_BAD_LENGTH,
    RING_FAILED_BAD_PADDING,
    RING_FAILED_BAD_SEQ,
    RING_FAILED_BAD_TYPE,
)

__all__ = [
    "ACK_WORDS_PER_SLOT",
    "INFO_BAD_VALUE",
    "INFO_END",
    "INFO_FIRST_SEQ",
    "INFO_NEXT_SEQ",
    "INFO_SIZE",
    "INFO_START",
    "INFO_STATUS",
    "SCAN_BAD_LENGTH",
    "SCAN_BAD_PADDING",
    "SCAN_BAD_SEQ",
    "SCAN_BAD_TYPE",
    "SCAN_OK",
    "Chunk",
    "scan_frames",
    "warm_up",
    "write_acks",
]

# scan_frames() status codes: minus the ring_layout RING_FAILED_* code they lead to
SCAN_OK = 0
SCAN_BAD_LENGTH = -RING_FAILED_BAD_LENGTH
SCAN_BAD_TYPE = -RING_FAILED_BAD_TYPE
SCAN_BAD_SEQ = -RING_FAILED_BAD_SEQ
SCAN_BAD_PADDING = -RING_FAILED_BAD_PADDING

# scan_frames() writes these into its int64 ``info`` array
INFO_START = 0  # logical position of the first frame returned (after a skipped padding frame)
INFO_END = 1  # logical position where the scan stopped (the bad frame, if any)
INFO_FIRST_SEQ = 2
INFO_NEXT_SEQ = 3  # seq expected after the last frame returned (-1: still unknown)
INFO_STATUS = 4
INFO_BAD_VALUE = 5
INFO_SIZE = 6

ACK_WORDS_PER_SLOT = ACK_ENTRY_BYTES // 8


@dataclass(frozen=True, slots=True)
class Chunk:
    """Published frames, contiguous in ring memory, returned by :meth:`RingConsumer.peek`.

    ``view`` covers the frames (headers included) and is writable: the writer may stamp offsets in place and
    pass body slices to ``writev``.  Frame ``i`` has seq ``first_seq + i`` and its body is
    ``view[body_starts[i] : body_starts[i] + body_lengths[i]]``.  Valid until released and reused.
    """

    view: np.ndarray
    start_position: int
    end_position: int
    first_seq: int
    body_starts: np.ndarray
    body_lengths: np.ndarray

    @property
    def count(self) -> int:
        return len(self.body_starts)

    def body(self, i: int) -> np.ndarray:
        start = int(self.body_starts[i])
        return self.view[start : start + int(self.body_lengths[i])]


def warm_up() -> None:
    """Load (or compile) the numba kernels the rings use, once per process (docs/ipc.md: what it costs).

    The supervisor calls it before forking writers, so they start with the kernels already loaded; a
    producer calls it at start-up so its first frame does not pay for it.
    """
    words = np.zeros(HEADER_BYTES // 4, np.int32)
    scan_frames(
        words, words.view(np.int64), HEADER_BYTES, 0, -1, 0, np.empty(1, np.int64), np.empty(1, np.int64),
        np.empty(INFO_SIZE, np.int64),
    )  # fmt: skip
    write_acks(np.zeros(2, np.int64), 1, 0, np.zeros(1, np.int64))
    full_fence()


@numba.njit(cache=True)
def scan_frames(
    words32: np.ndarray,
    words64: np.ndarray,
    capacity_bytes: int,
    position: int,
    expected_seq: int,
    max_bytes: int,
    body_starts: np.ndarray,
    body_lengths: np.ndarray,
    info: np.ndarray,
) -> int:
    """P1: walk published frames from logical ``position``; return how many data frames form the chunk.

    ``words32``/``words64`` view the data region.  Fills ``body_starts``/``body_lengths`` (relative to the
    chunk start) and ``info`` (INFO_* slots).  A leading padding frame is skipped; a later one ends the
    chunk.  ``expected_seq`` < 0 accepts whatever seq comes first.  A bad frame ends the scan with a
    negative SCAN_* status and ``info[INFO_END]`` at its position.
    """
    start = position
    count = 0
    status = SCAN_OK
    bad_value = 0
    first_seq = -1
    max_frames = body_starts.shape[0]
    while count < max_frames:
        index = position % capacity_bytes
        if index == 0 and count > 0:
            break  # the previous frame ended exactly at the end of the region: a chunk never wraps
        length = load_acquire(words32, index >> 2)
        if length <= 0:
            break
        frame_type = words32[(index + FRAME_TYPE_OFFSET) >> 2] & 0xFFFF
        seq = words64[(index + FRAME_SEQ_OFFSET) >> 3]
        if length < FRAME_HEADER_BYTES or length > capacity_bytes - index:
            status = SCAN_BAD_LENGTH
            bad_value = length
            break
        if frame_type == FRAME_TYPE_PADDING:
            if length != capacity_bytes - index or index == 0:
                status = SCAN_BAD_PADDING
                bad_value = length
                break
            if expected_seq >= 0 and seq != expected_seq:
                status = SCAN_BAD_SEQ
                bad_value = seq
                break
            if count > 0:
                break  # a chunk is contiguous: the frames after the padding come in the next one
            expected_seq = seq
            position += length
            start = position
            continue
        if frame_type != FRAME_TYPE_DATA:
            status = SCAN_BAD_TYPE
            bad_value = frame_type
            break
        if expected_seq >= 0 and seq != expected_seq:
            status = SCAN_BAD_SEQ
            bad_value = seq
            break
        frame_bytes = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        if count > 0 and position + frame_bytes - start > max_bytes:
            break
        body_starts[count] = position - start + FRAME_HEADER_BYTES
        body_lengths[count] = length - FRAME_HEADER_BYTES
        if count == 0:
            first_seq = seq
        expected_seq = seq + 1
        count += 1
        position += frame_bytes
    info[INFO_START] = start
    info[INFO_END] = position
    info[INFO_FIRST_SEQ] = first_seq
    info[INFO_NEXT_SEQ] = expected_seq
    info[INFO_STATUS] = status
    info[INFO_BAD_VALUE] = bad_value
    return count


@numba.njit(cache=True)
def write_acks(ack_words: np.ndarray, ack_slots: int, first_seq: int, results: np.ndarray) -> int:
    """A1 (slots only): write (seq, result) for frames ``first_seq ..``; return how many.  The caller
    publishes ``ack_seq`` after this returns."""
    count = results.shape[0]
    for i in range(count):
        seq = first_seq + i
        slot = seq % ack_slots
        ack_words[slot * ACK_WORDS_PER_SLOT + ACK_SEQ_WORD] = seq
        ack_words[slot * ACK_WORDS_PER_SLOT + ACK_RESULT_WORD] = results[i]
    return count
