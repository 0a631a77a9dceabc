"""A hint to the CPU that an array element will be read soon: ``prefetch(array, index)`` in numba kernels.

A kernel that looks up many keys in a hash table waits for each random slot to come from memory in turn;
when it first computes the slots of a run of keys and asks for each (this hint), then probes them, the loads
overlap and the probes find the slots in the cache.  Inside a numba kernel :func:`prefetch` compiles to
LLVM's ``llvm.prefetch`` (read, high locality: ``prefetcht0`` on x86-64), which never faults, even for an
address outside the array; called from Python (a kernel's ``py_func`` twin) it does nothing.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from storage.llvm_arrays import element_pointer

__all__ = ["prefetch"]

_READ = 0  # llvm.prefetch's rw argument: a read
_KEEP_IN_ALL_CACHES = 3  # its locality argument: high temporal locality
_DATA_CACHE = 1  # its cache-type argument: the data cache


def prefetch(array: Any, index: Any) -> None:
    """Ask for ``array[index]`` (1-d C-contiguous) to be brought into the cache; a hint, nothing else."""


@intrinsic
def _prefetch_intrinsic(typingctx: Any, array: Any, index: Any) -> Any:
    sig = types.void(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = element_pointer(context, builder, signature, args)
        byte_pointer = ir.IntType(8).as_pointer()
        int32 = ir.IntType(32)
        function_type = ir.FunctionType(ir.VoidType(), [byte_pointer, int32, int32, int32])
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.prefetch.p0i8")
        builder.call(function, [builder.bitcast(pointer, byte_pointer), ir.Constant(int32, _READ),
                                ir.Constant(int32, _KEEP_IN_ALL_CACHES), ir.Constant(int32, _DATA_CACHE)])
        return context.get_dummy_value()

    return sig, codegen


@overload(prefetch, inline="always")
def _prefetch_overload(array: Any, index: Any) -> Any:
    def impl(array: Any, index: Any) -> None:  # pragma: no cover - compiled
        _prefetch_intrinsic(array, index)  # type: ignore[call-arg]

    return impl
