"""Value lists: records read where CPython keeps them.

The producer's per-record path gathers values in a plain Python list of ``bytes``.  Packing such a list into
a column first (``b"".join`` and one ``len`` per record) costs interpreter time per record and, for large
values, a second full copy through freshly allocated memory (docs/storage.md).  So ``storage.batch_builder``'s
:func:`~storage.batch_builder.build_into` and :func:`~storage.batch_builder.build` also take the list itself
(value-only records: null keys, no headers, the batch's timestamp): the two kernels here,
``_list_records_size`` and ``_encode_list``, read each value where CPython keeps it (the object layout is
declared and checked below), and every value is copied exactly once, into the batch.

Each record is Kafka's DefaultRecord (see ``storage.batch_builder``) with attributes 0, timestampDelta 0,
keyLength -1 and headerCount 0.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

from storage.record_encoding import (
    MAX_INT32,
    OK,
    RECORD_ATTRIBUTES,
    TOO_LONG,
    check_records_section,
    copy_bytes,
)
from storage.varint import size_of_varint, write_varint

__all__ = ["VALUE_LISTS_IN_PLACE", "encode_value_list", "value_list_records_size"]

_NOT_BYTES = -6  # a value list item that is neither exactly bytes nor None

# ``id(obj)`` is the object's address in CPython.  The two objects the kernels read, on a 64-bit build::
#
#     PyListObject (the values)                    PyBytesObject (one value)
#     +0   ob_refcnt   int64                       +0   ob_refcnt   int64
#     +8   ob_type     pointer                     +8   ob_type     pointer: id(bytes), checked per item
#     +16  ob_size     int64: items                +16  ob_size     int64: length in bytes
#     +24  ob_item     pointer to ob_size          +24  ob_shash    int64: cached hash
#                      item pointers               +32  ob_sval     the bytes
#     +32  allocated   int64
#
# The offsets are derived from the interpreter's own sizes (the object header ends where ``ob_size``
# begins; ``ob_item`` follows the variable-size header; ``bytes.__basicsize__`` counts the one byte of
# ``ob_sval`` it declares) and checked against real objects at import.  Where anything disagrees (another
# interpreter or build), :data:`VALUE_LISTS_IN_PLACE` is False and a list is packed into a ByteColumn first.
# Why the reads are safe: the caller's list keeps every item alive and unmoved (CPython never moves an
# object); the kernels run holding the GIL, so no thread changes the list meanwhile; an item's type pointer
# is checked to be exactly ``bytes`` (or the item to be None) before any other field of it is read.

_TYPE_OFFSET = object.__basicsize__ - ctypes.sizeof(ctypes.c_void_p)  # ob_type ends the object header
_SIZE_OFFSET = object.__basicsize__  # ob_size follows the object header
_LIST_ITEMS_OFFSET = tuple.__basicsize__  # a tuple is the variable-size header and its inline items
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1  # ob_sval: the basic size counts its first byte
# The addresses of ``bytes`` and ``None`` change from process to process (they live in the interpreter's
# image): the kernels take them as arguments, never as globals frozen into their on-disk cache.


@intrinsic
def _int64_pointer(typingctx: Any, address: Any) -> Any:
    sig = types.CPointer(types.int64)(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def _uint8_pointer(typingctx: Any, address: Any) -> Any:
    sig = types.CPointer(types.uint8)(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


def _int64_at(address: int) -> int:
    """The int64 stored at ``address`` (a compiled load in a kernel; ctypes in the ``py_func`` twins)."""
    return int(ctypes.c_int64.from_address(address).value)


def _bytes_at(address: int, size: int) -> np.ndarray:
    """``size`` (> 0) bytes at ``address`` as a uint8 array viewing that memory (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


@overload(_int64_at, inline="always")
def _int64_at_overload(address: Any) -> Any:
    def impl(address: Any) -> Any:  # pragma: no cover - compiled
        return _int64_pointer(address)[0]  # type: ignore[call-arg]

    return impl


@overload(_bytes_at, inline="always")
def _bytes_at_overload(address: Any, size: Any) -> Any:
    def impl(address: Any, size: Any) -> Any:  # pragma: no cover - compiled
        return numba.carray(_uint8_pointer(address), size)  # type: ignore[call-arg]

    return impl


@numba.njit(cache=True, inline="always")
def _value_length(item: int, bytes_type: int, none: int) -> int:
    """The length of a value list item: -1 for None (at ``none``), -2 for anything not exactly bytes
    (whose type object is at ``bytes_type``)."""
    if item == none:
        return -1
    if _int64_at(item + _TYPE_OFFSET) != bytes_type:
        return -2
    return _int64_at(item + _SIZE_OFFSET)


@numba.njit(cache=True)
def _list_records_size(list_address: int, count: int, bytes_type: int, none: int) -> tuple[int, int]:
    """Check and size the first ``count`` items of the list at ``list_address``: ``(records section bytes,
    OK)``, or ``(index of the bad item, code)``."""
    if count > _int64_at(list_address + _SIZE_OFFSET):
        return count, _NOT_BYTES
    items = _int64_at(list_address + _LIST_ITEMS_OFFSET)
    total = 0
    for i in range(count):
        length = _value_length(_int64_at(items + 8 * i), bytes_type, none)
        if length == -2:
            return i, _NOT_BYTES
        # attributes, timestampDelta 0, keyLength -1, headerCount 0: one byte each
        body = 4 + size_of_varint(i) + size_of_varint(length) + max(length, 0)
        if body > MAX_INT32:
            return i, TOO_LONG
        total += size_of_varint(body) + body
    return total, OK


@numba.njit(cache=True)
def _encode_list(out: np.ndarray, position: int, limit: int, list_address: int, count: int, bytes_type: int,
                 none: int) -> int:
    """Write the records section of the first ``count`` items of a value list, sized by
    ``_list_records_size`` to end at ``limit`` (<= ``out.size``), at ``position``; return its end.

    Checks again what it reads (a list changed since it was sized) and never writes at or past ``limit``:
    then it returns -1 and the caller raises.
    """
    if count > _int64_at(list_address + _SIZE_OFFSET) or limit > out.size:
        return -1
    items = _int64_at(list_address + _LIST_ITEMS_OFFSET)
    for i in range(count):
        item = _int64_at(items + 8 * i)
        length = _value_length(item, bytes_type, none)
        if length == -2:
            return -1
        body = 4 + size_of_varint(i) + size_of_varint(length) + max(length, 0)
        if position + size_of_varint(body) + body > limit:
            return -1
        position = write_varint(out, position, body)
        out[position] = RECORD_ATTRIBUTES
        out[position + 1] = 0  # timestampDelta
        position = write_varint(out, position + 2, i)
        out[position] = 1  # keyLength -1 (zig-zag)
        position = write_varint(out, position + 1, length)
        if length > 0:
            position = copy_bytes(out, position, _bytes_at(item + _BYTES_DATA_OFFSET, length), 0, length)
        out[position] = 0  # headerCount
        position += 1
    return position


def _check_object_layout() -> bool:
    """Do real objects sit where the declared offsets say?  (Read with ctypes: nothing compiled yet.)"""
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False
    sample = bytes(range(7, 40))
    items = [sample, None]
    item_pointers = _int64_at(id(items) + _LIST_ITEMS_OFFSET)
    return (
        _int64_at(id(items) + _SIZE_OFFSET) == 2
        and _int64_at(item_pointers) == id(sample)
        and _int64_at(item_pointers + 8) == id(None)
        and _int64_at(id(sample) + _TYPE_OFFSET) == id(bytes)
        and _int64_at(id(sample) + _SIZE_OFFSET) == len(sample)
        and _bytes_at(id(sample) + _BYTES_DATA_OFFSET, len(sample)).tobytes() == sample
    )


VALUE_LISTS_IN_PLACE = _check_object_layout()  # False: value lists are packed into a ByteColumn first


def value_list_records_size(values: list[bytes | None]) -> int:
    """Exact bytes of the records section of a batch of these values (ValueError / TypeError for bad ones).

    Only when :data:`VALUE_LISTS_IN_PLACE`; otherwise pack the list into a ByteColumn.
    """
    count = len(values)
    if count < 1:
        raise ValueError(f"a record batch needs at least one record, got {count}")
    size, code = _list_records_size(id(values), count, id(bytes), id(None))
    if code == _NOT_BYTES:
        raise TypeError(f"values[{size}]: expected bytes or None, got {type(values[size]).__name__}")
    check_records_section(size, code)
    return int(size)


def encode_value_list(out: np.ndarray, position: int, values: list[bytes | None], count: int,
                      records_bytes: int) -> int:
    """Write the records section of the first ``count`` items of ``values``, sized by
    :func:`value_list_records_size` to ``records_bytes``, at ``position``; return its end.  ValueError
    (nothing written past that room) if the list changed since it was sized."""
    end = int(_encode_list(out, position, position + records_bytes, id(values), count, id(bytes), id(None)))
    if end != position + records_bytes:
        raise ValueError(f"the list of {count} values changed while its batch was built")
    return end
