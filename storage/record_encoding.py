"""What both record encoders share: the per-record constants, their error codes, and the byte copy.

``storage.batch_builder`` encodes records from columns and ``storage.value_lists`` from a list of
``bytes`` read in place; both write Kafka's DefaultRecord (the layout is in ``batch_builder``'s docstring)
with the pieces below, so each is declared once.
"""

from __future__ import annotations

import numba
import numpy as np

from storage.batch_header import HEADER_SIZE, LOG_OVERHEAD

__all__ = ["MAX_INT32", "OK", "RECORD_ATTRIBUTES", "TOO_LONG", "check_records_section", "copy_bytes"]

RECORD_ATTRIBUTES = 0  # the per-record attributes byte; Kafka defines no bits in it
MAX_INT32 = (1 << 31) - 1  # the largest length an int32 (or a varint length) can say

# Named codes the sizing kernels of both encoders return.
OK = 0
TOO_LONG = -3  # one byte string longer than an int32 length can say


def check_records_section(size: int, code: int) -> None:
    """Raise ValueError when a sizing kernel said ``TOO_LONG`` (``size`` is then the record's index) or the
    records section of ``size`` bytes would not fit one batch; the caller has handled its own codes."""
    if code == TOO_LONG:
        raise ValueError(f"record {size} encodes to more than {MAX_INT32} bytes")
    if size + HEADER_SIZE - LOG_OVERHEAD > MAX_INT32:
        raise ValueError(f"records section of {size} bytes is too large for one batch")


@numba.njit(cache=True, inline="always")
def copy_bytes(out: np.ndarray, position: int, data: np.ndarray, start: int, end: int) -> int:
    """Copy ``data[start:end]`` to ``out[position:]``; return the position after it.

    A plain loop with unsigned indexes: numba skips the negative-index wraparound test for them, so LLVM
    vectorizes the copy (slice assignment, or signed indexes, run many times slower on small records:
    docs/storage.md).
    """
    for k in range(end - start):
        out[np.uint64(position + k)] = data[np.uint64(start + k)]
    return position + end - start
