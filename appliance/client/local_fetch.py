"""The consumer's local path: read a partition's segment files through read-only memory maps, zero copy,
never past the high watermark its writer publishes in the partition state page.

Theory of operation
-------------------
**What bounds a read.**  The partition writer appends a batch to the active segment with ``os.write`` and
only then publishes the new log end offset -- and, with no followers, the high watermark (HW) -- in the
partition's state page (``ipc.state_page``).  x86-64 keeps stores in order (``ipc.memory_order``), so a
reader that loads the HW and then reads the file sees every byte of every batch below it.  This module reads
whole batches whose last offset is below the HW it loaded, from a ``mmap`` of the segment file, and decodes
them with numba into arrays whose ``data`` *is* the mapping (``appliance.client.record_arrays``): no byte is
copied on the way.  Offsets at or above the HW but not above the log end offset give nothing (yet); above
the log end offset or below the log start offset they raise :class:`OffsetOutOfRangeError`.

**Finding an offset.**  A cursor remembers ``(segment, byte position)`` of the next offset, so sequential
reads cost one ``fstat`` and one scan.  A jump (seek, or a cursor that ran off the end of its segment)
asks ``storage.log_reader.LogReader`` (sparse offset index, verified against the batch headers) for the
segment file and position of the batch holding the offset; the reader's descriptor is ``dup``-ed, so the
file cannot be swapped between finding and mapping it.

**The writer changes files under us**, and each change is safe:

* *append*: the active segment grows.  It is mapped past its end (64 MiB, or its size again, of headroom;
  pages past the end become readable as the file grows), and a read takes the file's size with ``fstat``
  and reads below it, so a growing segment is mapped again only when it outgrows the mapping (mapping it
  on every read that found it grown -- the map, the previous one's unmap, the page faults again -- cost
  ~10 us of CPU per read on a VM, ~1 us now).  Old mappings are released when the last array over them is
  garbage-collected, never under a caller's feet.
* *roll*: the cursor reaches the end of a segment while the HW is still ahead; the data is in the next
  segment: relocate through the LogReader (its directory listing refreshes on the mtime change).
* *retention* deletes old segments: a mapping of a deleted file stays valid (the inode lives on while
  mapped), so a read in progress finishes; the next read checks the log start offset (published in the
  checkpoint before any unlink) and raises :class:`OffsetOutOfRangeError` below it.
* *truncation* (crash recovery cutting a torn tail, a replica truncating to its leader) only ever removes
  bytes at or above the HW that this reader published to its caller... except a follower truncating below
  its own HW after a leader change, which Kafka allows.  A page of a mapping past the end of its file raises
  SIGBUS when touched, so this module never touches bytes at or above the HW it loaded; a truncation below
  an HW that a reader already loaded is the one case a mapping reader cannot survive.  Replicas must
  therefore lower the published HW *before* truncating below it (noted for the replication work).

**Any number of readers.**  Nothing here writes anything: the state page is only loaded, the files are
opened ``O_RDONLY`` and mapped ``PROT_READ``.  Each reader has its own cursors and mappings.

**Waiting for data** (:func:`wait_for_data`).  Whoever publishes a partition's high watermark (its writer, or
the broker's replication layer) wakes every local reader sleeping on it, without knowing them: the readers
sleep on the high-watermark word itself with a futex, and a publish wakes them when one of them stamped the
state page as sleeping lately (the protocol is written down in ``ipc.state_page``).  So a reader:

1. may *spin* on the high-watermark word for ``spin_us`` (default 0: no spin) before it sleeps: a publish
   landing meanwhile costs no wake-up.  (Not ``sched_yield``-ing: on a loaded machine that hands the core
   to another task for a whole time slice, milliseconds.)  Off by default: on this kind of VM a wake-up
   costs 40-50 us of CPU, about what 50 us of spinning does, and the spin mostly ends in a sleep anyway
   when batches come every 0.2 ms or more (measured at 100,000 records/s through ``appliance serve``, 4
   alternating pairs: the consumer 1.2 us of CPU per record less without it, the writer 0.3-0.6 more for
   its futex wakes, p50 0.40 -> 0.37 ms, p99 1.66 -> 1.53 ms); and on a 2-core machine the spinning core
   is taken from the producer and the writer;
2. then *sleeps on the futex* of every partition it waits for (``futex_waitv``, up to 128), at most
   ``max_sleep_us`` (default 50 ms) at a time, to notice a restarted appliance (a new state page).

The cost against the appliance's 1% idle budget: an idle reader wakes once per ``max_sleep_us`` (~20-50 us
of CPU on this kind of VM: ~0.1% of a core at 50 ms); a publish wakes readers with one system call
(~0.6 us) while they sleep.  Where ``futex_waitv`` is missing (Linux before 5.16, more than 128
partitions), the reader falls back to an inotify watch on the partition directories
(``ipc.dir_watch``): the writer's append is a ``write`` there, which ends the reader's ``select`` at
once; the reader then spins (up to 50 us, whatever ``spin_us``) for the high watermark, published right
after the write, and keeps a timeout (doubling from 50 us to 1 ms during the first 20 ms of a pause, then
up to ``max_sleep_us``) for high-watermark moves without a write.  Without inotify the sleeps are plain
timers.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.client.record_arrays import STOP_MAX_OFFSET, DecodedRun, decode_run
from appliance.config.topic_metadata import META_DIR, TOPICS_FILE, TopicMetadata, read_topics
from ipc.dir_watch import DirectoryWatch, wait_any
from ipc.shm import ShmNames, shm_path
from ipc.state_page import StatePage, wait_for_high_watermarks
from ipc.wakeup import FUTEX_WAITV_AVAILABLE, MAX_FUTEX_WAITERS
from storage.errors import OffsetOutOfRangeError, PartitionOfflineError, UnknownTopicOrPartitionError
from storage.log_dir import read_offline_note
from storage.log_reader import LogReader

__all__ = [
    "DEFAULT_MAX_SLEEP_US",
    "DEFAULT_SPIN_US",
    "LocalPartition",
    "LocalSource",
    "find_partition_dir",
    "list_local_partitions",
    "wait_for_data",
]

DEFAULT_SPIN_US = 0  # see the module doc, "Waiting for data"
_WATCH_SPIN_US = 50  # the inotify fallback: after a write woke it, the HW follows within microseconds
DEFAULT_MAX_SLEEP_US = 50_000
_FIRST_SLEEP_US = 50
_SHORT_SLEEP_US = 1000  # the longest sleep during the first _SHORT_IDLE_S of a pause
_SHORT_IDLE_S = 0.02
_STATE_PAGE_CHECK_S = 1.0  # how often an idle reader checks that its state page is still the live one
_EMPTY = DecodedRun([], -1, 0, 0, 0, 0)


@dataclass(frozen=True)
class LocalSource:
    """Where an appliance keeps its partitions: its log dirs and its shared-memory instance id."""

    log_dirs: tuple[str, ...]
    instance: str  # ipc.shm.instance_id(log_dirs[0]): 16 hex digits naming the appliance's shared memory
    offline: bool = False  # no state page: read up to the end of the log on disk (a stopped appliance)

    @property
    def names(self) -> ShmNames:
        return ShmNames(self.instance)


def _recorded_topics(source: LocalSource) -> dict[str, TopicMetadata]:
    """The supervisor's topic store (``<data dir>/meta/topics.json``), if there is one."""
    return read_topics(os.path.join(source.log_dirs[0], META_DIR, TOPICS_FILE))


