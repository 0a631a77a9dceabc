"""The one place that states the memory-ordering assumption of every shared-memory protocol in ``ipc``.

Theory of operation
-------------------
Processes share rings and state pages through ``mmap``.  Each shared field has exactly one writer, and a
writer *publishes* a field only after the data it describes is written (a frame length after the frame body,
a read cursor after the frames are appended and acknowledged, a log end offset after the bytes are in the
log).  A reader that sees the published value may then read the data it describes.  That needs two things:

1. **Stores become visible in program order, and loads are performed in program order.**  x86-64 is TSO
   (total store order): a store is never reordered with an older store and a load is never reordered with an
   older load (Intel SDM vol. 3A, 8.2.2).  So on x86-64 "write body, then store length" is seen by another
   core as exactly that, and "load length, then load body" never reads a body older than the length.
   No fence is needed for publish/consume.  Other architectures (ARM, POWER) reorder stores: this module
   refuses to import there rather than corrupt data silently; porting means making :func:`publish_int64`
   and :func:`publish_int32` release stores.

2. **The compiler does not move the stores either.**  From Python, each store through a ``memoryview`` or a
   numpy array is a separate call into C, a real aligned ``mov`` into the mapped page: CPython cannot move one
   store past another across those opaque calls.  A numba kernel that *writes* data returns to Python before
   Python publishes, which orders them the same way.  Inside a numba kernel that *reads* published fields,
   :func:`load_acquire` keeps LLVM from hoisting later loads above the published one.

Aligned 4- and 8-byte stores and loads are single instructions, so no reader sees half of a published value
(torn reads are impossible for aligned fields; every field in the layouts is naturally aligned, asserted at
import in the descriptor modules).

The one exception: store-then-load across processes.  TSO *does* let a load pass an older store to a
different address (the store sits in the store buffer).  The sleep/wake protocol (``ipc/wakeup.py``) is
exactly that pattern ("I set my waiting flag, then check for work" against "I publish work, then check the
waiting flag"), so both sides put :func:`full_fence` between their store and their load.  A fence costs one
numba call and a ``lock or`` (a full barrier on x86-64).

Everything in ``ipc`` that publishes a field goes through :func:`publish_int64` / :func:`publish_int32`;
everything that reads one goes through :func:`load_int64` / :func:`load_int32`.  They are trivially small on
purpose: their value is that the assumption is written down once, next to the code that relies on it, and
tested under multi-process contention (``tests/ipc/test_ring_contention.py``).
"""

from __future__ import annotations

import platform
from typing import Any

import numba
from numba import types
from numba.extending import intrinsic, overload

from storage.llvm_arrays import element_pointer

__all__ = [
    "full_fence",
    "load_acquire",
    "load_int32",
    "load_int64",
    "publish_int32",
    "publish_int64",
    "store_release",
]

_TSO_MACHINES = ("x86_64", "amd64", "AMD64", "i686", "x86")
if platform.machine() not in _TSO_MACHINES:  # pragma: no cover - we only run on x86-64
    raise ImportError(
        f"ipc.memory_order assumes x86-64 total store order; this machine is {platform.machine()!r}. "
        "Make publish_int32/publish_int64 release stores before using the rings here."
    )


def publish_int64(words: memoryview, index: int, value: int) -> None:
    """Publish ``value`` into the 8-byte-aligned int64 ``words[index]`` of a ``memoryview.cast('q')``.

    Every store the caller made before this call is visible to another process before this one (TSO).
    """
    words[index] = value


def publish_int32(words: memoryview, index: int, value: int) -> None:
    """Publish ``value`` into the 4-byte-aligned int32 ``words[index]`` of a ``memoryview.cast('i')``."""
    words[index] = value


def load_int64(words: memoryview, index: int) -> int:
    """Read a published int64.  Loads issued after this one never see data older than it (TSO)."""
    value: int = words[index]
    return value


def load_int32(words: memoryview, index: int) -> int:
    """Read a published int32 (a frame length)."""
    value: int = words[index]
    return value


@intrinsic
def _fence_seq_cst(typingctx: Any) -> Any:
    sig = types.void()

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _load_acquire_intrinsic(typingctx: Any, array: Any, index: Any) -> Any:
    sig = array.dtype(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = element_pointer(context, builder, signature, args)
        return builder.load_atomic(pointer, ordering="acquire", align=signature.args[0].dtype.bitwidth // 8)

    return sig, codegen


@intrinsic
def _store_release_intrinsic(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    sig = types.void(array, index, value)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = element_pointer(context, builder, signature, args)
        stored = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        builder.store_atomic(stored, pointer, ordering="release", align=signature.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()

    return sig, codegen


def load_acquire(array: Any, index: int) -> Any:
    """``array[index]`` (1-d C-contiguous numpy array) as an acquire load.

    Inside a numba kernel it compiles to an atomic acquire load (a plain ``mov`` on x86-64 that LLVM may not
    move later loads above); called from Python (a kernel's ``py_func`` twin) it is the plain load, which
    CPython already issues in program order.
    """
    return array[index]


def store_release(array: Any, index: int, value: int) -> None:
    """``array[index] = value`` as a release store; see :func:`load_acquire`."""
    array[index] = value


@overload(load_acquire, inline="always")
def _load_acquire_overload(array: Any, index: Any) -> Any:
    def impl(array: Any, index: Any) -> Any:  # pragma: no cover - compiled
        return _load_acquire_intrinsic(array, index)  # type: ignore[call-arg]

    return impl


@overload(store_release, inline="always")
def _store_release_overload(array: Any, index: Any, value: Any) -> Any:
    def impl(array: Any, index: Any, value: Any) -> None:  # pragma: no cover - compiled
        _store_release_intrinsic(array, index, value)  # type: ignore[call-arg]

    return impl


@numba.njit(cache=True)
def full_fence() -> None:
    """A full memory barrier (``lock or`` on x86-64): no load after it passes a store before it.

    Used only by the sleep/wake protocol, between "store my flag / my data" and "load the other side's".
    """
    _fence_seq_cst()  # type: ignore[call-arg]
