"""Telling systemd how the service is doing: the sd_notify protocol, with no library.

systemd passes a Unix datagram socket in ``$NOTIFY_SOCKET`` (a path, or an abstract-namespace name written
with a leading ``@``) to a ``Type=notify`` service.  A message is newline-separated ``KEY=VALUE``
assignments sent as one datagram::

    READY=1                 start-up finished: systemd marks the unit active
    STATUS=...              one line shown by ``systemctl status``
    WATCHDOG=1              still alive; required at least every WatchdogSec= when it is set
    EXTEND_TIMEOUT_USEC=N   start-up or shutdown needs N more microseconds (long log recovery)
    STOPPING=1              shutdown began

Outside systemd (``$NOTIFY_SOCKET`` unset) every call is a no-op that returns ``False``, so the supervisor
calls these unconditionally.  Only the main process may notify (``NotifyAccess=main``): the supervisor calls
:func:`forget` in forked children so that they do not inherit the socket's address.

The watchdog: systemd sets ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the process it expects pings from)
when the unit has ``WatchdogSec=``.  :func:`watchdog_interval_s` returns half that period, the usual ping
interval, or ``None`` when no watchdog applies to this process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = [
    "extend_timeout",
    "forget",
    "notify",
    "ready",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval_s",
]

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(value: str) -> str | bytes:
    """The sockaddr for ``$NOTIFY_SOCKET``: a filesystem path, or ``@name`` for the abstract namespace."""
    if value.startswith("@"):
        return b"\0" + os.fsencode(value[1:])
    return value


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (``KEY=VALUE`` lines) to systemd, never waiting.

    Returns ``False`` when not run by systemd (no ``$NOTIFY_SOCKET``), ``True`` once sent.  The datagram is
    sent with ``MSG_DONTWAIT``: when the receiver's queue is full (a systemd that is not reading), the
    message is dropped and ``False`` returned, so the supervisor's main loop never hangs on it (the next
    ``STATUS=``/``WATCHDOG=1`` carries the news).  Raises ``OSError`` if the socket named cannot take it
    (systemd gone, wrong path): the caller logs it and carries on.
    """
    env = os.environ if environ is None else environ
    target = env.get("NOTIFY_SOCKET", "")
    if not target:
        return False
    if not target.startswith(("/", "@")):
        raise OSError(f"NOTIFY_SOCKET={target!r} is neither an absolute path nor an abstract @name")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), socket.MSG_DONTWAIT, _address(target))
        except BlockingIOError:
            return False
    return True


def _one_line(text: str) -> str:
    """A value that cannot smuggle in another assignment."""
    return " ".join(text.splitlines()).replace("\0", " ")


def ready(status_text: str | None = None) -> bool:
    """Start-up is done (logs recovered, listeners bound): ``READY=1``, with an optional status line."""
    return notify("READY=1" if status_text is None else f"READY=1\nSTATUS={_one_line(status_text)}")


def status(text: str) -> bool:
    """Set the one-line status ``systemctl status`` shows."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog() -> bool:
    """Ping the watchdog: ``WATCHDOG=1``.  Call every :func:`watchdog_interval_s` seconds."""
    return notify("WATCHDOG=1")


def stopping(status_text: str | None = None) -> bool:
    """Shutdown began: ``STOPPING=1``."""
    return notify("STOPPING=1" if status_text is None else f"STOPPING=1\nSTATUS={_one_line(status_text)}")


def extend_timeout(seconds: float) -> bool:
    """Ask for ``seconds`` more before systemd gives up on start-up or shutdown (send again while working)."""
    return notify(f"EXTEND_TIMEOUT_USEC={max(1, round(seconds * 1_000_000))}")


def watchdog_interval_s(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between watchdog pings (half of ``WatchdogSec=``); ``None`` if no watchdog watches us.

    ``None`` too when ``$WATCHDOG_PID`` names another process (a child that inherited the environment) or the
    variables are not numbers.
    """
    env = os.environ if environ is None else environ
    usec_text = env.get("WATCHDOG_USEC", "")
    if not usec_text.isascii() or not usec_text.isdigit() or int(usec_text) == 0:
        return None
    pid_text = env.get("WATCHDOG_PID", "")
    if pid_text:
        if not pid_text.isascii() or not pid_text.isdigit():
            return None
        if int(pid_text) != (os.getpid() if pid is None else pid):
            return None
    return int(usec_text) / 2 / 1_000_000


def forget() -> None:
    """Remove the notify and watchdog variables from this process's environment (call in forked children)."""
    for name in _VARIABLES:
        os.environ.pop(name, None)