def find_partition_dir(source: LocalSource, topic: str, partition: int) -> str | None:
    """The partition's directory: where the topic store says, else the first log dir holding one."""
    recorded = _recorded_topics(source).get(topic)
    if recorded is not None and 0 <= partition < recorded.partitions:
        path = recorded.directory(partition)
        if os.path.isdir(path):
            return path
    for log_dir in source.log_dirs:
        path = os.path.join(log_dir, f"{topic}-{partition}")
        if os.path.isdir(path):
            return path
    return None


def list_local_partitions(source: LocalSource, topic: str) -> list[int]:
    """The topic's partitions: from the topic store, else those with a directory in a log dir."""
    recorded = _recorded_topics(source).get(topic)
    if recorded is not None:
        return list(range(recorded.partitions))
    found = set()
    prefix = topic + "-"
    for log_dir in source.log_dirs:
        try:
            names = os.listdir(log_dir)
        except FileNotFoundError:
            continue
        for name in names:
            rest = name[len(prefix) :]
            if name.startswith(prefix) and rest.isdigit() and os.path.isdir(os.path.join(log_dir, name)):
                found.add(int(rest))
    return sorted(found)


_PAGE_BYTES = mmap.PAGESIZE
_MAP_HEADROOM_BYTES = 64 << 20  # mapped past a growing file's end, so that it is not re-mapped per read


