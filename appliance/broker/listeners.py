"""The broker's listening sockets: TCP per ``listeners``, a Unix socket per ``appliance.unix.listener``, and
accepting connections without running out of descriptors.

**Setting up.**  A TCP listener binds the first address its host resolves to, with ``SO_REUSEADDR`` (port
0: the kernel picks one, and :attr:`Listeners.addresses` says which).  The Unix listener is created under a
umask that already denies everyone else, then given ``appliance.shm.mode`` (0600: the service's user only;
0660 and ``appliance.shm.group``); a stale socket file a killed broker left is replaced, a live one (another
broker answers there) is an error.  Every listening socket is non-blocking, not inherited across ``exec``.

**Out of descriptors.**  Connections must never take the descriptors the broker needs to serve them: opening
a partition (its state page, its log's segment files) and a control call each take a few.  So the broker
keeps :data:`DESCRIPTOR_RESERVE` descriptors (one in :data:`DESCRIPTOR_RESERVE_SHARE` of a small limit)
below ``RLIMIT_NOFILE`` for that: a connection accepted at a descriptor number inside the reserve is served,
but the listener pauses for :data:`ACCEPT_PAUSE_MS` (as after an ``accept`` that failed with EMFILE), and
newer clients wait in the listen backlog until connections close.  Without the reserve, a flood of
connections leaves no descriptor to attach a partition's state page, and the partition is answered
NOT_LEADER_OR_FOLLOWER until connections go away.  A paused listener is taken out of the broker's selector
and put back once its pause is over and the lowest free descriptor is below the reserve again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import selectors
import socket
import stat
import time
from typing import Final

from appliance.config.listeners import Listener
from appliance.config.server_config import Config
from storage.errors import ConfigError

__all__ = ["ACCEPT_PAUSE_MS", "DESCRIPTOR_RESERVE", "DESCRIPTOR_RESERVE_SHARE", "Listeners", "Listening"]

ACCEPT_BACKLOG: Final = 1024
ACCEPTS_PER_TURN: Final = 64
ACCEPT_PAUSE_MS: Final = 100  # after accept() fails (out of descriptors), before trying again
DESCRIPTOR_RESERVE: Final = 16  # kept free for partition files, state pages and control calls
DESCRIPTOR_RESERVE_SHARE: Final = 8  # ... or one in this many of RLIMIT_NOFILE, if fewer (a tiny limit)
RESERVE_LOG_INTERVAL_S: Final = 10.0  # pauses for the reserve are logged at most this often

log = logging.getLogger("appliance.broker")


class Listening:
    """A listening socket and the name of the listener it serves (PLAINTEXT, or UNIX)."""

    __slots__ = ("name", "path", "sock")

    def __init__(self, sock: socket.socket, name: str, path: str | None = None) -> None:
        self.sock = sock
        self.name = name
        self.path = path


class Listeners:
    """Every listening socket of the broker, registered in its selector with the :class:`Listening` as data.

    ``probe_fd`` is any descriptor of the broker's: ``dup`` of it finds the lowest free descriptor number.
    """

    def __init__(self, config: Config, selector: selectors.BaseSelector, probe_fd: int) -> None:
        self.config = config
        self._selector = selector
        self._probe_fd = probe_fd
        self._listening: list[Listening] = []
        self._paused: list[tuple[float, Listening]] = []  # listeners not accepting until a time
        # Descriptors are numbered lowest free first: an accepted socket numbered at or above this leaves
        # fewer than DESCRIPTOR_RESERVE free.
        limit = _descriptor_limit()
        self._descriptor_reserve = min(DESCRIPTOR_RESERVE, limit // DESCRIPTOR_RESERVE_SHARE)
        self._descriptor_ceiling = limit - self._descriptor_reserve
        self._reserve_logged_s = -RESERVE_LOG_INTERVAL_S
        self.addresses: dict[str, tuple[str, int] | str] = {}  # listener name -> bound address

    def bind(self) -> dict[str, tuple[str, int] | str]:
        """Open every listener; return their bound addresses (a TCP port 0 becomes the port chosen)."""
        for listener in self.config.listeners:
            sock = _listen_tcp(listener)
            self._add(Listening(sock, listener.name))
            host, port = sock.getsockname()[:2]
            self.addresses[listener.name] = (host, port)
            log.info("broker listening on %s://%s:%d", listener.name, host, port)
        path = self.config.unix_listener
        if path:
            sock = _listen_unix(path, self.config.shm_mode, self.config.shm_gid)
            self._add(Listening(sock, "UNIX", path))
            self.addresses["UNIX"] = path
            log.info("broker listening on unix:%s (mode %o)", path, self.config.shm_mode)
        return dict(self.addresses)

    def _add(self, listening: Listening) -> None:
        listening.sock.setblocking(False)
        self._listening.append(listening)
        self._selector.register(listening.sock, selectors.EVENT_READ, listening)

    def accept(self, listening: Listening) -> list[tuple[socket.socket, str]]:
        """The new connections (socket, peer name), up to :data:`ACCEPTS_PER_TURN`; the listener pauses
        after a failed ``accept`` or a connection inside the descriptor reserve (module docstring)."""
        accepted: list[tuple[socket.socket, str]] = []
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, address = listening.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # EMFILE and friends: keep serving the connections we have, retry later
                log.error("accept on %s: %s; not accepting for %d ms", listening.name, e, ACCEPT_PAUSE_MS)
                self._pause(listening)
                break
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = f"{address[0]}:{address[1]}"
            else:
                peer = f"unix:{listening.path}#{sock.fileno()}"
            accepted.append((sock, peer))
            if sock.fileno() >= self._descriptor_ceiling:
                self._pause(listening)
                self._log_reserve(listening, sock.fileno())
                break
        return accepted

    def _log_reserve(self, listening: Listening, fd: int) -> None:
        if time.monotonic() < self._reserve_logged_s + RESERVE_LOG_INTERVAL_S:
            return
        self._reserve_logged_s = time.monotonic()
        log.warning("accept on %s: descriptor %d is within the reserve of %d below RLIMIT_NOFILE %d "
                    "(kept for partition files); not accepting for %d ms", listening.name, fd,
                    self._descriptor_reserve, self._descriptor_ceiling + self._descriptor_reserve,
                    ACCEPT_PAUSE_MS)  # fmt: skip

    def _pause(self, listening: Listening) -> None:
        self._selector.unregister(listening.sock)
        self._paused.append((time.monotonic() + ACCEPT_PAUSE_MS / 1000.0, listening))

    @property
    def paused(self) -> bool:
        return bool(self._paused)

    def next_resume_s(self) -> float | None:
        """The monotonic time the first paused listener may accept again; None if none is paused."""
        return min(at for at, _ in self._paused) if self._paused else None

    def resume_due(self) -> None:
        """Put back in the selector the listeners whose pause is over, unless still inside the reserve."""
        now = time.monotonic()
        due = [e for e in self._paused if e[0] <= now]
        if not due:
            return
        if not self._descriptors_to_spare():  # still inside the reserve: another pause
            self._paused = [e for e in self._paused if e[0] > now]
            self._paused += [(now + ACCEPT_PAUSE_MS / 1000.0, listening) for _, listening in due]
            return
        for entry in due:
            self._paused.remove(entry)
            self._selector.register(entry[1].sock, selectors.EVENT_READ, entry[1])

    def _descriptors_to_spare(self) -> bool:
        """Whether the lowest free descriptor is below the reserve (a probe: ``dup`` takes the lowest)."""
        try:
            probe = os.dup(self._probe_fd)
        except OSError:
            return False
        os.close(probe)
        return probe < self._descriptor_ceiling

    def close(self) -> None:
        """Stop listening: close every socket, remove the Unix socket's file."""
        self._paused.clear()
        for listening in self._listening:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(listening.sock)
            listening.sock.close()
            if listening.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(listening.path)
        self._listening.clear()


def _descriptor_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a very large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def _listen_tcp(listener: Listener) -> socket.socket:
    host = listener.host or None
    try:
        infos = socket.getaddrinfo(host, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"listeners: {listener}: cannot resolve {listener.host!r}: {e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(ACCEPT_BACKLOG)
    except OSError as e:
        sock.close()
        raise ConfigError(f"listeners: {listener}: cannot listen: {e.strerror}") from None
    sock.set_inheritable(False)
    return sock


def _listen_unix(path: str, mode: int, gid: int | None) -> socket.socket:
    """Listen on ``path`` with ``mode`` (0600: owner only).  A stale socket file is replaced; a live one
    (another broker answers there) is an error.  The socket is created under a umask that already denies
    everyone else, so there is no moment when it is more open than ``mode``."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"appliance.unix.listener: {path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens there: a leftover of a killed broker
        else:
            raise ConfigError(f"appliance.unix.listener: another broker already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ConfigError(f"appliance.unix.listener: cannot bind {path}: {e.strerror}") from None
    finally:
        os.umask(old_umask)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
    sock.listen(ACCEPT_BACKLOG)
    sock.set_inheritable(False)
    return sock
