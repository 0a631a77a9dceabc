"""The physical limits a benchmark is held against, measured in the same run: memory copy, page-cache write,
loopback ``sendfile``.  One module, so every benchmark (``appliance bench``, ``bench/test_bench_*.py``)
measures a limit the same way.

Why these three
---------------
* **memcpy** (numpy ``copyto`` of a working set larger than the caches): the appliance never moves a byte
  more cheaply than a copy; a path that builds a batch into ring memory and a writer that writes it to the
  page cache each cost at least one.
* **page-cache write** (buffered ``os.write`` of 1 MiB chunks to a new file): what a partition writer's append
  costs at best.  The *same byte volume* as the run it is compared with, because the figure drops several-fold
  once the kernel's dirty-page limit is reached (``vm.dirty_ratio``): a short probe against a long run would
  flatter the probe.  Every probe starts after ``os.sync()``, as the runs compared with it should.  Given the
  run's payload (``source``: the rows it sends), the probe writes *those bytes in that order*; without, one
  1 MiB buffer over and over, which stays in the CPU cache and so costs less CPU per byte than the bytes a
  run moves.
* **before and after** (:func:`limits_with_probe`): a produce run is bracketed by two probes of its volume,
  one right before it (nothing but ``os.sync()`` between) and one right after; the limit is the *faster* of
  the two, both samples and their CPU per byte are reported.  On a virtual machine the figure depends on
  which pages the kernel hands out: a page freed a moment ago is still backed by the host, one the guest has
  handed back (free page reporting) faults on the host first and costs several times the CPU per byte
  written.  One probe long before a run (after other probes freed or took memory) measures a different
  machine than the run meets; a probe on each side shows the swing, and the probe's CPU per byte says which
  kind of pages it got.
* **loopback sendfile** (``os.sendfile`` of a file in the page cache from a forked process to this one over
  TCP on 127.0.0.1, received into a reused 8 MiB buffer): what a broker fetch or a follower's catch-up can do
  at best on this host.

On a shared machine each figure moves from one second to the next: report the ratio of a result to its
limit, measured next to it, and keep probe files until the run they are compared with
is over (:class:`PageCacheProbe`): a run writing into pages a probe just freed is flattered, and the other way
round.

Public face: :func:`memcpy_bytes_per_s`, :func:`mapped_copy_bytes_per_s`, :class:`PageCacheProbe`,
:func:`loopback_sendfile` (a :class:`Transfer`), :func:`measure_limits` / :func:`limits_with_probe` and the
:class:`Limits` they return.  The figures these probes gave on the project's machine, and what moves them,
are in docs/performance.md ("The limits, measured in the same run").
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Limits",
    "PageCacheProbe",
    "Transfer",
    "limits_with_probe",
    "loopback_sendfile",
    "mapped_copy_bytes_per_s",
    "measure_limits",
    "memcpy_bytes_per_s",
    "probe_volume_bytes",
    "recycle_pages",
]

MIB = 1 << 20
MB = 1_000_000  # MB/s in every report: 10^6 bytes
CHUNK_BYTES = MIB  # page-cache probe: one os.write per MiB
RECEIVE_BUFFER_BYTES = 8 * MIB  # sendfile receiver: one reused buffer
DEFAULT_MEMCPY_WORKING_SET_BYTES = 256 * MIB
DEFAULT_PAGE_CACHE_CAP_BYTES = 4 << 30  # longer probes add time, not information
DEFAULT_SENDFILE_CAP_BYTES = 1 << 30
MIN_PROBE_BYTES = 16 * MIB  # shorter probes measure the clock, not the copy


def memcpy_bytes_per_s(working_set_bytes: int = DEFAULT_MEMCPY_WORKING_SET_BYTES, *, copies: int = 1,
                       rounds: int = 3) -> float:
    """Best of ``rounds``: ``copies`` numpy copies between two buffers of ``working_set_bytes`` (random
    bytes, touched once before timing); bytes per second."""
    size = max(int(working_set_bytes), 4096)
    source = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault both buffers in
    best = float("inf")
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        for _ in range(max(copies, 1)):
            np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return size * max(copies, 1) / best


def mapped_copy_bytes_per_s(paths: Sequence[str | os.PathLike[str]], *, rounds: int = 3) -> float:
    """Best of ``rounds``: copying the files' bytes out of read-only memory maps (the page cache) into one
    buffer -- the least a reader of those files can cost; bytes per second.  Empty files are skipped."""
    mappings: list[mmap.mmap] = []
    try:
        for path in paths:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size:
                    mappings.append(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ))
        if not mappings:
            raise ValueError("mapped_copy_bytes_per_s: no bytes in the files given")
        total = sum(len(m) for m in mappings)
        best = _copy_out_seconds(mappings, rounds)
    finally:
        for mapping in mappings:
            mapping.close()
    return total / best


def _copy_out_seconds(mappings: Sequence[mmap.mmap], rounds: int) -> float:
    """Best time of ``rounds`` copies of every mapping into one buffer (the views die with this frame, so
    the caller can close the mappings)."""
    maps = [np.frombuffer(mapping, np.uint8) for mapping in mappings]
    out = np.empty(max(len(m) for m in maps), dtype=np.uint8)
    best = float("inf")
    for round_index in range(max(rounds, 1) + 1):
        started = time.perf_counter()
        for m in maps:
            np.copyto(out[: len(m)], m)
        if round_index:  # the first round faults the mappings in: not counted
            best = min(best, time.perf_counter() - started)
    return best


class PageCacheProbe:
    """Buffered ``os.write`` of ``volume_bytes`` in ~1 MiB chunks to a new file in ``directory`` (put it next
    to the logs: the same file system): the page-cache write bandwidth at that moment.

    ``source``: the rows a run sends (a 2-D ``uint8`` array, one record per row); the probe then writes
    ``volume_bytes`` of those rows, from the first, cycled as the run cycles them, whole rows per chunk: the
    same bytes from the same memory.  Without it, one random 1 MiB buffer is written over and over (cache
    resident: a kinder limit than any run of ``volume_bytes`` distinct bytes can meet).

    :meth:`measure` may be called several times (before and after a run); files are kept until
    :meth:`remove`, after the runs compared with them, so that neither writes into pages the other just freed
    (on a virtual machine a freshly freed page is several times cheaper than one the host has not backed).
    ``recycle``: each probe starts right after :func:`recycle_pages` of its volume, as the run compared with
    it should (then every one of them writes into pages the host backs)."""

    def __init__(self, directory: str | os.PathLike[str], volume_bytes: int,
                 source: np.ndarray | None = None, *, recycle: bool = False) -> None:
        self.directory = Path(directory)
        self.recycle = recycle
        self.source = "run payload" if source is not None else "one 1 MiB buffer"
        self.chunks: list[memoryview] = (_cycled_chunks(source, volume_bytes) if source is not None
                                         else _repeated_chunk(volume_bytes))
        self.volume_bytes = sum(len(chunk) for chunk in self.chunks)
        self.samples: list[float] = []  # bytes per second, one per measure()
        self.cpu_ns_per_byte: list[float] = []  # this process's CPU time per byte, one per measure()
        self.paths: list[Path] = []

    def measure(self, *, sync: bool = True) -> float:
        """One probe (after ``os.sync()`` unless ``sync`` is false, then :func:`recycle_pages` if the probe
        recycles); bytes per second."""
        if sync:
            os.sync()
        if self.recycle:
            recycle_pages(self.volume_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f".page-cache-probe-{os.getpid()}-{len(self.paths)}"
        self.paths.append(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        try:
            cpu = time.process_time_ns()
            started = time.perf_counter()
            for chunk in self.chunks:
                os.write(fd, chunk)
            elapsed = time.perf_counter() - started
            cpu = time.process_time_ns() - cpu
        finally:
            os.close(fd)
        rate = self.volume_bytes / elapsed
        self.samples.append(rate)
        self.cpu_ns_per_byte.append(cpu / self.volume_bytes)
        return rate

    @property
    def bytes_per_s(self) -> float:
        """The median of the samples so far."""
        if not self.samples:
            raise ValueError("PageCacheProbe: measure() was never called")
        return sorted(self.samples)[len(self.samples) // 2]

    @property
    def fastest_bytes_per_s(self) -> float:
        """The fastest sample so far: the limit a run bracketed by probes is held against."""
        if not self.samples:
            raise ValueError("PageCacheProbe: measure() was never called")
        return max(self.samples)

    @property
    def mb_per_s(self) -> float:
        """The median of the samples so far, in MB/s (10^6 bytes)."""
        return self.bytes_per_s / MB

    def remove(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


def recycle_pages(volume_bytes: int) -> None:
    """Touch ``volume_bytes`` (and 5% more) of fresh anonymous memory and free it at once, so that the next
    page allocations of about that much -- a probe's or a run's page cache -- get pages the guest has just
    used.  On a virtual machine that hands its free memory back to the host (free page reporting), a page
    handed back costs a host fault when it is used again, several times the CPU of writing into a page freed
    a moment ago.  Which kind a probe or a run gets otherwise depends on what was freed how long before it;
    after this, both get the kind a long-running appliance meets, its page cache recycling its own pages.
    The touch itself faults the pages in; call it outside the clock."""
    buffer = np.empty(int(volume_bytes * 1.05) + 4096, np.uint8)
    buffer[::4096] = 0  # one write per page: each is faulted in
    del buffer  # freed (unmapped) right away: the pages go back to the kernel's free lists


def _repeated_chunk(volume_bytes: int) -> list[memoryview]:
    chunk = memoryview(np.random.default_rng(1).integers(0, 256, CHUNK_BYTES, dtype=np.uint8).tobytes())
    return [chunk] * max(int(volume_bytes) // CHUNK_BYTES, 1)


def _cycled_chunks(rows: np.ndarray, volume_bytes: int) -> list[memoryview]:
    """``volume_bytes`` (whole rows, at least one) of ``rows`` from the first, cycled, in chunks of whole
    rows of about 1 MiB; views of ``rows``, no copy."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.dtype != np.uint8 or not rows.flags.c_contiguous or rows.size == 0:
        raise ValueError(f"PageCacheProbe source: expected a non-empty C-contiguous 2-D uint8 array, got "
                         f"{rows.dtype} of shape {rows.shape}")
    count, width = rows.shape
    left = max(int(volume_bytes) // width, 1)
    step = max(1, CHUNK_BYTES // width)
    chunks = []
    position = 0
    while left:
        take = min(step, count - position, left)
        chunks.append(rows[position : position + take].reshape(-1).data)
        left -= take
        position = (position + take) % count
    return chunks


def _send_files(files: Sequence[tuple[str, int]], port_pipe: Any) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_pipe.send(listener.getsockname()[1])
    port_pipe.close()
    sock, _ = listener.accept()
    try:
        for path, size in files:
            with open(path, "rb") as f:
                sent = 0
                while sent < size:
                    sent += os.sendfile(sock.fileno(), f.fileno(), sent, size - sent)
    finally:
        sock.close()
        listener.close()


class Transfer(NamedTuple):
    """What :func:`loopback_sendfile` moved: bytes received and the seconds it took."""

    sent_bytes: int
    seconds: float


def loopback_sendfile(paths: Sequence[str | os.PathLike[str]], *, max_bytes: int | None = None) -> Transfer:
    """Plain ``os.sendfile`` of the files (their first ``max_bytes`` in all, if given), one after the other
    on one loopback TCP connection, from a forked process to this one (received into a reused 8 MiB buffer).
    The files should be in the page cache already (just written, or read once)."""
    files: list[tuple[str, int]] = []
    budget = max_bytes if max_bytes is not None else 1 << 62
    for p in paths:
        size = min(os.path.getsize(p), budget)
        if size > 0:
            files.append((os.fspath(p), size))
            budget -= size
    expected = sum(size for _, size in files)
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_send_files, args=(files, child), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(30):
            raise RuntimeError("loopback_sendfile: the sending process did not start")
        port = parent.recv()
        buffer = memoryview(bytearray(RECEIVE_BUFFER_BYTES))
        received = 0
        with socket.create_connection(("127.0.0.1", port)) as sock:
            started = time.perf_counter()
            while True:
                n = sock.recv_into(buffer)
                if n == 0:
                    break
                received += n
            elapsed = time.perf_counter() - started
        buffer.release()
    finally:
        parent.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    if received != expected:
        raise RuntimeError(f"loopback_sendfile: received {received} bytes of {expected}")
    return Transfer(received, elapsed)


@dataclass
class Limits:
    """The three limits of one run, in bytes per second, and what was probed.
    ``page_cache_write_bytes_per_s`` is the fastest page-cache sample (one, or the two around a run:
    ``page_cache_samples_bytes_per_s``, in the order taken)."""

    memcpy_bytes_per_s: float
    page_cache_write_bytes_per_s: float
    loopback_sendfile_bytes_per_s: float
    page_cache_probe_bytes: int
    sendfile_probe_bytes: int
    memcpy_probe_bytes: int
    probe: PageCacheProbe | None = field(default=None, repr=False)
    page_cache_samples_bytes_per_s: list[float] = field(default_factory=list)
    page_cache_probe_cpu_ns_per_byte: list[float] = field(default_factory=list)
    page_cache_probe_source: str = "one 1 MiB buffer"

    def ratios(self, bytes_per_s: float) -> dict[str, float]:
        """``bytes_per_s`` as a share of each limit."""
        return {
            "memcpy": round(bytes_per_s / self.memcpy_bytes_per_s, 4),
            "page_cache_write": round(bytes_per_s / self.page_cache_write_bytes_per_s, 4),
            "loopback_sendfile": round(bytes_per_s / self.loopback_sendfile_bytes_per_s, 4),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "memcpy_mb_per_s": round(self.memcpy_bytes_per_s / MB, 1),
            "page_cache_write_mb_per_s": round(self.page_cache_write_bytes_per_s / MB, 1),
            "loopback_sendfile_mb_per_s": round(self.loopback_sendfile_bytes_per_s / MB, 1),
            "page_cache_probe_bytes": self.page_cache_probe_bytes,
            "sendfile_probe_bytes": self.sendfile_probe_bytes,
            "memcpy_probe_bytes": self.memcpy_probe_bytes,
            "page_cache_write_samples_mb_per_s": [round(x / MB, 1)
                                                  for x in self.page_cache_samples_bytes_per_s],
            "page_cache_probe_cpu_ns_per_byte": [round(x, 3) for x in self.page_cache_probe_cpu_ns_per_byte],
            "page_cache_probe_source": self.page_cache_probe_source,
        }

    def describe(self) -> str:
        samples = ""
        if len(self.page_cache_samples_bytes_per_s) > 1:
            samples = "; samples " + " / ".join(f"{x / MB:,.0f}" for x in self.page_cache_samples_bytes_per_s)
        return (f"limits: memcpy {self.memcpy_bytes_per_s / MB:,.0f} MB/s, page-cache write "
                f"{self.page_cache_write_bytes_per_s / MB:,.0f} MB/s "
                f"({self.page_cache_probe_bytes / MB:,.0f} MB{samples}), "
                f"loopback sendfile {self.loopback_sendfile_bytes_per_s / MB:,.0f} MB/s")

    def remove_probe_files(self) -> None:
        """Delete the page-cache probe's files (after the run compared with them)."""
        if self.probe is not None:
            self.probe.remove()


def limits_with_probe(probe: PageCacheProbe, volume_bytes: int, *,
                      sendfile_cap_bytes: int = DEFAULT_SENDFILE_CAP_BYTES) -> Limits:
    """The three limits around ``probe``, which has measured at least once (before a run; after it too when
    bracketing one): page-cache write = its fastest sample; ``sendfile`` of its last file (at most
    ``sendfile_cap_bytes``); memcpy of a working set of ``volume_bytes`` (at least 16 MiB, at most 256 MiB).
    The probe's files stay until :meth:`Limits.remove_probe_files`."""
    sent = loopback_sendfile(probe.paths[-1:], max_bytes=max(sendfile_cap_bytes, CHUNK_BYTES))
    memcpy_bytes = min(max(int(volume_bytes), MIN_PROBE_BYTES), DEFAULT_MEMCPY_WORKING_SET_BYTES)
    memcpy = memcpy_bytes_per_s(memcpy_bytes)
    return Limits(memcpy_bytes_per_s=memcpy, page_cache_write_bytes_per_s=probe.fastest_bytes_per_s,
                  loopback_sendfile_bytes_per_s=sent.sent_bytes / sent.seconds,
                  page_cache_probe_bytes=probe.volume_bytes, sendfile_probe_bytes=sent.sent_bytes,
                  memcpy_probe_bytes=memcpy_bytes, probe=probe,
                  page_cache_samples_bytes_per_s=list(probe.samples),
                  page_cache_probe_cpu_ns_per_byte=list(probe.cpu_ns_per_byte),
                  page_cache_probe_source=probe.source)


def probe_volume_bytes(volume_bytes: int, page_cache_cap_bytes: int = DEFAULT_PAGE_CACHE_CAP_BYTES) -> int:
    """The page-cache probe's volume for a run moving ``volume_bytes``: that, at least 16 MiB, at most
    ``page_cache_cap_bytes``."""
    return min(max(int(volume_bytes), MIN_PROBE_BYTES), page_cache_cap_bytes)


def measure_limits(directory: str | os.PathLike[str], volume_bytes: int, *,
                   page_cache_cap_bytes: int = DEFAULT_PAGE_CACHE_CAP_BYTES,
                   sendfile_cap_bytes: int = DEFAULT_SENDFILE_CAP_BYTES) -> Limits:
    """All three limits for a run moving ``volume_bytes``, measured before it: a page-cache probe of that
    volume (:func:`probe_volume_bytes`) in ``directory``, then :func:`limits_with_probe`.  (``appliance bench
    produce`` brackets its run with probes instead.)

    The probe's file stays until :meth:`Limits.remove_probe_files` -- call it after the run.  Needs free
    space for the probe in ``directory``."""
    probe = PageCacheProbe(directory, probe_volume_bytes(volume_bytes, page_cache_cap_bytes))
    try:
        probe.measure()
        return limits_with_probe(probe, volume_bytes, sendfile_cap_bytes=sendfile_cap_bytes)
    except BaseException:
        probe.remove()
        raise