def _libc_mmap() -> tuple[Any, Any]:
    libc = ctypes.CDLL(None, use_errno=True)
    map_, unmap = libc.mmap, libc.munmap
    map_.restype, map_.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                    ctypes.c_int, ctypes.c_int, ctypes.c_long]
    unmap.restype, unmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    return map_, unmap


_MMAP, _MUNMAP = _libc_mmap()
_MAP_FAILED = ctypes.c_void_p(-1).value


class _FileMap:
    """``length_bytes`` of a file mapped read-only and shared, possibly past the file's end (Python's
    ``mmap`` refuses that).  Pages past the end become readable as the file grows; touching one beyond it
    raises SIGBUS, so readers stay below the size ``fstat`` gave them.  Unmapped when the last numpy array
    over it goes (``np.asarray(self)`` makes one whose base is this object)."""

    __slots__ = ("__array_interface__", "_address", "_length_bytes")

    def __init__(self, fd: int, length_bytes: int) -> None:
        address = _MMAP(None, length_bytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, f"mmap of {length_bytes} bytes: {os.strerror(code)}")
        self._address, self._length_bytes = address, length_bytes
        self.__array_interface__ = {"shape": (length_bytes,), "typestr": "|u1", "data": (address, True),
                                    "version": 3}

    def __del__(self) -> None:
        address = getattr(self, "_address", None)  # unset when the mmap failed in __init__
        if address is not None:
            _MUNMAP(address, self._length_bytes)


