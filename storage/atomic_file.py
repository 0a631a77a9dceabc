"""Replacing a whole small file atomically: a reader, or a restart after a crash, sees the old contents or
the new ones, never a mix.

Theory of operation
-------------------
:func:`write_atomically` never writes into ``path`` itself.  It writes the new bytes to a temporary file
next to it, ``path + tmp_suffix`` (same directory, so the same file system, so ``rename`` is atomic), then
renames that over ``path``.  A reader that opens ``path`` gets either the old inode or the new one, whole; a
reader that already had the old one open (or mapped) keeps reading it.  With ``durable=True`` (the default)
the steps and what a crash (of the process, or of the machine: a power cut) leaves after each are:

    1. open ``path + tmp_suffix`` (created, or truncated if a crash left one)   ``path``: the old file
    2. write every byte to it (``os.write`` until done)                          ``path``: the old file
    3. ``fsync`` the temporary file: its bytes are on disk                       ``path``: the old file
    4. ``rename`` it over ``path``: the commit point                             old or new, whole
    5. ``fsync`` the directory: the rename itself is on disk                     the new file

so when it returns the new contents survive a power cut.  A step that fails (a full disk: ``ENOSPC``) removes
the temporary file and raises, ``path`` untouched.  Up to step 3 a crash may leave the temporary file behind,
empty or partly written: whoever owns the file deletes ``path + tmp_suffix`` when it opens (the log's writer
deletes every ``*.tmp`` of its partition directory, which is why a file another process writes there uses
another ``tmp_suffix``).  Without step 3 a power cut after step 4 could leave ``path`` empty or torn (the
rename may reach the disk before the data), which is why step 3 comes before the rename.

``durable=False`` skips steps 3 and 5: the replacement is still atomic for readers and against a crash of
the process (the page cache survives it), but after a power cut ``path`` may be old, new, empty or torn.
That is for files whose readers check them and can do without them: indexes (rebuilt from the log) and
producer-state snapshots (CRC-checked; an older one or the log serves instead); it costs no disk wait.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

__all__ = ["TMP_SUFFIX", "fsync_directory", "write_atomically"]

TMP_SUFFIX: Final = ".tmp"


def write_atomically(path: str | os.PathLike[str], data: bytes | bytearray | memoryview, *,
                     durable: bool = True, mode: int = 0o644, tmp_suffix: str = TMP_SUFFIX) -> None:
    """Replace ``path`` by ``data`` through ``path + tmp_suffix`` (steps 1-5 above; 1, 2 and 4 when not
    ``durable``).  ``mode``: the permission bits of a new file (less the umask)."""
    target = os.fspath(path)
    tmp = target + tmp_suffix
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk leaves no half-written temporary file behind
            os.unlink(tmp)
        raise
    if durable:
        fsync_directory(os.path.dirname(target) or ".")


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """``fsync`` a directory: the names created, renamed or removed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
