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
  flatter the probe.  Every probe starts after ``os.sync()``, as the runs compared with it should.
* **loopback sendfile** (``os.sendfile`` of a file in the page cache from a forked process to this one over
  TCP on 127.0.0.1, received into a reused 8 MiB buffer): what a broker fetch or a follower's catch-up can do
  at best on this host.

On a shared 2-core machine each figure moves by tens of percent from one second to the next: report the
ratio of a result to its limit, measured next to it, and keep probe files until the run they are compared with
is over (:class:`PageCacheProbe`): a run writing into pages a probe just freed is flattered, and the other way
round.

Public face: :func:`memcpy_bytes_per_s`, :func:`mapped_copy_bytes_per_s`, :class:`PageCacheProbe`,
:func:`loopback_sendfile`, :func:`measure_limits` and the :class:`Limits` it returns.
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
from typing import Any

import numpy as np

__all__ = [
    "Limits",
    "PageCacheProbe",
    "loopback_sendfile",
    "mapped_copy_bytes_per_s",
    "measure_limits",
    "memcpy_bytes_per_s",
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
    """Buffered 1 MiB ``os.write`` of ``volume_bytes`` to a new file in ``directory`` (put it next to the
    logs: the same file system): the page-cache write bandwidth at that moment.

    :meth:`measure` may be called several times (say before each round); files are kept until
    :meth:`remove`, after the runs compared with them, so that neither writes into pages the other just freed
    (on a virtual machine a freshly freed page is several times cheaper than one the host has not backed)."""

    def __init__(self, directory: str | os.PathLike[str], volume_bytes: int) -> None:
        self.directory = Path(directory)
        self.chunks = max(int(volume_bytes) // CHUNK_BYTES, 1)
        self.chunk = np.random.default_rng(1).integers(0, 256, CHUNK_BYTES, dtype=np.uint8).tobytes()
        self.samples: list[float] = []  # bytes per second, one per measure()
        self.paths: list[Path] = []

    @property
    def volume_bytes(self) -> int:
        return self.chunks * CHUNK_BYTES

    def measure(self, *, sync: bool = True) -> float:
        """One probe (after ``os.sync()`` unless ``sync`` is false); bytes per second."""
        if sync:
            os.sync()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f".page-cache-probe-{os.getpid()}-{len(self.paths)}"
        self.paths.append(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        try:
            started = time.perf_counter()
            for _ in range(self.chunks):
                os.write(fd, self.chunk)
            elapsed = time.perf_counter() - started
        finally:
            os.close(fd)
        rate = self.volume_bytes / elapsed
        self.samples.append(rate)
        return rate

    @property
    def bytes_per_s(self) -> float:
        """The median of the samples so far."""
        if not self.samples:
            raise ValueError("PageCacheProbe: measure() was never called")
        return sorted(self.samples)[len(self.samples) // 2]

    @property
    def mb_per_s(self) -> float:
        """The median of the samples so far, in MB/s (10^6 bytes)."""
        return self.bytes_per_s / MB

    def remove(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


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


def loopback_sendfile(paths: Sequence[str | os.PathLike[str]], *, max_bytes: int | None = None
                      ) -> tuple[int, float]:
    """Plain ``os.sendfile`` of the files (their first ``max_bytes`` in all, if given), one after the other
    on one loopback TCP connection, from a forked process to this one (received into a reused 8 MiB buffer);
    (bytes, seconds).  The files should be in the page cache already (just written, or read once)."""
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
    return received, elapsed


@dataclass
class Limits:
    """The three limits of one run, in bytes per second, and what was probed."""

    memcpy_bytes_per_s: float
    page_cache_write_bytes_per_s: float
    loopback_sendfile_bytes_per_s: float
    page_cache_probe_bytes: int
    sendfile_probe_bytes: int
    memcpy_probe_bytes: int
    probe: PageCacheProbe | None = field(default=None, repr=False)

    def ratios(self, bytes_per_s: float) -> dict[str, float]:
        """``bytes_per_s`` as a share of each limit."""
        return {
            "memcpy": round(bytes_per_s / self.memcpy_bytes_per_s, 4),
            "page_cache_write": round(bytes_per_s / self.page_cache_write_bytes_per_s, 4),
            "loopback_sendfile": round(bytes_per_s / self.loopback_sendfile_bytes_per_s, 4),
        }

    def as_json(self) -> dict[str, float | int]:
        return {
            "memcpy_mb_per_s": round(self.memcpy_bytes_per_s / MB, 1),
            "page_cache_write_mb_per_s": round(self.page_cache_write_bytes_per_s / MB, 1),
            "loopback_sendfile_mb_per_s": round(self.loopback_sendfile_bytes_per_s / MB, 1),
            "page_cache_probe_bytes": self.page_cache_probe_bytes,
            "sendfile_probe_bytes": self.sendfile_probe_bytes,
            "memcpy_probe_bytes": self.memcpy_probe_bytes,
        }

    def describe(self) -> str:
        return (f"limits: memcpy {self.memcpy_bytes_per_s / MB:,.0f} MB/s, page-cache write "
                f"{self.page_cache_write_bytes_per_s / MB:,.0f} MB/s "
                f"({self.page_cache_probe_bytes / MB:,.0f} MB), "
                f"loopback sendfile {self.loopback_sendfile_bytes_per_s / MB:,.0f} MB/s")

    def remove_probe_files(self) -> None:
        """Delete the page-cache probe's file (after the run compared with it)."""
        if self.probe is not None:
            self.probe.remove()


def measure_limits(directory: str | os.PathLike[str], volume_bytes: int, *,
                   page_cache_cap_bytes: int = DEFAULT_PAGE_CACHE_CAP_BYTES,
                   sendfile_cap_bytes: int = DEFAULT_SENDFILE_CAP_BYTES) -> Limits:
    """All three limits for a run moving ``volume_bytes``: a page-cache probe of that volume (at least
    16 MiB, at most ``page_cache_cap_bytes``) in ``directory``; ``sendfile`` of that probe file (at most
    ``sendfile_cap_bytes`` of it); memcpy of a working set of up to 256 MiB.

    The probe's file stays until :meth:`Limits.remove_probe_files` -- call it after the run.  Needs free
    space for the probe in ``directory``."""
    volume = min(max(int(volume_bytes), MIN_PROBE_BYTES), page_cache_cap_bytes)
    probe = PageCacheProbe(directory, volume)
    try:
        page_cache = probe.measure()
        sent, seconds = loopback_sendfile(probe.paths[-1:], max_bytes=max(sendfile_cap_bytes, CHUNK_BYTES))
        memcpy_bytes = min(max(int(volume_bytes), MIN_PROBE_BYTES), DEFAULT_MEMCPY_WORKING_SET_BYTES)
        memcpy = memcpy_bytes_per_s(memcpy_bytes)
    except BaseException:
        probe.remove()
        raise
    return Limits(memcpy_bytes_per_s=memcpy, page_cache_write_bytes_per_s=page_cache,
                  loopback_sendfile_bytes_per_s=sent / seconds, page_cache_probe_bytes=probe.volume_bytes,
                  sendfile_probe_bytes=sent, memcpy_probe_bytes=memcpy_bytes, probe=probe)
