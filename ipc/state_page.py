"""The per-partition state page: offsets and liveness every local process may read without locks.

Layout (one 4096-byte shared-memory object per partition, little-endian), ruled in 32-bit rows; each
64-byte cache line has exactly ONE writer::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+  line 0: the creator (supervisor),
    |                      magic "LAST" (u32)           @0          |  once, before handing out the name
    +---------------------------------------------------------------+
    |                      version (u32)                @4          |
    +---------------------------------------------------------------+
    |                      padding                      @8..63      |
    +===============================================================+  line 1: the PARTITION WRITER
    |                      log_end_offset (i64)         @64         |  next offset to assign; published
    |                                                               |  after the batch is in the log
    +---------------------------------------------------------------+
    |                      writer_pid (i64)             @72         |
    |                                                               |
    +---------------------------------------------------------------+
    |                      writer_start_ticks (i64)     @80         |  /proc/<pid>/stat starttime
    |                                                               |
    +---------------------------------------------------------------+
    |                      writer_busy_ms (i64)         @88         |  >0: working since (CLOCK_MONOTONIC
    |                                                               |  ms); <0: asleep since; 0: not yet
    +---------------------------------------------------------------+
    |                      padding                      @96..127    |
    +===============================================================+  line 2: the REPLICA-STATE OWNER
    |                      high_watermark (i64)         @128        |  offsets below it are committed
    |                                                               |  (acks=all, consumers)
    +---------------------------------------------------------------+
    |                      committed_high_watermark (i64) @136      |  replicated partitions: the ISR's
    |                                                               |  HW (>= high_watermark); else -1
    +---------------------------------------------------------------+
    |                      isr_size (i64)               @144        |  in-sync replicas, leader included
    |                                                               |
    +---------------------------------------------------------------+
    |                      min_insync_replicas (i64)    @152        |  the topic's min.insync.replicas
    |                                                               |
    +---------------------------------------------------------------+
    |                      replica_count (i64)          @160        |  valid rows of the replica table
    |                                                               |
    +---------------------------------------------------------------+
    |                      padding                      @168..191   |
    +===============================================================+  line 3: the LEADERSHIP OWNER,
    |                      epoch_seqlock (i64)          @192        |  a seqlock over the next two:
    |                                                               |  odd while they are being written
    +---------------------------------------------------------------+
    |                      leader_epoch (i64)           @200        |  -1 before the first election
    |                                                               |
    +---------------------------------------------------------------+
    |                      epoch_start_offset (i64)     @208        |  first offset of that epoch
    |                                                               |
    +---------------------------------------------------------------+
    |                      padding                      @216..255   |
    +===============================================================+  line 4: the RETENTION OWNER
    |                      log_start_offset (i64)       @256        |  first offset still in the log;
    |                                                               |  published before segments go
    +---------------------------------------------------------------+
    |                      padding                      @264..319   |
    +===============================================================+  line 5: ANY LOCAL READER (the one
    |                      reader_sleep_ms (i64)        @320        |  shared line): monotonic_ms() when
    |                                                               |  a reader last went to sleep on the HW
    +---------------------------------------------------------------+
    |                      padding                      @328..1023  |
    +===============================================================+  @1024: the REPLICA TABLE, written
    |          16 rows of REPLICA_ROW, one 64-byte line each        |  by the replica-state owner: one
    |                      @1024..2047                              |  row per follower (status only)
    +---------------------------------------------------------------+
    |                      padding                      @2048..4095 |
    +---------------------------------------------------------------+

A replica row (:data:`REPLICA_ROW`, what ``appliance replicas status`` shows of one follower)::

    +---------------------------------------------------------------+
    |                      replica_id (i64)             @0          |  the follower's node.id
    +---------------------------------------------------------------+
    |                      in_isr (i64)                 @8          |  1 in the ISR, 0 not
    +---------------------------------------------------------------+
    |                      log_end_offset (i64)         @16         |  its last fetch offset; -1 unknown
    +---------------------------------------------------------------+
    |                      last_caught_up_ms (i64)      @24         |  monotonic_ms(); -1 never
    +---------------------------------------------------------------+
    |                      last_fetch_ms (i64)          @32         |  monotonic_ms(); -1 never
    +---------------------------------------------------------------+
    |                      padding                      @40..63     |
    +---------------------------------------------------------------+

Line 2 and the replica table belong to the *replica-state owner*: the partition writer while the partition
has no followers (replication factor 1: it publishes HW = LEO; the creator sets ``isr_size`` 1 and
``min_insync_replicas`` once, before handing the page out), the broker's replication layer for a replicated
partition (``appliance.broker.replication``).  Local producers read ``isr_size`` and
``min_insync_replicas`` to refuse acks=all batches with NOT_ENOUGH_REPLICAS, as the broker does.  Rows are
written field by field: a reader may see a row mid-update (fine for status; nothing decides on them).

Rules: a single int64 field is published with one aligned 8-byte store, so a reader never sees half of it,
and (TSO, see ``ipc/memory_order.py``) whoever sees a new log end offset also sees the bytes it describes.
Nothing here needs a lock.  The one pair that must be read together, (leader_epoch, epoch_start_offset), is
a seqlock: the writer makes ``epoch_seqlock`` odd, writes both, makes it even; a reader retries while it is
odd or changed under it.  A writer that dies mid-update leaves it odd: its successor's first write repairs it,
and readers give up after :data:`SEQLOCK_READ_TIMEOUT_MS` with RequestTimeoutError.

**Readers sleeping on the high watermark** (local consumers; any number, unknown to the publisher).  A reader
with nothing to read sleeps on the low 32 bits of ``high_watermark`` with a futex (``ipc.wakeup``); whoever
publishes the high watermark wakes them.  The one line with many writers, line 5, says whether anyone might
sleep: its single word is a time, and every store of it is "a reader slept at about this time" (last
store wins; a lost race still leaves a recent time).  The protocol (:func:`wait_for_high_watermarks`,
:meth:`StatePage.high_watermark`'s setter)::

    reader                                         publisher
    1. reader_sleep_ms := now                      a. high_watermark := new
    2. FULL FENCE                                  b. FULL FENCE
    3. load high_watermark; above my position?     c. load reader_sleep_ms; within READER_WAKE_WINDOW_MS
       then return (no sleep)                         of now?  then futex_wake(high_watermark's low half)
    4. futex_wait(low half, the value loaded in 3,
       at most READER_SLEEP_MAX_MS); go to 1

No wakeup is lost: as with the doorbells, the fences make either the reader's load (3) see the new value
or the publisher's load (c) see the stamp; a store landing between 3 and 4 makes the kernel's compare in 4
fail, so the sleep ends at once.  A sleep lasts at most READER_SLEEP_MAX_MS before the reader stamps again,
so a sleeping reader's stamp is never older than that plus its scheduling delay, well inside the window.
The publisher pays one fence and one load per publish, plus one ``futex_wake`` system call while readers
slept within the window; an idle system pays nothing.  Steps b-c may come later than a
(``set_high_watermark(offset, wake_readers=False)``, then ``wake_readers()``): the partition writer
acknowledges its producers in between, because the woken reader often takes the writer's core at once
(wake-up preemption: the call then costs the writer far more wall time than CPU; docs/ipc.md).  A
publisher that dies between a and c delays its readers by at most READER_SLEEP_MAX_MS; it never strands
them.

**The writer's liveness** costs the writer nothing while it sleeps: ``writer_busy_ms`` holds the monotonic
ms at which its current work began (stored when it wakes, and at most every few ms while rounds stream), or
minus the ms at which it went to sleep on its doorbell.  A writer busy far longer than a round takes
(milliseconds) is stuck; a writer asleep since before its doorbell was rung, and still asleep long after, is
stuck too (the supervisor compares the word with the doorbell's count: ``appliance.server.liveness``).  A dead
writer is seen by its pid and start time (and by the supervisor as its child's exit).

Setters are for the field's owner only; a second writer would break the "one writer per field" rule that
makes lock-free reads correct, and nothing here can detect it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ipc.memory_order import full_fence, load_int64, publish_int64
from ipc.shm import Permissions, SharedSegment, process_alive, process_start_ticks
from ipc.wakeup import FUTEX_WAITV_AVAILABLE, MAX_FUTEX_WAITERS, futex_wait_any, futex_wake
from storage.errors import CorruptRecordError, RequestTimeoutError

__all__ = [
    "MAX_REPLICA_ROWS",
    "NO_LEADER_EPOCH",
    "REPLICA_ROW",
    "SEQLOCK_READ_TIMEOUT_MS",
    "STATE_PAGE",
    "STATE_PAGE_BYTES",
    "ReplicaRow",
    "StatePage",
    "monotonic_ms",
    "wait_for_high_watermarks",
]

STATE_PAGE_BYTES = 4096
MAX_REPLICA_ROWS = 16
REPLICA_ROW = np.dtype(
    {
        "names": ["replica_id", "in_isr", "log_end_offset", "last_caught_up_ms", "last_fetch_ms"],
        "formats": ["<i8", "<i8", "<i8", "<i8", "<i8"],
        "offsets": [0, 8, 16, 24, 32],
        "itemsize": 64,
    }
)  # fmt: skip
STATE_PAGE = np.dtype(
    {
        "names": [
            "magic", "version",
            "log_end_offset", "writer_pid", "writer_start_ticks", "writer_busy_ms",
            "high_watermark", "committed_high_watermark", "isr_size", "min_insync_replicas", "replica_count",
            "epoch_seqlock", "leader_epoch", "epoch_start_offset",
            "log_start_offset",
            "reader_sleep_ms",
            "replicas",
        ],
        "formats": ["<u4", "<u4", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8", "<i8",
                    "<i8", "<i8", "<i8", (REPLICA_ROW, (MAX_REPLICA_ROWS,))],
        "offsets": [0, 4, 64, 72, 80, 88, 128, 136, 144, 152, 160, 192, 200, 208, 256, 320, 1024],
        "itemsize": STATE_PAGE_BYTES,
    }
)  # fmt: skip
STATE_MAGIC = 0x5453414C  # b"LAST" as a little-endian u32
STATE_VERSION = 1
NO_LEADER_EPOCH = -1
SEQLOCK_READ_TIMEOUT_MS = 100
READER_SLEEP_MAX_MS = 1000  # a reader sleeping on the high watermark stamps line 5 again at least this often
READER_WAKE_WINDOW_MS = 5000  # a publisher wakes readers while a stamp is this recent


def _word(field: str) -> int:
    assert STATE_PAGE.fields is not None
    field_type, offset = STATE_PAGE.fields[field][:2]
    assert field_type.itemsize == 8 and offset % 8 == 0, field
    return int(offset) // 8


_LOG_END_OFFSET = _word("log_end_offset")
_WRITER_PID = _word("writer_pid")
_WRITER_START_TICKS = _word("writer_start_ticks")
_WRITER_BUSY_MS = _word("writer_busy_ms")
_HIGH_WATERMARK = _word("high_watermark")
_COMMITTED_HIGH_WATERMARK = _word("committed_high_watermark")
_ISR_SIZE = _word("isr_size")
_MIN_INSYNC_REPLICAS = _word("min_insync_replicas")
_REPLICA_COUNT = _word("replica_count")
_EPOCH_SEQLOCK = _word("epoch_seqlock")
_LEADER_EPOCH = _word("leader_epoch")
_EPOCH_START_OFFSET = _word("epoch_start_offset")
_LOG_START_OFFSET = _word("log_start_offset")
_READER_SLEEP_MS = _word("reader_sleep_ms")

_OWNER_LINES = {  # cache line -> the fields its one writer owns
    1: (_LOG_END_OFFSET, _WRITER_PID, _WRITER_START_TICKS, _WRITER_BUSY_MS),
    2: (_HIGH_WATERMARK, _COMMITTED_HIGH_WATERMARK, _ISR_SIZE, _MIN_INSYNC_REPLICAS, _REPLICA_COUNT),
    3: (_EPOCH_SEQLOCK, _LEADER_EPOCH, _EPOCH_START_OFFSET),
    4: (_LOG_START_OFFSET,),
    5: (_READER_SLEEP_MS,),
}
for _line, _words in _OWNER_LINES.items():
    assert {word * 8 // 64 for word in _words} == {_line}
assert STATE_PAGE.fields is not None and REPLICA_ROW.fields is not None
_REPLICAS_WORD = int(STATE_PAGE.fields["replicas"][1]) // 8
_ROW_WORDS = REPLICA_ROW.itemsize // 8
_ROW_FIELDS = {name: int(spec[1]) // 8 for name, spec in REPLICA_ROW.fields.items()}
assert int(STATE_PAGE.fields["reader_sleep_ms"][1]) + 8 <= _REPLICAS_WORD * 8
assert _REPLICAS_WORD * 8 + MAX_REPLICA_ROWS * REPLICA_ROW.itemsize <= STATE_PAGE_BYTES


class ReplicaRow(NamedTuple):
    """One follower as the leader's replica-state owner last published it (see :data:`REPLICA_ROW`)."""

    replica_id: int
    in_isr: bool
    log_end_offset: int  # -1: it has not fetched from this leader yet
    last_caught_up_ms: int  # monotonic_ms(); -1: never
    last_fetch_ms: int  # monotonic_ms(); -1: never


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in milliseconds: the same clock in every process of the host (liveness stamps)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000


