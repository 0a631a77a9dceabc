"""The kernels that load eight bytes at once (varints, key hashes, CRCs) read nothing past their data:
each runs over bytes that end exactly where a page the process may not read begins, and gives what its
simple twin gives."""

from __future__ import annotations

import ctypes
import mmap

import crc32c as crc32c_package
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.crc32c_kernel import crc32c
from storage.offset_map import _key_hash_by_bytes, key_hash
from storage.varint import parse_varint, read_varint, read_varint_quick

_PAGE = mmap.PAGESIZE
_PAGES = 4
_region = mmap.mmap(-1, (_PAGES + 1) * _PAGE)
_GUARDED = np.frombuffer(_region, np.uint8)[: _PAGES * _PAGE]
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert _libc.mprotect(_GUARDED.ctypes.data + _PAGES * _PAGE, _PAGE, 0) == 0  # PROT_NONE: a read faults


def _at_the_end(data: bytes) -> np.ndarray:
    """``data`` as the last bytes before the guard page."""
    tail = _GUARDED[len(_GUARDED) - len(data):]
    tail[:] = np.frombuffer(data, np.uint8)
    return tail


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=12), st.integers(0, 12))
def test_quick_varints_read_nothing_past_the_data(data: bytes, cut: int) -> None:
    buf = _at_the_end(data)
    for position in range(len(data) + 1):
        end = min(len(data), position + cut)
        expected = parse_varint(data, position, end)
        assert read_varint_quick(buf, position, end) == expected
        assert read_varint(buf, position, end) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=40))
def test_key_hashes_read_nothing_past_the_data(data: bytes) -> None:
    buf = _at_the_end(data)
    copy = np.frombuffer(data + bytes(16), np.uint8)
    for start in range(len(data) + 1):
        assert key_hash(buf, start, len(data) - start) == _key_hash_by_bytes(copy, start, len(data) - start)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3 * 1024 * 2 + 3 * 128 + 40), st.integers(0, 2**32 - 1))
def test_crcs_read_nothing_past_the_data(length: int, seed: int) -> None:
    data = np.random.default_rng(seed).integers(0, 256, length, np.uint8).tobytes()
    buf = _at_the_end(data)
    assert crc32c(buf, 0, length) == crc32c_package.crc32c(data)
    assert crc32c(_GUARDED, len(_GUARDED) - length, len(_GUARDED)) == crc32c_package.crc32c(data)
