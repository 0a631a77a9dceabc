"""CRC-32C inside numba kernels: :func:`crc32c` over a span of a ``uint8`` array, and :func:`batch_crcs_ok` /
:func:`fill_batch_crcs` for record batches, so a kernel that walks or writes many batches computes their
checksums without a Python call per batch.

Theory of operation
-------------------
CRC-32C (Castagnoli, reflected, initial and final value ``0xFFFFFFFF``) is what a RecordBatch v2 stores
over its bytes from ``attributes`` to its end.  Where the CPU has SSE 4.2 (``sse4_2`` in ``/proc/cpuinfo``)
:func:`crc32c` compiles to its ``crc32`` instruction (LLVM's ``llvm.x86.sse42.crc32.64.64``, eight bytes
a step, read with unaligned loads, then ``crc32.32.8`` for the last bytes); elsewhere to a table of 256
words, a byte a step.  The choice is made when the kernel is compiled (``numba.extending.overload``), so a
machine without the instruction never compiles it.  The ``crc32c`` package (several streams in parallel)
is faster over one long buffer; these kernels win where the work is many batches of a few KiB, each of
which would otherwise cost a Python call.
"""

from __future__ import annotations

from typing import Any, Final

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from storage.batch_header import ATTRIBUTES_OFFSET, CRC_OFFSET
from storage.llvm_arrays import load_word

__all__ = ["batch_crcs_ok", "crc32c", "crc32c_by_table", "fill_batch_crcs", "has_crc_instruction"]

_POLY: Final = 0x82F63B78  # CRC-32C, reflected
_MASK32 = np.uint64(0xFFFFFFFF)


def has_crc_instruction() -> bool:
    """Whether this CPU has SSE 4.2's ``crc32`` (x86-64 Linux: ``sse4_2`` among ``/proc/cpuinfo``'s flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " sse4_2" in line for line in f)
    except OSError:
        return False


_HARDWARE: Final = has_crc_instruction()


def _table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table[n] = c
    return table


_TABLE: Final = _table()


@intrinsic
def _crc_step64(typingctx: Any, crc: Any, word: Any) -> Any:
    """SSE 4.2 ``crc32`` over eight bytes (``word``, little-endian) into ``crc``."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        int64 = ir.IntType(64)
        function_type = ir.FunctionType(int64, [int64, int64])
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.x86.sse42.crc32.64.64")
        return builder.call(function, [args[0], args[1]])

    return sig, codegen


@intrinsic
def _crc_step8(typingctx: Any, crc: Any, byte: Any) -> Any:
    """SSE 4.2 ``crc32`` over one byte into ``crc`` (its low 32 bits)."""
    sig = types.uint64(types.uint64, types.uint8)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        int32, int8 = ir.IntType(32), ir.IntType(8)
        function_type = ir.FunctionType(int32, [int32, int8])
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.x86.sse42.crc32.32.8")
        result = builder.call(function, [builder.trunc(args[0], int32), args[1]])
        return builder.zext(result, ir.IntType(64))

    return sig, codegen


def _update(crc: Any, data: Any, start: Any, end: Any) -> Any:
    """``crc`` (not inverted) carried over ``data[start:end]``; compiled as :func:`_update_overload` says."""


@overload(_update, inline="always")
def _update_overload(crc: Any, data: Any, start: Any, end: Any) -> Any:
    if _HARDWARE:
        def hardware(crc: Any, data: Any, start: Any, end: Any) -> Any:  # pragma: no cover - compiled
            at = start
            while at + 8 <= end:
                crc = _crc_step64(crc, load_word(data, at))  # type: ignore[call-arg]  # numba: typing context
                at += 8
            while at < end:
                crc = _crc_step8(crc, data[at])  # type: ignore[call-arg]  # numba: typing context
                at += 1
            return crc

        return hardware

    def table(crc: Any, data: Any, start: Any, end: Any) -> Any:  # pragma: no cover - compiled
        return _update_by_table(crc, data, start, end)

    return table


@numba.njit(cache=True, inline="always")
def _update_by_table(crc: Any, data: Any, start: Any, end: Any) -> Any:
    """:func:`_update` without the CRC instruction: a table of 256 words, a byte a step."""
    for at in range(start, end):
        crc = np.uint64(_TABLE[(crc ^ np.uint64(data[at])) & np.uint64(0xFF)]) ^ (crc >> np.uint64(8))
    return crc


@numba.njit(cache=True)
def crc32c_by_table(data: np.ndarray, start: int, end: int) -> int:
    """:func:`crc32c` as a CPU without SSE 4.2 computes it (what the tests check on any machine)."""
    crc = _update_by_table(_MASK32, data, start, end)
    return np.int64((crc ^ _MASK32) & _MASK32)  # type: ignore[return-value]  # numba: an int64


@numba.njit(cache=True)
def crc32c(data: np.ndarray, start: int, end: int) -> int:
    """CRC-32C of ``data[start:end]`` (``uint8``)."""
    crc = _update(_MASK32, data, start, end)
    return np.int64((crc ^ _MASK32) & _MASK32)  # type: ignore[return-value]  # numba: an int64


@numba.njit(cache=True, inline="always")
def _stored_crc(data: np.ndarray, position: int) -> np.uint64:
    at = position + CRC_OFFSET
    return ((np.uint64(data[at]) << np.uint64(24)) | (np.uint64(data[at + 1]) << np.uint64(16))
            | (np.uint64(data[at + 2]) << np.uint64(8)) | np.uint64(data[at + 3]))


@numba.njit(cache=True, nogil=True)
def batch_crcs_ok(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> int:
    """The number of leading batches (at ``positions``, ``sizes`` bytes long) whose stored CRC matches."""
    for i in range(positions.shape[0]):
        position = positions[i]
        crc = _update(_MASK32, data, position + ATTRIBUTES_OFFSET, position + sizes[i]) ^ _MASK32
        if crc & _MASK32 != _stored_crc(data, position):
            return i
    return positions.shape[0]


@numba.njit(cache=True, nogil=True)
def fill_batch_crcs(out: np.ndarray, spans: np.ndarray) -> None:
    """Compute and store the CRC of each batch at ``spans`` (``(start, end)`` rows) in ``out``."""
    for i in range(spans.shape[0]):
        start = spans[i, 0]
        crc = (_update(_MASK32, out, start + ATTRIBUTES_OFFSET, spans[i, 1]) ^ _MASK32) & _MASK32
        at = start + CRC_OFFSET
        for k in range(4):
            out[at + k] = np.uint8((crc >> np.uint64(24 - 8 * k)) & np.uint64(0xFF))
