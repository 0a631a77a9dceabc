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
machine without the instruction never compiles it.  These kernels win where the work is many batches of a
few KiB, each of which would otherwise cost a Python call.

One ``crc32`` waits for the one before (its latency is three cycles, its throughput one a cycle), so a span
of ``3 * L`` bytes is cut in three thirds, each carried by its own stream, the three steps of a round
independent (:func:`_three_streams`); then the streams are joined.  The CRC register's update is linear
over GF(2): the register after bytes ``A + B`` is the register after ``A`` carried over ``len(B)`` zero
bytes, XOR the register after ``B`` started from zero.  Carrying a register over ``L`` zero bytes is a
linear map of its 32 bits, computed once at import by squaring the one-zero-bit map
(:func:`_zero_bytes_tables`) and applied as four lookups in tables of 256 words, one per byte of the
register.  ``L`` is 1024 while three of them fit what is left, then 128; the last bytes, fewer than
``3 * 128``, go through one stream.
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

__all__ = [
    "batch_crc_ok",
    "batch_crcs_ok",
    "crc32c",
    "crc32c_by_table",
    "fill_batch_crcs",
    "has_crc_instruction",
]

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


def _apply(operator: list[int], value: int) -> int:
    """The GF(2)-linear map ``operator`` (the images of a register's 32 bits) applied to ``value``."""
    result = 0
    bit = 0
    while value:
        if value & 1:
            result ^= operator[bit]
        value >>= 1
        bit += 1
    return result


def _zero_bytes_tables(length: int) -> np.ndarray:
    """What ``length`` zero bytes do to a CRC register, as four tables of 256 words (one per byte of the
    register: the register's image is the XOR of its bytes' entries).  Feeding a zero bit is linear
    (shift right, XOR the polynomial when the bit shifted out was set), so ``length`` zero bytes are that
    map raised to the power ``8 * length``, by squaring."""
    one_bit = [_POLY] + [1 << (bit - 1) for bit in range(1, 32)]
    power = [1 << bit for bit in range(32)]  # the identity
    square = one_bit
    bits = 8 * length
    while bits:
        if bits & 1:
            power = [_apply(square, image) for image in power]
        square = [_apply(square, image) for image in square]
        bits >>= 1
    tables = np.zeros((4, 256), np.uint32)
    for byte in range(4):
        for value in range(1, 256):
            low = value & -value
            tables[byte, value] = tables[byte, value ^ low] ^ power[8 * byte + low.bit_length() - 1]
    return tables


_LONG: Final = 1024  # bytes a stream takes per step of a long span
_SHORT: Final = 128  # and of a span's rest
_SHIFT_LONG: Final = _zero_bytes_tables(_LONG)
_SHIFT_SHORT: Final = _zero_bytes_tables(_SHORT)


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


@numba.njit(cache=True, inline="always")
def _one_stream(crc: Any, data: Any, start: Any, end: Any) -> Any:
    """``crc`` carried over ``data[start:end]`` with the ``crc32`` instruction, eight bytes a step."""
    at = start
    while at + 8 <= end:
        crc = _crc_step64(crc, load_word(data, at))  # type: ignore[call-arg]  # numba: typing context
        at += 8
    while at < end:
        crc = _crc_step8(crc, data[at])  # type: ignore[call-arg]  # numba: typing context
        at += 1
    return crc


@numba.njit(cache=True, inline="always")
def _shifted(crc: Any, shift: Any) -> Any:
    """``crc`` carried over as many zero bytes as ``shift`` (:func:`_zero_bytes_tables`) stands for."""
    return np.uint64(shift[0, crc & np.uint64(0xFF)] ^ shift[1, (crc >> np.uint64(8)) & np.uint64(0xFF)]
                     ^ shift[2, (crc >> np.uint64(16)) & np.uint64(0xFF)] ^ shift[3, crc >> np.uint64(24)])


@numba.njit(cache=True, inline="always")
def _three_streams(crc: Any, data: Any, at: Any, length: Any, shift: Any) -> Any:
    """``crc`` carried over ``data[at:at + 3 * length]``: three ``crc32`` streams, one a third, advanced
    together (each step waits only on its own stream), then joined: ``shift`` carries a stream's CRC over
    ``length`` zero bytes."""
    first = crc
    second = np.uint64(0)
    third = np.uint64(0)
    for step in range(0, length, 8):
        first = _crc_step64(first, load_word(data, at + step))  # type: ignore[call-arg]  # numba: typing
        second = _crc_step64(second, load_word(data, at + length + step))
        third = _crc_step64(third, load_word(data, at + 2 * length + step))
    return _shifted(_shifted(first, shift) ^ second, shift) ^ third


def _update(crc: Any, data: Any, start: Any, end: Any) -> Any:
    """``crc`` (not inverted) carried over ``data[start:end]``; compiled as :func:`_update_overload` says."""


@overload(_update, inline="always")
def _update_overload(crc: Any, data: Any, start: Any, end: Any) -> Any:
    if _HARDWARE:
        def hardware(crc: Any, data: Any, start: Any, end: Any) -> Any:  # pragma: no cover - compiled
            at = start
            while end - at >= 3 * _LONG:
                crc = _three_streams(crc, data, at, _LONG, _SHIFT_LONG)
                at += 3 * _LONG
            while end - at >= 3 * _SHORT:
                crc = _three_streams(crc, data, at, _SHORT, _SHIFT_SHORT)
                at += 3 * _SHORT
            return _one_stream(crc, data, at, end)

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


@numba.njit(cache=True, inline="always")
def batch_crc_ok(data: np.ndarray, position: int, size: int) -> bool:
    """Whether the batch at ``position`` (``size`` bytes long) holds the CRC of its bytes (for a kernel
    that checks each batch just before it reads it, while its bytes are in the cache)."""
    crc = _update(_MASK32, data, position + ATTRIBUTES_OFFSET, position + size) ^ _MASK32
    return crc & _MASK32 == _stored_crc(data, position)


@numba.njit(cache=True, nogil=True)
def batch_crcs_ok(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> int:
    """The number of leading batches (at ``positions``, ``sizes`` bytes long) whose stored CRC matches."""
    for i in range(positions.shape[0]):
        if not batch_crc_ok(data, positions[i], sizes[i]):
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
