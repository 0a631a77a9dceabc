"""What ``appliance bench`` prints and writes: latency percentiles, the live progress line, the Kafka-style
summary and the one JSON object of a run.

The JSON object (``--json FILE``), one per run::

    {
      "command": "produce",                  # produce | consume | e2e | replicate
      "records": 2000000,                    # records measured (warm-up excluded)
      "bytes": 200000000,                    # payload bytes (keys + values) of those records
      "seconds": 1.234,                      # wall time, first record to the last acknowledgement/arrival
      "records_per_s": 1620745.5,
      "mb_per_s": 162.1,                     # MB = 10^6 bytes
      "latency_ms": {"kind": "send-to-ack", "samples": 2000, "avg": .., "max": .., "p50": .., "p95": ..,
                     "p99": .., "p99_9": ..},
      "config": {...},                       # every option of the run, defaults filled in
      "limits": {"memcpy_mb_per_s": .., "page_cache_write_mb_per_s": .., "loopback_sendfile_mb_per_s": ..,
                 ...probe sizes...},         # measured in the same run (bench.limits)
      "ratios": {"memcpy": .., "page_cache_write": .., "loopback_sendfile": ..},   # mb_per_s / each limit
      "primary_limit": "page_cache_write",   # the limit this command is held against
      "extra": {...},                        # command-specific figures (log bytes, CPU, memory, notes)
      "notes": ["..."],                      # what was not available, what a figure means
      "started_at": "2026-11-22T07:00:00Z",
      "host": {"cpus": 2, "python": "3.11.2", "machine": "x86_64", "loadavg_1m_at_end": 1.2}  # others' load
    }
"""

from __future__ import annotations

import contextlib
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

import numpy as np

from bench.limits import MB, Limits

__all__ = ["LATENCY_KEYS", "RESULT_KEYS", "Progress", "Schedstat", "latency_summary", "make_result",
           "process_cpu_ns", "profile_report", "profiled", "summary_line", "thread_schedstat", "write_json"]


def process_cpu_ns(pids: Iterable[int], *, missing_ok: bool = False) -> int:
    """User + system CPU time of the processes ``pids`` (all their threads), in ns, from ``/proc/PID/stat``.

    A process that is gone raises FileNotFoundError, or counts 0 with ``missing_ok`` (a run's processes may
    end before the last reading)."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state is fields[0]
        except (FileNotFoundError, ProcessLookupError):
            if missing_ok:
                continue
            raise
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * tick_ns


class Schedstat(NamedTuple):
    """A thread's scheduler times so far: ns on a CPU, and ns runnable but waiting for one."""

    on_cpu_ns: int
    waiting_ns: int


