"""The supervisor's children: the extra children other rooms add, the bookkeeping of every child, the
restart back-off, and how a child is forked.

Extra children
--------------
:data:`EXTRA_CHILDREN` names factories (``"module:function"``, called with the Config and returning a
:class:`ChildSpec`, a list of them, or None): the broker and the replica processes of
``appliance.replica.dirs``.  Naming them by string keeps ``appliance.server`` free of imports of the rooms
above it; :func:`load_extra_children` imports them when ``appliance serve`` starts.  Each is forked after
the writers, restarted like them, and gets a :class:`ChildContext`: the config, the shared-memory names, and
:meth:`ChildContext.connect`, a :class:`~ipc.control.ControlClient` through which it reads metadata, creates
topics and attaches rings as a producer, like any local producer.

Restarts
--------
A child that dies while the supervisor is not stopping it is restarted (an extra child unless its spec says
``restart=False``): at once the first time, then, while it keeps dying, after 0.25 s, 0.5 s, 1 s ... up to
:data:`MAX_RESTART_DELAY_S`, counting the deaths of the last :data:`CRASH_WINDOW_S` (:meth:`Child.died`).

Forking
-------
:func:`fork_child` forks after every import, so code, modules and compiled kernels stay shared
copy-on-write with the supervisor (``gc.freeze()`` first: the collector's writes would unshare their pages).
The child takes back the default signal handlers (SIGINT ignored: Ctrl-C reaches the whole process group,
the supervisor decides), forgets systemd's variables, asks for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``) and exits at once if the parent is already gone, then closes what it inherited and
must not hold (the caller's ``close_inherited``).  Its exit code is what the body returns.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from appliance.config.server_config import Config
from appliance.server import sdnotify
from appliance.server.proctitle import set_proctitle
from ipc.control import ControlClient
from ipc.shm import ShmNames

__all__ = [
    "CRASH_WINDOW_S",
    "EXTRA_CHILDREN",
    "MAX_RESTART_DELAY_S",
    "Child",
    "ChildContext",
    "ChildSpec",
    "describe_exit",
    "fork_child",
    "kill_quietly",
    "load_extra_children",
    "measure_memory",
    "restart_delay_s",
    "unique_memory_bytes",
    "wait_children",
]

# Factories of extra children, "module:function"; function(config) -> ChildSpec | list | None.
EXTRA_CHILDREN: tuple[str, ...] = (
    "appliance.broker.process:child_spec",
    "appliance.follower.replica:child_specs",
    "appliance.cleaner.process:child_spec",
)

CRASH_WINDOW_S: Final = 60.0  # deaths this recent count for the back-off
MAX_RESTART_DELAY_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1

_log = logging.getLogger("appliance.supervisor")


@dataclass(frozen=True)
class ChildContext:
    """What an extra child gets: the configuration and the ways to reach the supervisor."""

    config: Config
    shm_names: ShmNames
    metadata_path: str  # <first log dir>/meta/topics.json (read with appliance.server.metadata.read_topics)
    ready_fd: int  # write end of the readiness pipe (-1: the supervisor does not wait)
    broker_wake_fd: int = -1  # the eventfd writers add to after each round (the broker selects on it)

    def connect(self, timeout_s: float = 30.0) -> ControlClient:
        """A control connection (metadata, create_topic, init_producer_id, attach ...)."""
        return ControlClient.connect(self.config.control_socket, timeout_s=timeout_s)

    def ready(self) -> None:
        """Tell the supervisor this child is ready (listeners bound); READY=1 waits for it if asked."""
        if self.ready_fd >= 0:
            try:
                os.write(self.ready_fd, b"R")
            finally:
                os.close(self.ready_fd)
                object.__setattr__(self, "ready_fd", -1)


@dataclass(frozen=True)
class ChildSpec:
    """An extra child process the supervisor forks (after the writers), restarts and stops."""

    name: str  # "broker"
    target: Callable[[ChildContext], int]  # runs in the child; returns its exit code
    title: str = ""  # process title; default "appliance: <name>"
    wait_ready: bool = False  # READY=1 waits until the child calls ChildContext.ready()
    restart: bool = True
    stop_timeout_ms: int = 10_000  # after SIGTERM, then SIGKILL


def load_extra_children(config: Config) -> list[ChildSpec]:
    """Import every factory of :data:`EXTRA_CHILDREN` and call it with ``config``: the specs they give."""
    specs: list[ChildSpec] = []
    for entry in EXTRA_CHILDREN:
        module_name, _, func_name = entry.partition(":")
        factory = getattr(importlib.import_module(module_name), func_name)
        spec = factory(config)
        if isinstance(spec, list | tuple):
            specs += spec
        elif spec is not None:
            specs.append(spec)
    return specs


@dataclass
class Child:
    """A running (or restarting) child process: a partition writer or an extra child."""

    role: str  # "writer" or "extra"
    name: str  # "orders-3", "broker"
    pid: int = 0
    started_s: float = 0.0
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)  # monotonic times of its recent deaths
    restart_at_s: float | None = None
    stopping: bool = False
    channel: socket.socket | None = None  # writers: the command channel
    inbox: bytearray = field(default_factory=bytearray)
    ready_fd: int = -1  # extras: read end of the readiness pipe
    ready: bool = True
    uss_bytes: int = 0
    uss_measured_s: float = 0.0
    stall_killed: bool = False

    def died(self, now_s: float) -> float:
        """Count a death at ``now_s``; the delay before restarting it (:func:`restart_delay_s`)."""
        self.crashes = [t for t in self.crashes if now_s - t < CRASH_WINDOW_S] + [now_s]
        return restart_delay_s(len(self.crashes))

    def refresh_memory(self, max_age_s: float) -> None:
        """Measure :attr:`uss_bytes` again if the last measure is ``max_age_s`` old or older."""
        now = time.monotonic()
        if self.pid and now - self.uss_measured_s >= max_age_s:
            self.uss_bytes = unique_memory_bytes(self.pid)
            self.uss_measured_s = now


class Restarts:
    """The children waiting to be restarted, so the supervisor's loop looks at these only, not at every
    partition's: a child is added when it is given a ``restart_at_s``; one whose ``restart_at_s`` was
    cleared since (stopped for good, or started by other means) is dropped when next looked at."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[Child, Callable[[], None]]] = {}  # by id(child)

    def add(self, child: Child, restart: Callable[[], None]) -> None:
        """``child`` waits for its ``restart_at_s``; then ``restart`` forks it again."""
        self._waiting[id(child)] = (child, restart)

    def next_s(self) -> float | None:
        """The earliest restart due (monotonic), if one is waiting."""
        self._drop_stale()
        return min((c.restart_at_s for c, _ in self._waiting.values() if c.restart_at_s is not None),
                   default=None)  # fmt: skip

    def run_due(self, now_s: float) -> None:
        """Restart every waiting child whose time has come."""
        if not self._waiting:
            return
        self._drop_stale()
        due = [(key, c, restart) for key, (c, restart) in self._waiting.items()
               if c.restart_at_s is not None and c.restart_at_s <= now_s]  # fmt: skip
        for key, child, restart in due:
            del self._waiting[key]
            child.restarts += 1
            restart()

    def _drop_stale(self) -> None:
        stale = [key for key, (c, _) in self._waiting.items() if c.pid or c.restart_at_s is None]
        for key in stale:
            del self._waiting[key]

    def __len__(self) -> int:
        return len(self._waiting)


