"""The consumer end of a ring, the partition writer's: peek at the published frames, append them, ack them,
release their space.

Steps P1, A1, L1 and L2 of the commit protocol in ``ipc.ring`` are :meth:`RingConsumer.peek` (P1, the scan
kernel ``ipc.ring_scan.scan_frames``), :meth:`RingConsumer.ack` (A1) and :meth:`RingConsumer.release` (L1,
L2); P2, validating and appending, is the caller's.  The consumer keeps a *scan cursor* ahead of the
published head: frames peeked but not yet released.  A frame it cannot check fails the ring
(:meth:`RingConsumer.fail`): its producer's next call raises, the writer serves the partition's other rings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

import numpy as np

from ipc.memory_order import load_int32, load_int64, publish_int64
from ipc.ring_layout import (
    ACK_CURSOR_WORD,
    CONSUMER_PID_WORD,
    CONSUMER_WAITING_WORD,
    FAILED_CODE_WORD,
    FAILED_POSITION_WORD,
    FAILED_VALUE_WORD,
    HEAD_POSITION_WORD,
    PRODUCER_PID_WORD,
    PRODUCER_START_TICKS_WORD,
    PRODUCER_STATE_CLOSED,
    PRODUCER_STATE_NONE,
    PRODUCER_STATE_WORD,
    PRODUCER_WAITING_WORD,
    RingMemory,
)
from ipc.ring_scan import (
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
    write_acks,
)
from ipc.ring_setup import RingNames, ring_failed_error
from ipc.shm import process_alive
from ipc.wakeup import Doorbell, FlagSlot, Notifier, Waiter

__all__ = ["DEFAULT_PEEK_BYTES", "DEFAULT_PEEK_FRAMES", "RingConsumer", "wait_for_frames"]

DEFAULT_PEEK_BYTES: Final = 8 << 20  # a chunk stops after the frame that crosses this many bytes
DEFAULT_PEEK_FRAMES: Final = 4096  # ... or after this many frames


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
            raise ring_failed_error(self._memory)
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
                raise ring_failed_error(memory)
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