class StatePage:
    """One partition's state page, mapped.  Every process of the instance may read every field."""

    def __init__(self, segment: SharedSegment) -> None:
        self._segment = segment
        self.name = segment.name
        self._words = segment.buf[:STATE_PAGE_BYTES].cast("q")
        # the address of high_watermark's low 32 bits in this process (little-endian: its first 4 bytes),
        # the word readers sleep on; valid while mapped
        self._hw_address = int(np.frombuffer(segment.buf, np.uint8, 8, _HIGH_WATERMARK * 8).ctypes.data)

    @classmethod
    def create(cls, name: str, permissions: Permissions | None = None) -> StatePage:
        """Create the page: offsets 0, no leader epoch, no writer, not replicated (one in-sync replica,
        ``min.insync.replicas`` 1, committed high watermark -1).  FileExistsError if it exists."""
        segment = SharedSegment.create(name, STATE_PAGE_BYTES, permissions)
        words = segment.buf[:STATE_PAGE_BYTES].cast("q")
        words[_LEADER_EPOCH] = NO_LEADER_EPOCH
        words[_COMMITTED_HIGH_WATERMARK] = -1
        words[_ISR_SIZE] = 1
        words[_MIN_INSYNC_REPLICAS] = 1
        words.release()
        header = segment.buf[:8].cast("I")
        header[1] = STATE_VERSION
        header[0] = STATE_MAGIC  # last: a half-initialised page never looks valid
        header.release()
        return cls(segment)

    @classmethod
    def attach(cls, name: str) -> StatePage:
        """Map an existing page; CorruptRecordError if it is not one."""
        segment = SharedSegment.open(name)
        if segment.size_bytes < STATE_PAGE_BYTES:
            segment.close()
            raise CorruptRecordError(
                f"state page {name}: {segment.size_bytes} bytes, expected {STATE_PAGE_BYTES}"
            )
        header = segment.buf[:8].cast("I")
        magic, version = header[0], header[1]
        header.release()
        if magic != STATE_MAGIC or version != STATE_VERSION:
            segment.close()
            raise CorruptRecordError(
                f"state page {name}: magic {magic:#010x} version {version}, "
                f"expected {STATE_MAGIC:#010x} version {STATE_VERSION}"
            )
        return cls(segment)

    # -- single fields ------------------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """Next offset the writer assigns; every offset below is in the log (owner: partition writer)."""
        return load_int64(self._words, _LOG_END_OFFSET)

    @log_end_offset.setter
    def log_end_offset(self, offset: int) -> None:
        publish_int64(self._words, _LOG_END_OFFSET, offset)

    @property
    def high_watermark(self) -> int:
        """Offsets below it are replicated to the ISR (owner: whoever owns replica state)."""
        return load_int64(self._words, _HIGH_WATERMARK)

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Publish, then wake the readers sleeping on it, if any slept lately (module docstring)."""
        self.set_high_watermark(offset)

    def set_high_watermark(self, offset: int, *, wake_readers: bool = True) -> None:
        """Publish ``offset``; ``wake_readers=False`` leaves the wake-up to a later :meth:`wake_readers` (a
        woken reader may take the publisher's core at once: a writer acknowledges its producers first)."""
        publish_int64(self._words, _HIGH_WATERMARK, offset)
        if wake_readers:
            self.wake_readers()

    def wake_readers(self) -> None:
        """Steps b and c of the publisher's side (module docstring): after the high watermark was stored."""
        full_fence()
        stamp = load_int64(self._words, _READER_SLEEP_MS)
        if stamp and monotonic_ms() - stamp < READER_WAKE_WINDOW_MS:
            futex_wake(self._hw_address)

    # -- replication (owner: the replica-state owner; see the module docstring) ----------------------------

    @property
    def committed_high_watermark(self) -> int:
        """The ISR's high watermark of a replicated partition (what acks=all waits for); -1 otherwise."""
        return load_int64(self._words, _COMMITTED_HIGH_WATERMARK)

    @committed_high_watermark.setter
    def committed_high_watermark(self, offset: int) -> None:
        publish_int64(self._words, _COMMITTED_HIGH_WATERMARK, offset)

    @property
    def isr_size(self) -> int:
        """In-sync replicas, the leader included (0: not published yet)."""
        return load_int64(self._words, _ISR_SIZE)

    @isr_size.setter
    def isr_size(self, count: int) -> None:
        publish_int64(self._words, _ISR_SIZE, count)

    @property
    def min_insync_replicas(self) -> int:
        """The topic's ``min.insync.replicas`` (0: not published yet)."""
        return load_int64(self._words, _MIN_INSYNC_REPLICAS)

    @min_insync_replicas.setter
    def min_insync_replicas(self, count: int) -> None:
        publish_int64(self._words, _MIN_INSYNC_REPLICAS, count)

    def enough_replicas(self) -> bool:
        """False while the ISR is smaller than ``min.insync.replicas`` (acks=all writes are refused)."""
        return self.isr_size >= self.min_insync_replicas

    def publish_replicas(self, rows: Sequence[ReplicaRow]) -> None:
        """Write the replica table (at most :data:`MAX_REPLICA_ROWS` rows; the rest are not shown)."""
        words = self._words
        rows = rows[:MAX_REPLICA_ROWS]
        for index, row in enumerate(rows):
            base = _REPLICAS_WORD + index * _ROW_WORDS
            publish_int64(words, base + _ROW_FIELDS["replica_id"], row.replica_id)
            publish_int64(words, base + _ROW_FIELDS["in_isr"], int(row.in_isr))
            publish_int64(words, base + _ROW_FIELDS["log_end_offset"], row.log_end_offset)
            publish_int64(words, base + _ROW_FIELDS["last_caught_up_ms"], row.last_caught_up_ms)
            publish_int64(words, base + _ROW_FIELDS["last_fetch_ms"], row.last_fetch_ms)
        publish_int64(words, _REPLICA_COUNT, len(rows))

    def replicas(self) -> list[ReplicaRow]:
        """The replica table's valid rows (each read field by field: not one consistent instant)."""
        words = self._words
        count = max(0, min(load_int64(words, _REPLICA_COUNT), MAX_REPLICA_ROWS))
        rows = []
        for index in range(count):
            base = _REPLICAS_WORD + index * _ROW_WORDS
            rows.append(ReplicaRow(
                load_int64(words, base + _ROW_FIELDS["replica_id"]),
                bool(load_int64(words, base + _ROW_FIELDS["in_isr"])),
                load_int64(words, base + _ROW_FIELDS["log_end_offset"]),
                load_int64(words, base + _ROW_FIELDS["last_caught_up_ms"]),
                load_int64(words, base + _ROW_FIELDS["last_fetch_ms"]),
            ))  # fmt: skip
        return rows

    @property
    def log_start_offset(self) -> int:
        """First offset still in the log (owner: whoever deletes old segments; publish before deleting)."""
        return load_int64(self._words, _LOG_START_OFFSET)

    @log_start_offset.setter
    def log_start_offset(self, offset: int) -> None:
        publish_int64(self._words, _LOG_START_OFFSET, offset)

    # -- the writer's liveness ----------------------------------------------------------------------------

    def claim_writer(self) -> None:
        """The partition writer announces itself (pid, start time; busy, opening its log) when it starts."""
        pid = os.getpid()
        publish_int64(self._words, _WRITER_BUSY_MS, monotonic_ms())
        publish_int64(self._words, _WRITER_START_TICKS, process_start_ticks(pid) or 0)
        publish_int64(self._words, _WRITER_PID, pid)

    def writer_busy(self, now_ms: int | None = None) -> None:
        """The partition writer starts (or goes on with) work: a round, its timers, its commands.  Stored
        when it wakes and at most every few ms while rounds stream; never while it sleeps."""
        publish_int64(self._words, _WRITER_BUSY_MS, monotonic_ms() if now_ms is None else now_ms)

    def writer_asleep(self, now_ms: int | None = None) -> None:
        """The partition writer goes to sleep on its doorbell (stored as minus the time)."""
        publish_int64(self._words, _WRITER_BUSY_MS, -(monotonic_ms() if now_ms is None else now_ms))

    @property
    def writer_pid(self) -> int:
        return load_int64(self._words, _WRITER_PID)

    @property
    def writer_busy_ms(self) -> int:
        """The raw word: the monotonic ms the writer's current work began (> 0), minus the monotonic ms it
        went to sleep (< 0), or 0 (no writer has claimed the page)."""
        return load_int64(self._words, _WRITER_BUSY_MS)

    def writer_alive(self, stale_after_ms: int) -> bool:
        """The claimed writer process exists (pid and start time) and is asleep, or has been busy for at most
        ``stale_after_ms`` (a writer busy longer is stuck: a round takes milliseconds)."""
        pid = self.writer_pid
        start_ticks = load_int64(self._words, _WRITER_START_TICKS)
        if not process_alive(pid, start_ticks or None):
            return False
        value = self.writer_busy_ms
        return value <= 0 or monotonic_ms() - value <= stale_after_ms

    # -- the seqlocked pair -------------------------------------------------------------------------------

    def set_leader_epoch(self, leader_epoch: int, start_offset: int) -> None:
        """Publish (leader epoch, its start offset) as one consistent pair (owner: leadership owner)."""
        words = self._words
        sequence = load_int64(words, _EPOCH_SEQLOCK)
        if sequence & 1:
            sequence += 1  # the previous owner died mid-update: continue from an even value
        publish_int64(words, _EPOCH_SEQLOCK, sequence + 1)  # odd: readers retry
        publish_int64(words, _LEADER_EPOCH, leader_epoch)
        publish_int64(words, _EPOCH_START_OFFSET, start_offset)
        publish_int64(words, _EPOCH_SEQLOCK, sequence + 2)  # even: consistent again

    def leader_epoch(self) -> tuple[int, int]:
        """(leader epoch, its start offset), read consistently.  RequestTimeoutError if the seqlock stays odd
        for :data:`SEQLOCK_READ_TIMEOUT_MS` (its writer died mid-update and no successor repaired it yet)."""
        words = self._words
        deadline_ms = 0
        while True:
            for _ in range(1000):
                before = load_int64(words, _EPOCH_SEQLOCK)
                if before & 1:
                    continue
                epoch = load_int64(words, _LEADER_EPOCH)
                start_offset = load_int64(words, _EPOCH_START_OFFSET)
                if load_int64(words, _EPOCH_SEQLOCK) == before:
                    return epoch, start_offset
            now_ms = monotonic_ms()
            if deadline_ms == 0:
                deadline_ms = now_ms + SEQLOCK_READ_TIMEOUT_MS
            elif now_ms > deadline_ms:
                raise RequestTimeoutError(
                    f"state page {self.name}: leader epoch seqlock at {load_int64(words, _EPOCH_SEQLOCK)} "
                    f"(being written) for over {SEQLOCK_READ_TIMEOUT_MS} ms; its writer died mid-update?"
                )
            time.sleep(0)

    # -- lifetime -----------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """All fields, for logs and the CLI (each read on its own; not one consistent instant)."""
        epoch, epoch_start = self.leader_epoch()
        return {
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "log_start_offset": self.log_start_offset,
            "committed_high_watermark": self.committed_high_watermark,
            "isr_size": self.isr_size,
            "min_insync_replicas": self.min_insync_replicas,
            "leader_epoch": epoch,
            "epoch_start_offset": epoch_start,
            "writer_pid": self.writer_pid,
            "writer_busy_ms": self.writer_busy_ms,
        }

    def close(self) -> None:
        """Unmap (the page stays for the other processes)."""
        if self._segment.closed:
            return
        self._words.release()
        self._segment.close()

    def unlink(self) -> None:
        """Remove the name (the creator, on clean shutdown)."""
        self._segment.unlink()

    def __enter__(self) -> StatePage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_high_watermarks(waits: Sequence[tuple[StatePage, int]], timeout_s: float) -> bool:
    """Sleep until one ``(page, position)`` has its high watermark above ``position``, at most ``timeout_s``
    (and at most :data:`READER_SLEEP_MAX_MS`: the caller loops); woken by the publisher's futex wake, see the
    module docstring.  Returns whether one is above.  Needs ``ipc.wakeup.FUTEX_WAITV_AVAILABLE`` and at
    most ``MAX_FUTEX_WAITERS`` pages; the pages must stay open meanwhile."""
    assert FUTEX_WAITV_AVAILABLE and 0 < len(waits) <= MAX_FUTEX_WAITERS
    now_ms = monotonic_ms()
    for page, _ in waits:
        publish_int64(page._words, _READER_SLEEP_MS, now_ms)
    full_fence()
    words = []
    for page, position in waits:
        high_watermark = load_int64(page._words, _HIGH_WATERMARK)
        if high_watermark > position:
            return True
        words.append((page._hw_address, high_watermark))
    futex_wait_any(words, min(timeout_s, READER_SLEEP_MAX_MS / 1000))
    return any(load_int64(page._words, _HIGH_WATERMARK) > position for page, position in waits)