def thread_schedstat() -> Schedstat:
    """The calling thread's :class:`Schedstat`, from ``/proc/self/task/TID/schedstat``; zeros where there is
    no such file."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
    except OSError:
        return Schedstat(0, 0)
    return Schedstat(int(on_cpu), int(waiting))


RESULT_KEYS = ("command", "records", "bytes", "seconds", "records_per_s", "mb_per_s", "latency_ms", "config",
               "limits", "ratios", "primary_limit", "extra", "notes", "started_at", "host")
LATENCY_KEYS = ("kind", "samples", "avg", "max", "p50", "p95", "p99", "p99_9")
_PERCENTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("p99_9", 99.9))


def latency_summary(samples_ns: Sequence[int] | np.ndarray, kind: str) -> dict[str, Any]:
    """avg, max and percentiles in ms of latency samples given in ns (None when there are none)."""
    values = np.asarray(samples_ns, dtype=np.float64)
    out: dict[str, Any] = {"kind": kind, "samples": int(values.size)}
    if values.size == 0:
        out.update({key: None for key in ("avg", "max", *(name for name, _ in _PERCENTILES))})
        return out
    values = values / 1e6
    out["avg"] = round(float(values.mean()), 4)
    out["max"] = round(float(values.max()), 4)
    for name, q in _PERCENTILES:
        out[name] = round(float(np.percentile(values, q)), 4)
    return out


class Progress:
    """A live line on stderr, at most once a second: records, rate, MB/s, elapsed, ETA.  Silent unless
    ``enabled`` (``appliance bench`` enables it on a TTY or with ``--progress``).  Cheap to call often:
    :meth:`update` only looks at the clock."""

    def __init__(self, total_records: int, record_bytes: int, *, enabled: bool, label: str = "",
                 stream: IO[str] | None = None) -> None:
        self.total = total_records
        self.record_bytes = record_bytes
        self.enabled = enabled
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._next = self.started + 1.0
        self._printed = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def restart(self) -> None:
        self.started = time.monotonic()
        self._next = self.started + 1.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 1.0
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 and self.total > done else 0.0
        line = (f"{self.label}{done:,} / {self.total:,} records, {rate:,.0f} records/s "
                f"({rate * self.record_bytes / MB:,.1f} MB/s), elapsed {elapsed:.1f} s, ETA {eta:.1f} s")
        if self._tty:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._printed = True

    def finish(self) -> None:
        if self.enabled and self._printed and self._tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def make_result(command: str, *, records: int, payload_bytes: int, seconds: float,
                latency: Mapping[str, Any], config: Mapping[str, Any], limits: Limits | None,
                primary_limit: str | None, extra: Mapping[str, Any] | None = None,
                notes: Sequence[str] = (), started_at: float | None = None) -> dict[str, Any]:
    """The JSON object of one run (the keys in :data:`RESULT_KEYS`, documented in the module docstring)."""
    seconds = max(seconds, 1e-9)
    rate = records / seconds
    bytes_per_s = payload_bytes / seconds
    started = datetime.datetime.fromtimestamp(started_at if started_at is not None else time.time(),
                                              datetime.UTC)
    return {
        "command": command,
        "records": int(records),
        "bytes": int(payload_bytes),
        "seconds": round(seconds, 6),
        "records_per_s": round(rate, 1),
        "mb_per_s": round(bytes_per_s / MB, 2),
        "latency_ms": dict(latency),
        "config": dict(config),
        "limits": limits.as_json() if limits is not None else None,
        "ratios": limits.ratios(bytes_per_s) if limits is not None else None,
        "primary_limit": primary_limit,
        "extra": dict(extra or {}),
        "notes": list(notes),
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                 "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def summary_line(result: Mapping[str, Any]) -> str:
    """Kafka's perf-test summary: "N records sent, X records/sec (Y MB/sec), A ms avg latency, B ms max
    latency, p50 / p95 / p99 / p99.9", then the ratios to the limits."""
    verb = {"produce": "sent", "consume": "consumed", "e2e": "delivered", "replicate": "replicated"}.get(
        result["command"], "moved")
    lat = result["latency_ms"]
    line = (f"{result['records']:,} records {verb}, {result['records_per_s']:,.1f} records/sec "
            f"({result['mb_per_s']:,.2f} MB/sec)")
    if lat.get("samples"):
        line += (f", {_ms(lat['avg'])} avg latency, {_ms(lat['max'])} max latency, {_ms(lat['p50'])} 50th, "
                 f"{_ms(lat['p95'])} 95th, {_ms(lat['p99'])} 99th, {_ms(lat['p99_9'])} 99.9th "
                 f"({lat['kind']})")
    line += "."
    ratios = result.get("ratios")
    if ratios:
        primary = result.get("primary_limit")
        parts = []
        labels = (("page_cache_write", "page-cache write"), ("loopback_sendfile", "loopback sendfile"),
                  ("memcpy", "memcpy"))
        for key, label in labels:
            mark = " (the limit for this path)" if key == primary else ""
            parts.append(f"{ratios[key]:.3f} of {label}{mark}")
        line += "\nratios: " + ", ".join(parts) + "."
    return line


def write_json(path: str, result: Mapping[str, Any]) -> None:
    """Write ``result`` to ``path`` ("-": stdout) as one JSON object, atomically for a file."""
    text = json.dumps(result, indent=2, sort_keys=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """cProfile the block into ``path`` (pstats format; nothing when ``path`` is None)."""
    if path is None:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(path)


def profile_report(path: str, limit: int = 25) -> str:
    """The top of a pstats file: functions by own time (tottime), then by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()
