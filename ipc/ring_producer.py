"""The producer end of a ring: reserve a frame, write its body in place, commit it; then read the acks.

Steps R1-R3 and C1-C4 of the commit protocol in ``ipc.ring`` are :meth:`RingProducer.try_reserve`
(R1, R2), the body write by the caller (R3) and :meth:`RingProducer.commit` (C1-C4).  The producer's private
*tail* is where its next frame goes; it never reads a frame back.  Acks are read from the slots in seq order
(``track_acks``): a producer that reads them never has more than ``ack_slots`` frames unread.

A producer waiting for room or for acks naps (``ipc.wakeup``) for up to :data:`PRODUCER_NAP_FOR_S` before it
sleeps on its semaphore: the writer then acks and releases without a post, which it would otherwise pay
once a round when its rounds are the pipeline's bottleneck (docs/ipc.md).
"""

from __future__ import annotations

import os
import time
from typing import Final

import numpy as np

from ipc.memory_order import load_int64, publish_int32, publish_int64
from ipc.ring_layout import (
    ACK_CURSOR_WORD,
    ACK_RESULT_WORD,
    ACK_SEQ_WORD,
    CONSUMER_PID_WORD,
    CONSUMER_WAITING_WORD,
    FAILED_CODE_WORD,
    FRAME_ALIGNMENT,
    FRAME_HEADER_BYTES,
    FRAME_SEQ_OFFSET,
    FRAME_TYPE_DATA,
    FRAME_TYPE_OFFSET,
    FRAME_TYPE_PADDING,
    HEAD_POSITION_WORD,
    PRODUCER_PID_WORD,
    PRODUCER_START_TICKS_WORD,
    PRODUCER_STATE_ATTACHED,
    PRODUCER_STATE_CLOSED,
    PRODUCER_STATE_NONE,
    PRODUCER_STATE_WORD,
    PRODUCER_WAITING_WORD,
    RingMemory,
    align_frame,
    max_body_bytes,
)
from ipc.ring_scan import ACK_WORDS_PER_SLOT
from ipc.ring_setup import RingNames, ring_failed_error
from ipc.shm import process_start_ticks
from ipc.wakeup import DEFAULT_SPIN_ITERATIONS, Doorbell, FlagSlot, Notifier, Waiter
from storage.errors import BackPressureError, CorruptRecordError

__all__ = [
    "PRODUCER_NAP_FOR_S",
    "PRODUCER_NAP_S",
    "RESERVE_ACKS_FULL",
    "RESERVE_FAILED",
    "RESERVE_FULL",
    "RingProducer",
]

# try_reserve() codes (hot path: no exceptions)
RESERVE_FULL: Final = -1  # not enough free bytes: the writer has not released enough yet
RESERVE_ACKS_FULL: Final = -2  # ack_slots frames await poll_acks(): read acks first
RESERVE_FAILED: Final = -3  # the writer marked the ring failed

PRODUCER_NAP_S: Final = 50e-6  # one nap of a producer waiting for room or acks
PRODUCER_NAP_FOR_S: Final = 2e-3  # how long it naps before it sleeps on its semaphore
_LOOP_ACKS: Final = 32  # up to this many new acks are read in a Python loop, more with numpy (_read_acks)


