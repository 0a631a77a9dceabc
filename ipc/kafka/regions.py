"""FileRegion: a placeholder for record bytes that stay in a file until ``os.sendfile`` moves them.

A Fetch response is mostly record bytes already lying in segment files.  The encoder does not read them:
wherever a ``records`` field holds a :class:`FileRegion`, :func:`ipc.kafka.codec.encode_response_parts`
writes the int32 length (``size``) and then emits the region itself as a separate part.  The connection
writes the ``bytes`` parts with ``send`` and each region with ``os.sendfile(sock, fd, position, size)``.
The frame's size prefix already counts every region's ``size``, so the bytes sent must be exactly ``size``:
the caller must never hand in a region that extends past what it knows is in the file (the high watermark).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FileRegion"]


class FileRegion(NamedTuple):
    """``size`` bytes of the open file ``fd`` starting at byte ``position``.  No I/O happens here."""

    fd: int
    position: int  # byte index in the file
    size: int  # bytes to send