class _Mapping:
    """A segment file mapped read-only with room to grow: one ``mmap`` per ``_MAP_HEADROOM_BYTES`` (or
    doubling) of growth instead of one per read of a file being appended to (a map, the unmap of the
    previous one and its page faults again cost 10-20 us of CPU on a VM, each read)."""

    __slots__ = ("_whole", "array", "base_offset", "fd", "mapped_bytes", "path")

    def __init__(self, path: str, fd: int, base_offset: int) -> None:
        self.path = path
        self.fd = fd  # our own descriptor (dup of the reader's): the inode stays ours while mapped
        self.base_offset = base_offset
        self.mapped_bytes = 0  # the file's size at the last look: the readable part of the mapping
        self._whole = np.empty(0, dtype=np.uint8)  # the whole mapping, past the file's end
        self.array = self._whole  # the file's bytes up to mapped_bytes (a view of the mapping)

    def ensure(self) -> int:
        """Take the file's size now if it changed (mapping it again only past the mapping's end; a file
        truncated by ``truncate_to`` shrinks the readable part, so nothing past its end is read); return the
        readable size."""
        size = os.fstat(self.fd).st_size
        if size != self.mapped_bytes:
            if size > len(self._whole):
                length = -(-max(size * 2, size + _MAP_HEADROOM_BYTES) // _PAGE_BYTES) * _PAGE_BYTES
                self._whole = np.asarray(_FileMap(self.fd, length))  # keeps the mapping while referenced
            self.array = self._whole[:size]
            self.mapped_bytes = size
        return self.mapped_bytes

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._whole = self.array = np.empty(0, dtype=np.uint8)  # the map goes with the last array over it


class LocalPartition:
    """One partition read through mmap.  Not thread-safe: one per consumer thread."""

    def __init__(self, source: LocalSource, topic: str, partition: int, *, check_crcs: bool = True) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.check_crcs = check_crcs
        directory = find_partition_dir(source, topic, partition)
        if directory is None:
            raise UnknownTopicOrPartitionError(
                f"partition {self.name}: no directory {topic}-{partition} in the log dirs "
                f"{', '.join(source.log_dirs)}"
            )
        self.directory = directory
        offline = None if source.offline else read_offline_note(directory)
        if offline is not None:
            raise PartitionOfflineError(f"partition {self.name} is offline: {offline}")
        self._reader = LogReader(directory, topic_partition=(topic, partition))
        self._page: StatePage | None = None
        self._page_name = source.names.state_page(topic, partition)
        self._page_inode = 0
        self._page_checked = time.monotonic()
        if not source.offline:
            self._attach_state_page(first=True)
        self._watch: DirectoryWatch | None = None
        self._watch_tried = False
        self._segment: _Mapping | None = None
        self._cursor_offset = -1  # the offset the cursor's position belongs to
        self._cursor_position = 0

    # --- the state page -------------------------------------------------------------------------------------
    def _attach_state_page(self, *, first: bool) -> bool:
        try:
            inode = os.stat(shm_path(self._page_name)).st_ino
            page = StatePage.attach(self._page_name)
        except FileNotFoundError:
            if first:
                raise UnknownTopicOrPartitionError(
                    f"partition {self.name}: no state page {self._page_name} in shared memory: the appliance "
                    f"owning {self.directory} is not running (an offline read of the files on disk needs "
                    f"appliance.local.offline=true)"
                ) from None
            return False
        if self._page is not None:
            self._page.close()
        self._page, self._page_inode = page, inode
        return True

    def watch(self) -> DirectoryWatch | None:
        """An inotify watch on the partition directory (made at the first wait), or None if unavailable."""
        if not self._watch_tried:
            self._watch_tried = True
            self._watch = DirectoryWatch.open(self.directory)
        return self._watch

    def maybe_reattach(self) -> None:
        """Called while idle: if the appliance restarted, its state page is a new object under the same name
        (the old mapping would stay frozen forever); map the new one.  At most once per second."""
        now = time.monotonic()
        if self._page is None or now - self._page_checked < _STATE_PAGE_CHECK_S:
            return
        self._page_checked = now
        try:
            inode = os.stat(shm_path(self._page_name)).st_ino
        except FileNotFoundError:
            return  # stopped: keep the last values (everything below them is still on disk)
        if inode != self._page_inode:
            self._attach_state_page(first=False)

    @property
    def state_page(self) -> StatePage | None:
        """The partition's state page (None for an offline read)."""
        return self._page

    # --- offsets --------------------------------------------------------------------------------------------
    def high_watermark(self) -> int:
        page = self._page
        if page is None:
            return self._reader.log_end_offset
        return page.high_watermark

    def log_end_offset(self) -> int:
        page = self._page
        if page is None:
            return self._reader.log_end_offset
        return max(page.log_end_offset, page.high_watermark)

    def log_start_offset(self) -> int:
        return self._reader.log_start_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        found = self._reader.offset_for_timestamp(timestamp_ms)
        if found is None or found.offset >= self.high_watermark():
            return None
        return found.offset

    # --- reading --------------------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int) -> DecodedRun:
        """Whole batches from the one holding ``offset`` (records below it dropped), below the high
        watermark, about ``max_bytes`` of them (at least one batch).  Empty when nothing is readable yet.
        Raises OffsetOutOfRangeError below the log start offset or above the log end offset."""
        high_watermark = self.high_watermark()
        if high_watermark <= offset <= self.log_end_offset():
            return _EMPTY  # nothing readable yet, and in range (the log start offset is at most the HW): no
            # look at the disk, which the reader's log start offset takes (a stat), on a consumer's every wait
        start = self._reader.log_start_offset
        if offset < start or (offset > self.log_end_offset() and offset > self._reader.log_end_offset):
            raise self._out_of_range(offset, start)  # (the disk is asked only on the cold path)
        if offset >= high_watermark:
            return _EMPTY
        for _ in range(3):
            if self._segment is None or self._cursor_offset != offset:
                if not self._locate(offset, high_watermark):
                    return _EMPTY
            segment = self._segment
            assert segment is not None
            mapped = segment.ensure()
            run = decode_run(
                segment.array,
                self._cursor_position,
                mapped,
                topic=self.topic,
                partition=self.partition,
                min_offset=offset,
                max_offset=high_watermark,
                max_bytes=max_bytes,
                check_crcs=self.check_crcs,
                where=f"partition {self.name} segment {segment.path}",
            )
            if run.batch_count:
                self._cursor_position = run.stop_position
                self._cursor_offset = run.next_offset
                return run
            if run.stop_code == STOP_MAX_OFFSET:
                return run  # the batch holding offset is not wholly below the high watermark yet
            self._cursor_offset = -1  # ran off the end of this segment: the data is in a later one
        return _EMPTY

    def _locate(self, offset: int, high_watermark: int) -> bool:
        """Point the cursor at the batch holding ``offset``; False if none is readable below the HW."""
        try:
            found = self._reader.read(offset, 1, max_offset=high_watermark)
        except OffsetOutOfRangeError:
            raise self._out_of_range(offset, self._reader.log_start_offset) from None
        if found.size_bytes == 0 or found.fd < 0:
            return False
        segment = self._segment
        if segment is None or segment.path != found.path or not _same_file(segment.fd, found.fd):
            base_offset = int(os.path.basename(found.path).split(".")[0])
            if segment is not None:
                segment.close()
            self._segment = _Mapping(found.path, os.dup(found.fd), base_offset)
        self._cursor_position = found.position
        self._cursor_offset = offset
        return True

    def _out_of_range(self, offset: int, start: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"partition {self.name}: offset {offset} is out of range: readable offsets are "
            f"[{start}, {self.high_watermark()}) (log start offset {start}, high watermark "
            f"{self.high_watermark()}, log end offset {self.log_end_offset()})"
        )

    def close(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._reader.close()
        if self._page is not None:
            self._page.close()
            self._page = None


def _same_file(fd_a: int, fd_b: int) -> bool:
    a, b = os.fstat(fd_a), os.fstat(fd_b)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def wait_for_data(
    partitions: Sequence[tuple[LocalPartition, int]],
    timeout_s: float,
    *,
    spin_us: int = DEFAULT_SPIN_US,
    max_sleep_us: int = DEFAULT_MAX_SLEEP_US,
) -> bool:
    """Wait until one of ``(partition, position)`` has its high watermark above the position, at most
    ``timeout_s``.  Spins ``spin_us``, then sleeps on the high watermarks' futexes -- woken by the publish
    -- at most ``max_sleep_us`` at a time; without futexes, on inotify watches (see the module doc).
    Returns whether data is there."""
    start = time.perf_counter()
    deadline = start + timeout_s
    spin_until = start + spin_us / 1e6
    checks = [(p.high_watermark, position) for p, position in partitions]
    while True:
        for high_watermark, position in checks:
            if high_watermark() > position:
                return True
        now = time.perf_counter()
        if now >= deadline or now >= spin_until:
            break
    if now >= deadline:
        return False
    if not (FUTEX_WAITV_AVAILABLE and 0 < len(partitions) <= MAX_FUTEX_WAITERS
            and all(p.state_page is not None for p, _ in partitions)):
        return _wait_on_watches(partitions, checks, deadline, spin_us, max_sleep_us)
    while True:
        for partition, _ in partitions:
            partition.maybe_reattach()
        pages = [(p.state_page, position) for p, position in partitions]
        if wait_for_high_watermarks(pages, min(max_sleep_us / 1e6, deadline - now)):  # type: ignore[arg-type]
            return True
        now = time.perf_counter()
        if now >= deadline:
            return False


def _wait_on_watches(partitions: Sequence[tuple[LocalPartition, int]], checks: list[tuple[Any, int]],
                     deadline: float, spin_us: int, max_sleep_us: int) -> bool:
    """The fallback without futexes: sleep on inotify watches of the partition directories (or timers)."""
    quiet_since = time.perf_counter()
    spin_until = quiet_since
    watches = [w for p, _ in partitions if (w := p.watch()) is not None]
    woken_by_writes = len(watches) == len(partitions)
    sleep_us = _FIRST_SLEEP_US
    while True:
        for high_watermark, position in checks:
            if high_watermark() > position:
                return True
        now = time.perf_counter()
        if now >= deadline:
            return False
        if now < spin_until:
            continue
        for partition, _ in partitions:
            partition.maybe_reattach()
        pause_s = min(sleep_us / 1e6, deadline - now)
        if woken_by_writes:
            if wait_any(watches, pause_s):
                # The writer publishes the high watermark right after its write: look again, briefly.
                spin_until = quiet_since = time.perf_counter() + max(spin_us, _WATCH_SPIN_US) / 1e6
                sleep_us = _FIRST_SLEEP_US
                continue
        else:
            time.sleep(pause_s)
        cap = max_sleep_us if now - quiet_since > _SHORT_IDLE_S else min(_SHORT_SLEEP_US, max_sleep_us)
        sleep_us = min(sleep_us * 2, cap)
