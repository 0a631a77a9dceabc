"""Room for the metadata files on a full disk: a reserved ballast file in the meta directory.

Theory of operation
-------------------
Every change of the topic metadata (and every new block of producer ids) is an atomic rewrite: a whole new
file next to the old one, then a rename (``storage.atomic_file``).  On a full disk that new file cannot be
written, so without help a full log dir could not even record the deletion of a topic, the very thing that
would free space.  So the meta directory holds a ballast, ``<log.dirs[0]>/meta/.reserve``: zeros really
written (not a sparse file, which reserves nothing), :func:`reserve_bytes` big.

:meth:`MetaReserve.write` runs a metadata write; if it fails with ENOSPC or EDQUOT, the ballast is removed
(its blocks are free at once) and the write is tried once more; the ballast is then re-created as far as
space allows.  While it is missing (or short), :meth:`MetaReserve.ensure` re-creates it; the supervisor calls
it on its timer, so the ballast is back once retention, a deletion or a person freed space.  A write that
fails even after the ballast is gone raises the error, and the operation changes nothing.

The ballast is as large as two copies of the topic metadata file plus :data:`MIN_RESERVE_BYTES`, so one
rewrite always fits in it.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

__all__ = ["MIN_RESERVE_BYTES", "RESERVE_FILE", "MetaReserve", "is_out_of_space", "reserve_bytes"]

RESERVE_FILE: Final = ".reserve"
MIN_RESERVE_BYTES: Final = 256 * 1024
_CHUNK: Final = bytes(64 * 1024)

_T = TypeVar("_T")

_log = logging.getLogger("appliance.supervisor")


def is_out_of_space(error: BaseException) -> bool:
    """Whether ``error`` says the file system is full (ENOSPC) or the user's quota is (EDQUOT)."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def reserve_bytes(metadata_bytes: int) -> int:
    """The ballast's size for a topic metadata file of ``metadata_bytes``: two copies and a margin."""
    return MIN_RESERVE_BYTES + 2 * metadata_bytes


class MetaReserve:
    """The ballast of one meta directory.  Used by the one process that writes that directory."""

    def __init__(self, meta_dir: str | os.PathLike[str], sized_by: str | os.PathLike[str]) -> None:
        """``sized_by``: the file whose size sets the ballast's (:func:`reserve_bytes`)."""
        self.path = Path(meta_dir) / RESERVE_FILE
        self.sized_by = Path(sized_by)
        self.complete = False

    def wanted_bytes(self) -> int:
        try:
            return reserve_bytes(self.sized_by.stat().st_size)
        except FileNotFoundError:
            return reserve_bytes(0)

    def ensure(self) -> bool:
        """Create or grow the ballast to its size; True once it is complete (a full disk: False, no error)."""
        wanted = self.wanted_bytes()
        try:
            with open(self.path, "ab") as file:
                have = file.tell()
                while have < wanted:
                    have += file.write(_CHUNK[: min(len(_CHUNK), wanted - have)])
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            if self.complete or not is_out_of_space(error):
                _log.warning("%s: cannot reserve %d bytes for metadata writes: %s", self.path, wanted, error)
            self.complete = False
            return False
        if not self.complete:
            _log.info("%s: %d bytes reserved for metadata writes", self.path, wanted)
        self.complete = True
        return True

    def release(self) -> bool:
        """Remove the ballast (its space is free at once); True if there was one."""
        self.complete = False
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def write(self, action: Callable[[], _T], what: str, tmp: str | os.PathLike[str] | None = None) -> _T:
        """Run the metadata write ``action`` (module docstring); ``tmp``: its temporary file, removed if the
        write fails (a partial one would hold space)."""
        try:
            return action()
        except OSError as error:
            _remove(tmp)
            if not is_out_of_space(error) or not self.release():
                raise
            _log.warning("%s: %s; released the metadata reserve %s to make room", what, error, self.path)
        try:
            return action()
        except OSError:
            _remove(tmp)
            raise
        finally:
            self.ensure()


def _remove(path: str | os.PathLike[str] | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
