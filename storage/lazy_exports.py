"""Lazy package exports (PEP 562), written once for every package's ``__init__``.

A package names its public surface in ``__all__`` and maps each name to the module that defines it; the
name is imported on first access and cached in the package's namespace.  So ``import storage.errors`` does
not load the numba kernels of every other module, and a rename in a module breaks the surface test, not a
user.  It lives in ``storage`` because ``storage`` is the lowest package: every other one may import it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: MutableMapping[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return the ``__getattr__`` and ``__dir__`` of a package whose globals are ``namespace``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
