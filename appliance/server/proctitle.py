"""Process names in ``ps``: ``appliance: supervisor``, ``appliance: writer orders-3``.

Linux shows two names for a process, and this module sets both:

* the **command name** (``/proc/PID/comm``, ``ps -o comm``, ``top``, ``pgrep NAME``): at most 15 bytes, set
  with ``prctl(PR_SET_NAME)`` through ctypes.  It names the calling thread, so call this from the main
  thread.  By default it is the title without its ``appliance: `` prefix, so ``writer orders-3`` fits where
  ``appliance: writer orders-3`` would not.
* the **command line** (``/proc/PID/cmdline``, ``ps -ef``, ``ps -o args``, ``pgrep -f``): the kernel reads
  it from the process's own memory, between the ``arg_start`` and ``arg_end`` addresses it publishes in
  ``/proc/PID/stat`` (fields 48 and 49).  We overwrite those bytes with the title and pad with NULs, the
  technique PostgreSQL uses.  The argument strings are no longer read by Python after start-up (``sys.argv``
  holds copies), so nothing else changes.

Why not the ``setproctitle`` package: it also moves the environment strings away so that a title may grow
past the original command line, at the price of a compiled dependency and of rewriting libc's ``environ``.
Our titles are short, and a service's command line (``/opt/log-appliance/bin/python /usr/local/bin/appliance
serve --config /etc/log-appliance/appliance.toml``) is long, so a title is simply cut to the space the
command line had; :func:`set_proctitle` returns what was shown.  Forked children inherit the same memory
layout, so each writer process can retitle itself.  Where ``/proc`` is unreadable only the command name
changes.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["COMM_MAX_BYTES", "cmdline_capacity", "get_comm", "get_proctitle", "set_proctitle"]

COMM_MAX_BYTES = 15  # TASK_COMM_LEN (16) minus the terminating NUL
_PR_SET_NAME = 15
_PREFIX = "appliance: "

_libc = ctypes.CDLL(None, use_errno=True)


def _truncate_utf8(data: bytes, limit: int) -> bytes:
    """``data`` cut to at most ``limit`` bytes without splitting a UTF-8 sequence."""
    if len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", errors="ignore").encode("utf-8")


def _argv_area() -> tuple[int, int] | None:
    """(address, size) of this process's command line strings, from /proc/self/stat; None if unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ": split after the last one.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if len(fields) < 47:
        return None
    arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49, counted from 1 in proc(5)
    if arg_start == 0 or arg_end <= arg_start:
        return None  # hidden from us, or a kernel thread
    return arg_start, arg_end - arg_start


def cmdline_capacity() -> int:
    """How many bytes of title the command line can show (0 if it cannot be changed)."""
    area = _argv_area()
    return 0 if area is None else area[1] - 1


def _set_comm(name: str) -> None:
    raw = _truncate_utf8(name.encode("utf-8", errors="replace").replace(b"\0", b" "), COMM_MAX_BYTES)
    if _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_NAME, {raw!r}): {os.strerror(errno)}")


def set_proctitle(title: str, comm: str | None = None) -> str:
    """Show ``title`` as this process's command line and ``comm`` as its command name.

    ``comm`` defaults to ``title`` less its ``appliance: `` prefix.  Returns the command line as ``ps`` will
    show it (cut to the space available)."""
    if comm is None:
        comm = title.removeprefix(_PREFIX) or title
    _set_comm(comm)
    area = _argv_area()
    if area is None:
        return get_proctitle()
    address, size = area
    shown = _truncate_utf8(title.encode("utf-8", errors="replace").replace(b"\0", b" "), size - 1)
    # One write of the whole area: the title, then NULs up to and including the last byte, which must stay NUL
    # so that the kernel returns exactly arg_start..arg_end and never reads on into the environment.
    ctypes.memmove(address, shown + b"\0" * (size - len(shown)), size)
    return shown.decode("utf-8")


def get_proctitle(pid: int | None = None) -> str:
    """The command line of ``pid`` (default: this process) as ``ps -o args`` shows it."""
    with open(f"/proc/{pid or 'self'}/cmdline", "rb") as f:
        raw = f.read()
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", errors="replace")


def get_comm(pid: int | None = None) -> str:
    """The command name of ``pid`` (default: this process's main thread), as ``ps -o comm`` shows it."""
    with open(f"/proc/{pid or 'self'}/comm", "rb") as f:
        return f.read().rstrip(b"\n").decode("utf-8", errors="replace")
