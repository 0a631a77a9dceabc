"""The cleaned ``.log`` a clean is writing (``storage.cleaner``): batches gathered in a buffer, written out
in chunks, and written back to the disk on the pass's swap thread as the file grows.

The cleaner's kernels write whole batches straight into the free part of the buffer
(:meth:`CleanOutput.room`, then :meth:`CleanOutput.advance`), so a kept batch is copied once, from the
segment's mapping to the buffer; the buffer is the pass's, reused from one group's file to the next.  When
the next batches do not fit, and at the end of each segment, the buffer is written to the file; every
:data:`WRITE_BACK_BYTES` written the swap thread fdatasyncs the file (``PassSwaps.write_back``), so the
fsync that ends the group, which the swap waits for, has only the tail left to write.
"""

from __future__ import annotations

import os
from typing import Final

import numpy as np

from storage.clean_faults import CLEAN_FAULTS
from storage.clean_pass_swaps import PassSwaps

__all__ = ["OUT_CHUNK_BYTES", "WRITE_BACK_BYTES", "CleanOutput"]

OUT_CHUNK_BYTES: Final = 1 << 20  # the pass's output buffer
WRITE_BACK_BYTES: Final = 1 << 20  # a cleaned .log fdatasynced on the swap thread every so many bytes written


class CleanOutput:
    """The cleaned ``.log`` being written: whole batches gathered in ``buffer`` (the pass's, reused from
    group to group; the kernels write into its free part, :meth:`room`), written out when the next ones do
    not fit and at the end of each segment; every :data:`WRITE_BACK_BYTES` written, ``swaps`` writes them
    back on its thread (:meth:`PassSwaps.write_back`), so the fsync that ends the group has little left."""

    def __init__(self, path: str, buffer: np.ndarray, swaps: PassSwaps) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.buffer = buffer
        self.swaps = swaps
        self.used = 0
        self.written = 0
        self.written_back = 0

    @property
    def size_bytes(self) -> int:
        return self.written + self.used

    def room(self, nbytes: int = 0) -> np.ndarray:
        """The buffer's free part, at least ``nbytes`` long: what it holds written out first if need be,
        and a bigger buffer made, for this file, if even the whole is too small."""
        if self.used + nbytes > len(self.buffer):
            self.flush()
            if nbytes > len(self.buffer):
                self.buffer = np.empty(nbytes, np.uint8)
        return self.buffer[self.used:]

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` written at the start of :meth:`room` as held."""
        self.used += nbytes

    def add(self, data: np.ndarray) -> None:
        """Copy whole batches (uint8) in."""
        self.room(len(data))[: len(data)] = data
        self.used += len(data)

    def flush(self) -> None:
        view = self.buffer[: self.used].data
        while view:
            view = view[os.write(self.fd, view):]
        self.written += self.used
        self.used = 0
        if self.written - self.written_back >= WRITE_BACK_BYTES:
            self.swaps.write_back(self.fd)
            self.written_back = self.written
        if CLEAN_FAULTS.armed:
            CLEAN_FAULTS.check("clean.write", self.path)
