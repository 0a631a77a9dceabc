"""The address of an array element inside a numba intrinsic's code generation.

The kernels that reach below numba (a prefetch hint, an unaligned 8-byte load, an acquire load or release
store) all start from the same place: the LLVM pointer to ``array[index]`` of a 1-d array argument, without
negative-index wrap-around.  :func:`element_pointer` gives it from an intrinsic's ``codegen`` arguments.
"""

from __future__ import annotations

from typing import Any

from numba.core import cgutils

__all__ = ["element_pointer"]


def element_pointer(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """The pointer to ``args[0][args[1]]`` (the intrinsic's array and index arguments, in that order)."""
    array_type = signature.args[0]
    array_struct = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, array_struct, [args[1]], wraparound=False)
