"""The single-producer single-consumer ring between one producer and one partition writer.

Theory of operation
-------------------
This module is the ring's protocol, written once, and its public names.  The layout is in
``ipc/ring_layout.py``; memory ordering in ``ipc/memory_order.py``; sleeping in ``ipc/wakeup.py``; the
ring's names, creation and removal in ``ipc/ring_setup.py``; the two ends in ``ipc/ring_producer.py``
(R1-C4, reading acks) and ``ipc/ring_consumer.py`` (P1-L2); the P1 scan and the A1 slot writer are numba
kernels in ``ipc/ring_scan.py``.  Positions are logical byte counts (``position % capacity`` indexes the
data region).

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

from ipc.ring_consumer import DEFAULT_PEEK_BYTES, DEFAULT_PEEK_FRAMES, RingConsumer, wait_for_frames
from ipc.ring_producer import (
    PRODUCER_NAP_FOR_S,
    PRODUCER_NAP_S,
    RESERVE_ACKS_FULL,
    RESERVE_FAILED,
    RESERVE_FULL,
    RingProducer,
)
from ipc.ring_scan import Chunk, warm_up
from ipc.ring_setup import RingFailedError, RingNames, create_ring, ring_has_frames, unlink_ring

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
    "ring_has_frames",
    "unlink_ring",
    "wait_for_frames",
    "warm_up",
]
