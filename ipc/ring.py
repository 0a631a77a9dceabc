"""The single-producer single-consumer ring between one producer and one partition writer.

Theory of operation
-------------------
The layout is in ``ipc/ring_layout.py``; memory ordering in ``ipc/memory_order.py``; sleeping in
``ipc/wakeup.py``; the P1 scan and the A1 slot writer are numba kernels in ``ipc/ring_scan.py``.  Positions
are logical byte counts (``position % capacity`` indexes the data region).

Who writes what (one writer per field):

* the creator (supervisor) writes the descriptor line once, before it hands out the name;
* the producer writes frames at its private *tail*, and the header fields ``producer_*``;
* the consumer (partition writer) writes ``head_position``, ``ack_seq``, the ack slots, ``consumer_*`` and
  ``failed_*``; it may also rewrite bodies of published, unreleased frames in place (stamping offsets).

Invariant Z: the length word at the producer's tail is 0.  (The region starts zeroed, and every commit zeroes
the length word of the *next* frame before it publishes its own; one alignment unit is always kept free for
that word.)  Hence a reader walking from the head meets only published frames and then a 0.

Producer, one frame (``reserve`` / write body / ``commit``)::

    R1  free := head + capacity - tail; need room for [padding] + frame + one alignment unit
    R2  if the frame would run past the end of the region: write a padding frame covering the rest of the
        region (type, seq), zero the length word at index 0, publish the padding frame's length
    R3  hand out the body region (the caller or a numba builder writes the RecordBatch there)
    C1  write frame type and frame seq
    C2  zero the length word right after this frame                        (keeps invariant Z)
    C3  publish frame_length                                                (the commit point)
    C4  fence; ring the writer's doorbell if it sleeps

Consumer, one chunk (``peek`` / append + ack / ``release``)::

    P1  from its scan cursor, load each frame_length (acquire); stop at <= 0, at the end of the region, at a
        frame budget, or at a bad frame; check length, type and seq of each frame (never trusts a length
        it cannot check: a bad one fails the ring)
    P2  the caller validates, appends (writev) and computes one result per frame
    A1  write the ack slots, publish ack_seq                                ("acknowledged")
    L1  publish head_position = end of the chunk                            ("space is free")
    L2  fence; post the producer's semaphore if it sleeps

What a crash leaves:

* producer killed before C3: the frame's length word is still 0 (Z), so nobody ever reads it; the consumer
  drains everything before it and blocks no one (other producers have their own rings).  After R2 a
  published padding frame may remain: it holds no data and is skipped.
* producer killed after C3: the frame is complete and is appended like any other.
* consumer killed before A1: nothing was acknowledged; a new consumer re-reads the frames from
  ``head_position`` (the writer's idempotence drops those already appended).
* consumer killed between A1 and L1: acknowledged frames are re-read and re-acknowledged with the same
  result (dedup); the producer already had its answer, the slot is rewritten with the same value.
* a frame that fails P1 cannot be skipped (its length cannot be trusted to find the next one): the consumer
  publishes ``failed_*`` (code last); the producer's next call raises :class:`RingFailedError`; the writer
  stops serving that ring and keeps serving the others.

Acks: the writer answers every data frame with one int64 result in slot ``seq % ack_slots``: >= 0 the base
offset assigned, < 0 minus a Kafka error code.  A producer that reads acks (``track_acks``) never has more
than ``ack_slots`` frames unread, so a slot is never overwritten before it was read; the writer never waits
for the producer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from ipc.memory_order import load_int32, load_int64, publish_int32, publish_int64
from ipc.ring_layout import (
    ACK_CURSOR_WORD,
    ACK_RESULT_WORD,
    ACK_SEQ_WORD,
    CONSUMER_PID_WORD,
    CONSUMER_WAITING_WORD,
    DEFAULT_ACK_SLOTS,
    DEFAULT_CAPACITY_BYTES,
    FAILED_CODE_WORD,
    FAILED_POSITION_WORD,
    FAILED_VALUE_WORD,
    FRAME_ALIGNMENT,
    FRAME_HEADER_BYTES,
    FRAME_SEQ_OFFSET,
    FRAME_TYPE_DATA,
    FRAME_TYPE_OFFSET,
    FRAME_TYPE_PADDING,
    HEAD_POSITION_WORD,
    HEADER_BYTES,
    MAX_CAPACITY_BYTES,
    MIN_CAPACITY_BYTES,
    PRODUCER_PID_WORD,
    PRODUCER_START_TICKS_WORD,
    PRODUCER_STATE_ATTACHED,
    PRODUCER_STATE_CLOSED,
    PRODUCER_STATE_NONE,
    PRODUCER_STATE_WORD,
    PRODUCER_WAITING_WORD,
    RING_FAILED_REASONS,
    RingMemory,
    align_frame,
    max_body_bytes,
    segment_bytes,
    write_descriptor,
)
from ipc.ring_scan import (
    ACK_WORDS_PER_SLOT,
    INFO_BAD_VALUE,
    INFO_END,
    INFO_FIRST_SEQ,
    INFO_NEXT_SEQ,
    INFO_SIZE,
    INFO_START,
    INFO_STATUS,
    SCAN_OK,
    Chunk,
    scan_frames,
    warm_up,
    write_acks,
)
from ipc.shm import (
    Permissions,
    SharedSegment,
    ShmNames,
    create_semaphore,
    process_alive,
    process_start_ticks,
    unlink_semaphore,
    unlink_shared_memory,
)
from ipc.wakeup import DEFAULT_SPIN_ITERATIONS, Doorbell, FlagSlot, Notifier, Waiter
from storage.errors import BackPressureError, CorruptRecordError

__all__ = [
    "DEFAULT_PEEK_BYTES",
    "DEFAULT_PEEK_FRAMES",
    "PRODUCER_NAP_FOR_S",
    "PRODUCER_NAP_S",
    "RESERVE_ACKS_FULL",
    "RESERVE_FAILED",
    "RESERVE_FULL",
    "Chunk",
    "RingConsumer",
    "RingFailedError",
    "RingNames",
    "RingProducer",
    "create_ring",
    "unlink_ring",
    "wait_for_frames",
    "warm_up",
]

DEFAULT_PEEK_BYTES = 8 << 20  # a chunk stops after the frame that crosses this many bytes
DEFAULT_PEEK_FRAMES = 4096  # ... or after this many frames
_LOOP_ACKS = 32  # up to this many new acks are read in a Python loop, more with numpy (see _read_acks)

# try_reserve() codes (hot path: no exceptions)
RESERVE_FULL = -1  # not enough free bytes: the writer has not released enough yet
RESERVE_ACKS_FULL = -2  # ack_slots frames await poll_acks(): read acks first
RESERVE_FAILED = -3  # the writer marked the ring failed


class RingFailedError(CorruptRecordError):
    """The partition writer found a frame in this ring it could not trust and stopped reading the ring.

    Frames before the bad one were appended and acknowledged; nothing at or after it was.  Attach a new ring
    (a new producer session) and resend what was not acknowledged.
    """


def _failed_error(memory: RingMemory) -> RingFailedError:
    code, position, value = memory.failure()
    reason = RING_FAILED_REASONS.get(code, f"failure code {code}")
    return RingFailedError(
        f"ring {memory.name}: {reason} in the frame at position {position} (value {value}); the partition "
        "writer stopped reading this ring, frames before it were appended, none after: attach a new "
        "ring and resend unacknowledged batches"
    )


@dataclass(frozen=True)
class RingNames:
    """The three names a ring endpoint needs; plain strings, so the supervisor can send them to a producer."""

    ring: str  # shared memory: header, data, ack slots
    space: str  # semaphore the producer sleeps on (space freed, ack published, ring failed)
    doorbell: str  # the partition writer's semaphore, shared by all rings of the partition

    @classmethod
    def for_producer(cls, names: ShmNames, topic: str, partition: int, producer: int) -> RingNames:
        return cls(
            ring=names.ring(topic, partition, producer),
            space=names.space_semaphore(topic, partition, producer),
            doorbell=names.doorbell(topic, partition),
        )


def create_ring(
    names: RingNames,
    *,
    capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
    ack_slots: int = DEFAULT_ACK_SLOTS,
    permissions: Permissions | None = None,
) -> None:
    """Create the ring's shared memory and its producer semaphore (the partition doorbell must exist or be
    created separately with :meth:`Doorbell.create`).  FileExistsError if either exists."""
    if not (
        MIN_CAPACITY_BYTES <= capacity_bytes <= MAX_CAPACITY_BYTES and capacity_bytes % HEADER_BYTES == 0
    ):
        raise ValueError(
            f"ring {names.ring}: capacity {capacity_bytes} bytes, expected a multiple of {HEADER_BYTES} "
            f"between {MIN_CAPACITY_BYTES} and {MAX_CAPACITY_BYTES}"
        )
    if ack_slots < 1:
        raise ValueError(f"ring {names.ring}: {ack_slots} ack slots, expected at least 1")
    segment = SharedSegment.create(names.ring, segment_bytes(capacity_bytes, ack_slots), permissions)
    try:
        write_descriptor(segment.buf, capacity_bytes, ack_slots)
        create_semaphore(names.space, permissions).close()
    except BaseException:
        segment.close()
        segment.unlink()
        raise
    segment.close()


def unlink_ring(names: RingNames) -> None:
    """Remove the ring's shared memory and producer semaphore (not the shared doorbell).  Quiet if gone;
    processes that still map the ring keep working on their mapping."""
    unlink_shared_memory(names.ring)
    unlink_semaphore(names.space)


# A producer waiting for room or for acks naps (``ipc.wakeup``, step 1b) for up to 2 ms before it sleeps on
# its semaphore: the writer then acks and releases without a post.  With 1 MiB batches of 10 KiB records
# the writer is the pipeline's bottleneck and the producer waits for an in-flight slot once a round; the
# post cost the writer 7-27 us a round, the nap costs the producer (which has slack) a resume up to ~0.2 ms
# late while the writer works through the frames published before.
PRODUCER_NAP_S: Final = 50e-6
PRODUCER_NAP_FOR_S: Final = 2e-3


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
                raise _failed_error(self._memory)
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
        ints straight from the slots, ~0.1 us each; numpy only pays off for long runs (a slice copy, a
        compare and a ``tolist`` cost ~5 us together, whatever the count)."""
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
        """:meth:`poll_acks` with the results as a list of ints (no numpy: ~1 us for a few acks)."""
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
            raise _failed_error(self._memory)
        return False

    def check_failed(self) -> None:
        """Raise RingFailedError if the writer failed this ring."""
        if load_int64(self._header, FAILED_CODE_WORD):
            raise _failed_error(self._memory)

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