def restart_delay_s(recent_deaths: int) -> float:
    """The back-off before a restart, given the deaths in the last :data:`CRASH_WINDOW_S` (this one too)."""
    return 0.0 if recent_deaths <= 1 else min(MAX_RESTART_DELAY_S, 0.25 * 2 ** (recent_deaths - 2))


def describe_exit(status: int) -> str:
    """A wait status in words: "was killed by signal 9 (SIGKILL)", "exited with status 1"."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {signum} ({name})"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"


def unique_memory_bytes(pid: int) -> int:
    """Unique set size of ``pid``: its ``Private_*`` memory in ``/proc/PID/smaps_rollup`` (0 if unreadable).

    Pages shared copy-on-write with the supervisor (code, numba kernels, imported modules) are not counted.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return 0
    total_kib = 0
    for line in text.splitlines():
        if line.startswith(b"Private_"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total_kib += int(parts[1])
    return total_kib * 1024


def measure_memory(children: Sequence[Child], *, log_each: bool) -> None:
    """Measure the unique memory of every running child but the writers; with ``log_each``, log it (and the
    caller's).  Writers are measured by the requests that show theirs, within a time budget per request
    (``control_ops``): reading ``smaps_rollup`` of a thousand writers at once would take seconds."""
    children = [child for child in children if child.role != "writer"]
    for child in children:
        child.refresh_memory(0.0)
    if not log_each:
        return
    own = unique_memory_bytes(os.getpid())
    _log.info("supervisor (pid %d): unique memory %.1f MiB", os.getpid(), own / 2**20)
    for child in children:
        if child.pid:
            _log.info("%s %s (pid %d): unique memory %.1f MiB (the supervisor's: %.1f MiB)", child.role,
                      child.name, child.pid, child.uss_bytes / 2**20, own / 2**20)  # fmt: skip


def fork_child(title: str, body: Callable[[], int], close_inherited: Callable[[], None]) -> int:
    """Fork a child titled ``title`` that runs ``body`` and exits with its code; the child's pid.

    Never returns in the child.  ``close_inherited`` runs in the child first (module docstring, "Forking").
    """
    parent = os.getpid()
    sys.stderr.flush()
    gc.freeze()  # objects made so far stay out of the collector: its writes would unshare their pages
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _become_child(parent)
        close_inherited()
        set_proctitle(title)
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        _log.exception("%s failed", title)
        code = 1
    finally:
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)


def _become_child(parent: int) -> None:
    """In a fresh child: own signals, no systemd variables, SIGTERM when the parent dies."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sdnotify.forget()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # the supervisor died before the line above


def kill_quietly(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``; a process already gone is no error."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def wait_children(children: Sequence[Child], timeout_ms: int, turn: Callable[[], None],
                  reap: Callable[[], None]) -> bool:
    """Wait up to ``timeout_ms`` for ``children`` to exit (``turn`` serves and reaps meanwhile; the writers'
    channels are drained: their "detached" replies need no answer), then SIGKILL what is left and wait for
    it.  True if every child stopped in time."""
    deadline = time.monotonic() + timeout_ms / 1000
    while any(c.pid for c in children) and time.monotonic() < deadline:
        for child in children:
            if child.channel is not None:
                try:
                    while child.channel.recv(1 << 16):
                        pass
                except (BlockingIOError, OSError):
                    pass
        turn()
    clean = True
    for child in children:
        if child.pid:
            clean = False
            _log.error("%s %s (pid %d) did not stop in %d ms; killing it", child.role, child.name, child.pid,
                       timeout_ms)  # fmt: skip
            kill_quietly(child.pid, signal.SIGKILL)
    while any(c.pid for c in children):
        time.sleep(0.005)
        reap()
    return clean
