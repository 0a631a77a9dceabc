"""A ring's shared objects: their names, creating and removing them, and the error either end raises once the
partition writer failed the ring.

A ring is three named kernel objects (:class:`RingNames`): its shared memory (header, frames, ack slots; laid
out in ``ipc.ring_layout``), the producer's semaphore, and the partition writer's doorbell, which every ring
of the partition shares.  The supervisor creates the first two (:func:`create_ring`) and writes the
descriptor before it hands the names out, and removes them (:func:`unlink_ring`) once the writer drained the
ring; the protocol between the two ends is ``ipc.ring``'s.

A ring created with ``wake_on_first_frame`` starts with its consumer's waiting flag set, as if a writer slept
on it: the producer's first commit then posts the partition's doorbell (``ipc.wakeup``, step c), which lets
the supervisor, watching :attr:`~ipc.wakeup.Doorbell.pending`, start the partition's writer only once a
frame was published (a ring attached ahead of need).  A writer clears the flag when it opens the ring.
:func:`ring_has_frames` tells whether a ring no writer has read holds a published frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ipc.ring_layout import (
    CONSUMER_WAITING_WORD,
    DEFAULT_ACK_SLOTS,
    DEFAULT_CAPACITY_BYTES,
    HEAD_POSITION_WORD,
    HEADER_BYTES,
    MAX_CAPACITY_BYTES,
    MIN_CAPACITY_BYTES,
    RING_FAILED_REASONS,
    RingMemory,
    segment_bytes,
    write_descriptor,
)
from ipc.shm import (
    Permissions,
    SharedSegment,
    ShmNames,
    create_semaphore,
    unlink_semaphore,
    unlink_shared_memory,
)
from storage.errors import CorruptRecordError

__all__ = [
    "RingFailedError",
    "RingNames",
    "create_ring",
    "ring_failed_error",
    "ring_has_frames",
    "unlink_ring",
]

_ASLEEP: Final = 1  # the waiting flag of a ring created wake_on_first_frame (a generation no writer uses)


class RingFailedError(CorruptRecordError):
    """The partition writer found a frame in this ring it could not trust and stopped reading the ring.

    Frames before the bad one were appended and acknowledged; nothing at or after it was.  Attach a new ring
    (a new producer session) and resend what was not acknowledged.
    """


def ring_failed_error(memory: RingMemory) -> RingFailedError:
    """The error for the failure the writer published in ``memory``'s header (code, position, value)."""
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
    wake_on_first_frame: bool = False,
) -> None:
    """Create the ring's shared memory and its producer semaphore (the partition doorbell must exist or be
    created separately with :meth:`Doorbell.create`).  FileExistsError if either exists.
    ``wake_on_first_frame``: the first frame published posts the doorbell (module docstring)."""
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
        if wake_on_first_frame:
            header = segment.buf[:HEADER_BYTES].cast("q")
            header[CONSUMER_WAITING_WORD] = _ASLEEP
            header.release()
        create_semaphore(names.space, permissions).close()
    except BaseException:
        segment.close()
        segment.unlink()
        raise
    segment.close()


def ring_has_frames(names: RingNames) -> bool:
    """Whether the ring holds a published frame at its head (what a writer would read next).  A ring that is
    gone or unreadable counts as holding one: the caller then leaves it to a writer."""
    try:
        memory = RingMemory(names.ring)
    except (OSError, CorruptRecordError):
        return True
    try:
        head = memory.header[HEAD_POSITION_WORD]
        return bool(memory.words32[(head % memory.capacity_bytes) // 4] != 0)
    finally:
        memory.close()


def unlink_ring(names: RingNames) -> None:
    """Remove the ring's shared memory and producer semaphore (not the shared doorbell).  Quiet if gone;
    processes that still map the ring keep working on their mapping."""
    unlink_shared_memory(names.ring)
    unlink_semaphore(names.space)