class RingConsumer:
    """The partition writer's end: ``peek`` -> append -> ``ack`` -> ``release`` (or ``complete``)."""

    def __init__(self, memory: RingMemory, space: Doorbell, max_frames_per_peek: int) -> None:
        self._memory = memory
        self._space = space
        self.name = memory.name
        self.capacity_bytes = memory.capacity_bytes
        self.ack_slots = memory.ack_slots
        self._header = memory.header
        self._words32 = memory.words32
        self._head = load_int64(memory.header, HEAD_POSITION_WORD)
        self._scan = self._head
        self._expected_seq = -1  # unknown until the first frame: a restarted writer trusts the first seq
        self._pending_padding: tuple[int, int] | None = None
        self._failed = load_int64(memory.header, FAILED_CODE_WORD) != 0
        self._body_starts = np.empty(max_frames_per_peek, np.int64)
        self._body_lengths = np.empty(max_frames_per_peek, np.int64)
        self._info = np.empty(INFO_SIZE, np.int64)
        self._notifier = Notifier(space, (memory.header, PRODUCER_WAITING_WORD))
        self.waiting_flag: FlagSlot = (memory.header, CONSUMER_WAITING_WORD)

    @classmethod
    def attach(cls, names: RingNames, *, max_frames_per_peek: int = DEFAULT_PEEK_FRAMES) -> RingConsumer:
        """Open a ring as its consumer (also after a previous consumer died: reading resumes at the head)."""
        memory = RingMemory(names.ring)
        try:
            space = Doorbell.open(names.space)
        except BaseException:
            memory.close()
            raise
        publish_int64(memory.header, CONSUMER_PID_WORD, os.getpid())
        publish_int64(memory.header, CONSUMER_WAITING_WORD, 0)  # a dead predecessor may have left it set
        return cls(memory, space, max_frames_per_peek)

    @property
    def head_position(self) -> int:
        """The published read cursor: everything before it was appended, acknowledged and freed."""
        return self._head

    @property
    def failed(self) -> bool:
        return self._failed

    def has_data(self) -> bool:
        """A published frame waits at the scan cursor (one load; False once the ring failed)."""
        if self._failed:
            return False
        return load_int32(self._words32, (self._scan % self.capacity_bytes) >> 2) > 0

    def peek(self, max_bytes: int = DEFAULT_PEEK_BYTES) -> Chunk | None:
        """The published frames after the previous peek, as one contiguous :class:`Chunk`; None if none.

        Stops at the end of the data region, after ``max_bytes`` (the first frame always comes whole) or
        before a bad frame.  When a bad frame is the first one, the ring is marked failed and
        :class:`RingFailedError` is raised (now and on every later call).
        """
        if self._failed:
            raise _failed_error(self._memory)
        memory = self._memory
        info = self._info
        count = scan_frames(
            memory.data32,
            memory.data64,
            self.capacity_bytes,
            self._scan,
            self._expected_seq,
            max_bytes,
            self._body_starts,
            self._body_lengths,
            info,
        )
        start, end = int(info[INFO_START]), int(info[INFO_END])
        if start != self._scan:  # a padding frame was skipped: it holds no data, free it at once if we can
            if self._scan == self._head:
                self._publish_head(start)
            else:
                self._pending_padding = (self._scan, start)
            self._scan = start
        if count == 0:
            status = int(info[INFO_STATUS])
            if status != SCAN_OK:
                self.fail(-status, end, int(info[INFO_BAD_VALUE]))
                raise _failed_error(memory)
            return None
        self._scan = end
        self._expected_seq = int(info[INFO_NEXT_SEQ])
        index = start % self.capacity_bytes
        return Chunk(
            view=memory.data[index : index + (end - start)],
            start_position=start,
            end_position=end,
            first_seq=int(info[INFO_FIRST_SEQ]),
            body_starts=self._body_starts[:count].copy(),
            body_lengths=self._body_lengths[:count].copy(),
        )

    def ack(self, first_seq: int, results: np.ndarray | Sequence[int]) -> None:
        """A1: answer frames ``first_seq ..`` with ``results`` (base offset, or minus a Kafka error code).

        Acks are published in seq order: ``first_seq`` may repeat acks (a restarted writer) but not skip any.
        """
        results_array = np.ascontiguousarray(results, dtype=np.int64)
        acked = load_int64(self._header, ACK_CURSOR_WORD)
        if first_seq > acked:
            raise ValueError(f"ring {self.name}: ack from frame {first_seq} would skip frames {acked}..")
        upto = first_seq + write_acks(self._memory.acks, self.ack_slots, first_seq, results_array)
        if upto > acked:
            publish_int64(self._header, ACK_CURSOR_WORD, upto)
        self._notifier.notify()

    def release(self, end_position: int) -> None:
        """L1: free everything before ``end_position`` (a chunk's ``end_position``), after append and ack."""
        padding = self._pending_padding
        if padding is not None and end_position >= padding[0]:
            self._pending_padding = None
            if end_position == padding[0]:
                end_position = padding[1]
        if not self._head <= end_position <= self._scan:
            raise ValueError(
                f"ring {self.name}: release to position {end_position}, outside [{self._head}, {self._scan}]"
            )
        self._publish_head(end_position)

    def complete(self, chunk: Chunk, results: np.ndarray | Sequence[int]) -> None:
        """Acknowledge every frame of ``chunk`` with ``results``, then release it."""
        self.ack(chunk.first_seq, results)
        self.release(chunk.end_position)

    def rewind(self) -> None:
        """Forget unreleased peeks: the next peek starts again at the head (e.g. after a failed append)."""
        self._scan = self._head
        self._expected_seq = -1
        self._pending_padding = None

    def _publish_head(self, position: int) -> None:
        publish_int64(self._header, HEAD_POSITION_WORD, position)
        self._head = position
        self._notifier.notify()

    def fail(self, code: int, position: int, value: int) -> None:
        """Mark the ring failed (code published last) and wake its producer; peek raises from now on."""
        publish_int64(self._header, FAILED_POSITION_WORD, position)
        publish_int64(self._header, FAILED_VALUE_WORD, value)
        publish_int64(self._header, FAILED_CODE_WORD, code)
        self._failed = True
        self._notifier.notify()

    def failure(self) -> tuple[int, int, int]:
        """(code, position, value) of the ring's failure; code 0 if healthy."""
        return self._memory.failure()

    @property
    def producer_state(self) -> int:
        """PRODUCER_STATE_NONE (not attached yet), _ATTACHED or _CLOSED (closed cleanly)."""
        return load_int64(self._header, PRODUCER_STATE_WORD)

    @property
    def producer_pid(self) -> int:
        return load_int64(self._header, PRODUCER_PID_WORD)

    def producer_alive(self) -> bool:
        """False once the producer closed the ring or its process is gone (pid and start time checked).

        True before a producer attached.  Drain the ring (peek until None), then close and unlink it.
        """
        state = self.producer_state
        if state == PRODUCER_STATE_NONE:
            return True
        if state == PRODUCER_STATE_CLOSED:
            return False
        start_ticks = load_int64(self._header, PRODUCER_START_TICKS_WORD)
        return process_alive(self.producer_pid, start_ticks or None)

    def close(self) -> None:
        """Unmap (the ring stays; a new consumer may attach and resume at the head)."""
        if self._memory.segment.closed:
            return
        self._notifier.release()
        self.waiting_flag = (memoryview(bytearray(8)).cast("q"), 0)
        self._header = self._words32 = memoryview(bytearray(8)).cast("q")
        self._memory.close()
        self._space.close()

    def __enter__(self) -> RingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_frames(consumers: Sequence[RingConsumer], waiter: Waiter, timeout_s: float) -> bool:
    """The writer's sleep: True as soon as any of ``consumers`` has a frame, False after ``timeout_s``.

    ``waiter`` wraps the partition's doorbell (the semaphore every producer of the partition rings); the
    waiting flag is set in each ring, so each producer sees it in its own ring header.
    """
    flags = [consumer.waiting_flag for consumer in consumers]
    return waiter.park(flags, lambda: any(consumer.has_data() for consumer in consumers), timeout_s)