class RingProducer:
    """The producer end: ``reserve`` -> write the body into ``data`` -> ``commit``; then read acks.

    ``data`` is the whole data region as a writable numpy uint8 array; ``reserve`` returns the index in it
    where the body goes, so a numba batch builder can write the RecordBatch in place.  One thread only.
    """

    def __init__(
        self,
        memory: RingMemory,
        space: Doorbell,
        doorbell: Doorbell,
        *,
        max_block_ms: int,
        track_acks: bool,
        spin_iterations: int,
    ) -> None:
        self._memory = memory
        self._space = space
        self._doorbell = doorbell
        self.name = memory.name
        self.data = memory.data
        self.capacity_bytes = memory.capacity_bytes
        self.ack_slots = memory.ack_slots
        self.max_body_bytes = max_body_bytes(memory.capacity_bytes)
        self.max_block_ms = max_block_ms
        self.track_acks = track_acks
        self._header = memory.header
        self._words32 = memory.words32
        self._words64 = memory.words64
        self._data_bytes = memory.data_bytes
        self._tail = load_int64(memory.header, HEAD_POSITION_WORD)
        self._next_seq = 0
        self._reserved_body = -1
        self._acks_read = 0
        self._backlog: list[int] = []  # results read from the slots, not yet handed out (frames from
        # ``_acks_read - len(_backlog)`` on)
        self._ack_words = memory.acks.data  # the ack slots as int64 words, for Python-side loads
        self._waiter = Waiter(space, spin_iterations, nap_s=PRODUCER_NAP_S, nap_for_s=PRODUCER_NAP_FOR_S)
        self._waiting_flag: FlagSlot = (memory.header, PRODUCER_WAITING_WORD)
        self._notifier = Notifier(doorbell, (memory.header, CONSUMER_WAITING_WORD))

    @classmethod
    def attach(
        cls,
        names: RingNames,
        *,
        max_block_ms: int = 60_000,
        track_acks: bool = True,
        spin_iterations: int = DEFAULT_SPIN_ITERATIONS,
    ) -> RingProducer:
        """Open a freshly created ring as its one producer.  ``max_block_ms`` bounds every wait for space.

        ``track_acks=False`` (acks=0) never waits for acks and cannot :meth:`poll_acks`.  A ring serves one
        producer session: attaching to a ring that already had a producer raises ValueError.
        """
        memory = RingMemory(names.ring)
        try:
            state = load_int64(memory.header, PRODUCER_STATE_WORD)
            if state != PRODUCER_STATE_NONE:
                raise ValueError(
                    f"ring {names.ring} already had a producer (pid {memory.header[PRODUCER_PID_WORD]}, "
                    f"state {state}); a new producer session needs a new ring"
                )
            space = Doorbell.open(names.space)
            try:
                doorbell = Doorbell.open(names.doorbell)
            except BaseException:
                space.close()
                raise
        except BaseException:
            memory.close()
            raise
        pid = os.getpid()
        publish_int64(memory.header, PRODUCER_PID_WORD, pid)
        publish_int64(memory.header, PRODUCER_START_TICKS_WORD, process_start_ticks(pid) or 0)
        publish_int64(memory.header, PRODUCER_STATE_WORD, PRODUCER_STATE_ATTACHED)
        return cls(
            memory,
            space,
            doorbell,
            max_block_ms=max_block_ms,
            track_acks=track_acks,
            spin_iterations=spin_iterations,
        )

    # -- frames -------------------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the next committed frame gets."""
        return self._next_seq

    def try_reserve(self, body_bytes: int) -> int:
        """Reserve a frame for up to ``body_bytes``; return the body's index into :attr:`data`, or a negative
        ``RESERVE_*`` code.  Never blocks.  A new reservation replaces an uncommitted one."""
        header = self._header
        if load_int64(header, FAILED_CODE_WORD):
            return RESERVE_FAILED
        if self.track_acks and self._next_seq - self._acks_read >= self.ack_slots:
            return RESERVE_ACKS_FULL
        if not 0 <= body_bytes <= self.max_body_bytes:
            raise ValueError(
                f"ring {self.name}: frame body of {body_bytes} bytes, at most {self.max_body_bytes} fit "
                f"a ring of {self.capacity_bytes} bytes"
            )
        capacity = self.capacity_bytes
        frame_bytes = (body_bytes + FRAME_HEADER_BYTES + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        tail = self._tail
        index = tail % capacity
        padding = capacity - index if index + frame_bytes > capacity else 0
        if tail + padding + frame_bytes + FRAME_ALIGNMENT > load_int64(header, HEAD_POSITION_WORD) + capacity:
            return RESERVE_FULL
        if padding:
            self._write_padding(index, padding)
            self._tail = tail + padding
            index = 0
        self._reserved_body = body_bytes
        return index + FRAME_HEADER_BYTES

    def _write_padding(self, index: int, padding_bytes: int) -> None:
        """R2: a padding frame from ``index`` to the end of the region; its successor's length word zeroed."""
        words32 = self._words32
        words32[(index + FRAME_TYPE_OFFSET) >> 2] = FRAME_TYPE_PADDING
        self._words64[(index + FRAME_SEQ_OFFSET) >> 3] = self._next_seq
        words32[0] = 0
        publish_int32(words32, index >> 2, padding_bytes)

    def reserve(self, body_bytes: int, timeout_ms: int | None = None) -> int:
        """Like :meth:`try_reserve` but waits for room up to ``timeout_ms`` (default ``max_block_ms``).

        Raises BackPressureError if the ring stays full (nothing was written), RingFailedError if the writer
        failed the ring.
        """
        index = self.try_reserve(body_bytes)
        if index >= 0:
            return index
        timeout_s = (self.max_block_ms if timeout_ms is None else timeout_ms) / 1000.0
        deadline = time.monotonic() + timeout_s
        while True:
            if index >= 0:
                return index
            if index == RESERVE_FAILED:
                raise ring_failed_error(self._memory)
            if index == RESERVE_ACKS_FULL and self._read_acks():
                index = self.try_reserve(body_bytes)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._back_pressure(body_bytes, index, timeout_s)
            self._waiter.park((self._waiting_flag,), lambda: self._room_changed(body_bytes), remaining)
            index = self.try_reserve(body_bytes)

    def _room_changed(self, body_bytes: int) -> bool:
        """Would try_reserve() now do something other than report "full"?  Loads only."""
        header = self._header
        if load_int64(header, FAILED_CODE_WORD):
            return True
        if self.track_acks and self._next_seq - self._acks_read >= self.ack_slots:
            return load_int64(header, ACK_CURSOR_WORD) > self._acks_read
        frame_bytes = align_frame(body_bytes + FRAME_HEADER_BYTES)
        index = self._tail % self.capacity_bytes
        padding = self.capacity_bytes - index if index + frame_bytes > self.capacity_bytes else 0
        need = self._tail + padding + frame_bytes + FRAME_ALIGNMENT
        return need <= load_int64(header, HEAD_POSITION_WORD) + self.capacity_bytes

    def _back_pressure(self, body_bytes: int, code: int, timeout_s: float) -> BackPressureError:
        if code == RESERVE_ACKS_FULL:
            unread = self._next_seq - self._acks_read
            detail = f"{unread} frames await acknowledgement ({self.ack_slots} slots)"
        else:
            free = load_int64(self._header, HEAD_POSITION_WORD) + self.capacity_bytes - self._tail
            need = align_frame(body_bytes + FRAME_HEADER_BYTES)
            detail = f"need {need} bytes, {free} of {self.capacity_bytes} free"
        return BackPressureError(
            f"ring {self.name}: full for {timeout_s * 1000:.0f} ms ({detail}; writer pid "
            f"{self._header[CONSUMER_PID_WORD]}); nothing was written, slow down or retry"
        )

    def reserved_view(self) -> memoryview:
        """The reserved body region as a writable memoryview (after a successful reserve)."""
        if self._reserved_body < 0:
            raise ValueError(f"ring {self.name}: nothing reserved")
        start = self._tail % self.capacity_bytes + FRAME_HEADER_BYTES
        return self._data_bytes[start : start + self._reserved_body]

    def commit(self, body_bytes: int) -> int:
        """Publish the reserved frame with its first ``body_bytes`` body bytes; return its seq (C1-C4)."""
        if not 0 <= body_bytes <= self._reserved_body:
            raise ValueError(
                f"ring {self.name}: commit of {body_bytes} body bytes, {max(self._reserved_body, 0)} reserved"
            )
        capacity = self.capacity_bytes
        words32 = self._words32
        index = self._tail % capacity
        length = FRAME_HEADER_BYTES + body_bytes
        frame_bytes = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        seq = self._next_seq
        words32[(index + FRAME_TYPE_OFFSET) >> 2] = FRAME_TYPE_DATA
        self._words64[(index + FRAME_SEQ_OFFSET) >> 3] = seq
        words32[((index + frame_bytes) % capacity) >> 2] = 0
        publish_int32(words32, index >> 2, length)
        self._tail += frame_bytes
        self._next_seq = seq + 1
        self._reserved_body = -1
        self._notifier.notify()
        return seq

    def abort(self) -> None:
        """Drop the current reservation (nothing was published; a padding frame may have been)."""
        self._reserved_body = -1

    def send(self, body: bytes | bytearray | memoryview, timeout_ms: int | None = None) -> int:
        """Reserve, copy ``body`` in, commit; return the frame's seq."""
        size = len(body)
        index = self.reserve(size, timeout_ms)
        self._data_bytes[index : index + size] = body
        return self.commit(size)

    # -- acks ---------------------------------------------------------------------------------------------

    @property
    def acked_seq(self) -> int:
        """Every frame with a seq below this has been acknowledged by the writer."""
        return load_int64(self._header, ACK_CURSOR_WORD)

    def _read_acks(self) -> bool:
        """Copy published, unread ack results into the local backlog; True if there were any.

        A few acks (the common case: at most ``max.in.flight`` frames await theirs) are read as Python
        ints straight from the slots, one by one; a long run with numpy, whose fixed cost per call (a slice
        copy, a compare and a ``tolist``) only pays off past :data:`_LOOP_ACKS` acks (docs/ipc.md)."""
        first = self._acks_read
        upto = load_int64(self._header, ACK_CURSOR_WORD)
        if upto <= first:
            return False
        count = upto - first
        if upto > self._next_seq:
            raise CorruptRecordError(
                f"ring {self.name}: writer acknowledged up to frame {upto}, only {self._next_seq} were sent"
            )
        slots = self.ack_slots
        if count <= _LOOP_ACKS:
            words = self._ack_words
            backlog = self._backlog
            for seq in range(first, upto):
                slot = (seq % slots) * ACK_WORDS_PER_SLOT
                if words[slot + ACK_SEQ_WORD] != seq:
                    raise self._wrong_slot(seq, words[slot + ACK_SEQ_WORD])
                backlog.append(words[slot + ACK_RESULT_WORD])
        else:
            entries = self._memory.acks.reshape(slots, ACK_WORDS_PER_SLOT)
            start = first % slots
            if start + count <= slots:
                entries = entries[start : start + count].copy()
            else:
                entries = np.concatenate((entries[start:], entries[: start + count - slots]))
            expected = np.arange(first, upto, dtype=np.int64)
            if not np.array_equal(entries[:, ACK_SEQ_WORD], expected):
                wrong = int(np.flatnonzero(entries[:, ACK_SEQ_WORD] != expected)[0])
                raise self._wrong_slot(first + wrong, int(entries[wrong, ACK_SEQ_WORD]))
            self._backlog += entries[:, ACK_RESULT_WORD].tolist()
        self._acks_read = upto
        return True

    def _wrong_slot(self, seq: int, stored_seq: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"ring {self.name}: ack slot for frame {seq} holds frame {stored_seq}, expected {seq}"
        )

    def poll_acks(self) -> tuple[int, np.ndarray]:
        """(first seq, results) of the acks that arrived since the last call; results may be empty.

        ``results[i]`` answers frame ``first + i``: >= 0 its base offset, < 0 minus a Kafka error code.
        """
        first, results = self.poll_ack_list()
        return first, np.array(results, np.int64)

    def poll_ack_list(self) -> tuple[int, list[int]]:
        """:meth:`poll_acks` with the results as a list of ints (no numpy array built for a few acks)."""
        if not self.track_acks:
            raise ValueError(f"ring {self.name}: attached with track_acks=False, acks are not kept")
        self._read_acks()
        backlog = self._backlog
        first = self._acks_read - len(backlog)
        if not backlog:
            return first, []
        self._backlog = []
        return first, backlog

    def wait_acks(self, seq: int, timeout_ms: int) -> bool:
        """Wait until frame ``seq`` is acknowledged; False after ``timeout_ms``.  RingFailedError if the
        writer failed the ring before acknowledging it.  Results still come from :meth:`poll_acks`."""
        header = self._header

        def done() -> bool:
            return load_int64(header, ACK_CURSOR_WORD) > seq or load_int64(header, FAILED_CODE_WORD) != 0

        if not done():
            self._waiter.park((self._waiting_flag,), done, timeout_ms / 1000.0)
        if load_int64(header, ACK_CURSOR_WORD) > seq:
            return True
        if load_int64(header, FAILED_CODE_WORD):
            raise ring_failed_error(self._memory)
        return False

    def check_failed(self) -> None:
        """Raise RingFailedError if the writer failed this ring."""
        if load_int64(self._header, FAILED_CODE_WORD):
            raise ring_failed_error(self._memory)

    # -- lifetime -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Mark the ring closed (the writer drains what was committed, then the supervisor unlinks it)."""
        if self._memory.segment.closed:
            return
        publish_int64(self._header, PRODUCER_STATE_WORD, PRODUCER_STATE_CLOSED)
        self._notifier.notify()
        self._notifier.release()
        self._waiting_flag = (memoryview(bytearray(8)).cast("q"), 0)
        self.data = np.empty(0, np.uint8)
        self._header = self._words32 = self._words64 = memoryview(bytearray(8)).cast("q")
        self._data_bytes = memoryview(b"")
        self._ack_words.release()
        self._ack_words = memoryview(bytearray(8)).cast("q")
        self._memory.close()
        self._space.close()
        self._doorbell.close()

    def __enter__(self) -> RingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
