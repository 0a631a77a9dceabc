"""The address of an array element inside a numba intrinsic's code generation.

The kernels that reach below numba (a prefetch hint, an unaligned 8-byte load, an acquire load or release
store) all start from the same place: the LLVM pointer to ``array[index]`` of a 1-d array argument, without
negative-index wrap-around.  :func:`element_pointer` gives it from an intrinsic's ``codegen`` arguments;
:func:`load_word` is the unaligned 8-byte load itself (the CPU's byte order: little-endian on x86-64).

:func:`address_of` and :func:`load_word_at` are the same load split in two, for a helper called once per
record that must not take the array: numba counts references to an array passed into an inlined function
whose body loops, and each count is an atomic instruction, slower than the loop it guards.  An address is a
plain integer; it stays valid while the caller holds the array.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["address_of", "element_pointer", "load_word", "load_word_at"]


def element_pointer(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """The pointer to ``args[0][args[1]]`` (the intrinsic's array and index arguments, in that order)."""
    array_type = signature.args[0]
    array_struct = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, array_struct, [args[1]], wraparound=False)


@intrinsic
def load_word(typingctx: Any, array: Any, index: Any) -> Any:
    """``array[index:index + 8]`` (a ``uint8`` array) as a ``uint64`` in the CPU's byte order: one
    unaligned load, no bounds check (the caller keeps ``index + 8`` inside the array)."""
    sig = types.uint64(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = element_pointer(context, builder, signature, args)
        word_pointer = builder.bitcast(pointer, ir.IntType(64).as_pointer())
        return builder.load(word_pointer, align=1)

    return sig, codegen


@intrinsic
def address_of(typingctx: Any, array: Any, index: Any) -> Any:
    """The address of ``array[index]`` as an ``int64`` (for :func:`load_word_at`)."""
    sig = types.int64(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.ptrtoint(element_pointer(context, builder, signature, args), ir.IntType(64))

    return sig, codegen


@intrinsic
def load_word_at(typingctx: Any, address: Any) -> Any:
    """The eight bytes at ``address`` (:func:`address_of`) as a ``uint64`` in the CPU's byte order: one
    unaligned load; the caller keeps the eight bytes inside the array the address came from."""
    sig = types.uint64(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()), align=1)

    return sig, codegen
