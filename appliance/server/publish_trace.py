"""A benchmark-only trace of a partition writer's rounds: when each round started and when it published.

Theory of operation
-------------------
The produce-to-consume latency of the local path has three shares: the producer's batching and the ring up
to the writer's drain round that picks the batch up; the round itself (validate, append, publish the high
watermark); the consumer's wait and decode after the publish.  The first and last are seen by the benchmark
(the record's send stamp, its arrival); the middle one only by the writer.  With the environment variable
``APPLIANCE_PUBLISH_TRACE_DIR`` set (a directory) when ``appliance serve`` starts, each writer keeps one row
per round that appended something, in memory::

    +-------------------------------+  TRACE_ROW, 32 bytes, little-endian
    | round_start_ns (i64)     @0   |  CLOCK_MONOTONIC when the drain round began (after its wake-up)
    | published_ns (i64)       @8   |  CLOCK_MONOTONIC right after the high watermark was stored
    | end_offset (i64)         @16  |  the log end offset published: the round holds offsets below it
    | append_start_ns (i64)    @24  |  CLOCK_MONOTONIC when the log append began (frames peeked,
    +-------------------------------+  validated and deduplicated by then)

and appends them to ``<dir>/<topic>-<partition>.<pid>.trace`` when it goes idle (a park that timed out),
when its buffer is full and when it closes: never during a busy stretch, so the trace costs the round two
clock reads and a row store.  Without the variable nothing is recorded (one ``is None`` test per round).
:func:`read_traces` loads every row for a partition, and :func:`round_times` maps record offsets to the
round that published them.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Final

import numpy as np

__all__ = ["TRACE_DIR_ENV", "TRACE_ROW", "PublishTrace", "read_traces", "round_times"]

TRACE_DIR_ENV: Final = "APPLIANCE_PUBLISH_TRACE_DIR"
TRACE_ROW: Final = np.dtype([("round_start_ns", "<i8"), ("published_ns", "<i8"), ("end_offset", "<i8"),
                             ("append_start_ns", "<i8")])
assert TRACE_ROW.itemsize == 32
_ROWS: Final = 1 << 16


class PublishTrace:
    """One writer's rows, flushed to its file in bulk.  :meth:`maybe_open` returns None when not tracing."""

    __slots__ = ("_count", "_path", "_rows", "append_start_ns", "round_start_ns")

    def __init__(self, path: str) -> None:
        self._path = path
        self._rows = np.zeros(_ROWS, dtype=TRACE_ROW)
        self._count = 0
        self.round_start_ns = 0
        self.append_start_ns = 0

    @classmethod
    def maybe_open(cls, topic: str, partition: int) -> PublishTrace | None:
        directory = os.environ.get(TRACE_DIR_ENV)
        if not directory:
            return None
        return cls(os.path.join(directory, f"{topic}-{partition}.{os.getpid()}.trace"))

    def published(self, end_offset: int) -> None:
        """Note the round that began at ``round_start_ns`` and has just published ``end_offset``."""
        row = self._rows[self._count]
        row["round_start_ns"] = self.round_start_ns
        row["published_ns"] = time.monotonic_ns()
        row["end_offset"] = end_offset
        row["append_start_ns"] = self.append_start_ns
        self._count += 1
        if self._count == _ROWS:
            self.flush()

    def flush(self) -> None:
        if self._count:
            with open(self._path, "ab") as file:
                file.write(self._rows[: self._count].tobytes())
            self._count = 0


def read_traces(directory: str, topic: str, partition: int) -> np.ndarray:
    """Every traced round of ``topic``-``partition`` in ``directory`` (all writer pids), by end offset."""
    pattern = os.path.join(glob.escape(directory), f"{glob.escape(topic)}-{partition}.*.trace")
    parts = [np.fromfile(path, dtype=TRACE_ROW) for path in glob.glob(pattern)]
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=TRACE_ROW)
    return rows[np.argsort(rows["end_offset"], kind="stable")]


def round_times(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The row (:data:`TRACE_ROW`) of the round that published each of ``offsets``; all -1 where no traced
    round holds the offset."""
    out = np.full(len(offsets), -1, dtype=TRACE_ROW)
    if len(rows) == 0:
        return out
    index = np.searchsorted(rows["end_offset"], offsets, side="right")
    found = index < len(rows)
    out[found] = rows[index[found]]
    return out
