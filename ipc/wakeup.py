"""Sleeping and waking across processes: named semaphores plus a "waiting" flag in shared memory.

Theory of operation (the one place this protocol is written down)
------------------------------------------------------------------
A process that has nothing to do sleeps on a POSIX semaphore (a :class:`Doorbell`).  Posting a semaphore is a
system call, so the other side should post only when someone sleeps.  Each sleeper therefore owns a *waiting
flag*: an int64 word in shared memory with exactly one writer, the sleeper.  The value 0 means "awake"; any
other value is the *generation* of the current sleep (a counter the sleeper bumps before every sleep).

Sleeper (:meth:`Waiter.park`)::

    1. spin: check for work a bounded number of times (cheap when the other side is about to publish)
    1b. nap (if the sleeper asks for it): sleep ``nap_s`` on a timer and check again, for up to
       ``nap_for_s``; the flag stays 0, so the other side makes no system call for this wait
    2. store flag := generation          (in every flag it owns: a writer owns one per ring)
    3. FULL FENCE
    4. check for work again; if there is some: store flag := 0, return
    5. sem_timedwait(doorbell, remaining time)
    6. store flag := 0; check for work; if none and time is left: go to 2 with generation + 1

Notifier (:meth:`Notifier.notify`), right after publishing work (a frame length, a read cursor, an ack)::

    a. (the publishing store)
    b. FULL FENCE
    c. load flag; if flag != 0 and flag != the generation I last posted for: post the doorbell, remember it

Why no wakeup is lost: the sleeper stores its flag (2) before it checks (4), the notifier publishes (a) before
it loads the flag (c), and the fences (3, b) forbid each load from passing its own side's store.  So either
the sleeper's check (4) sees the work, or the notifier's load (c) sees the flag and posts; a post made before
the sleeper reaches 5 is not lost, the semaphore counts it.  Without the fences x86-64 could satisfy both
loads from before both stores (a store may wait in the store buffer), which is why this is the one place in
``ipc`` that needs a fence (see ``ipc/memory_order.py``).

Why the generation: while a sleeper wakes up, the flag still says "sleeping"; remembering the generation
already posted for limits a notifier to one post per sleep instead of one per frame, so the hot path makes
no system call when the other side is awake, and at most one per sleep when it is not.  A sleeper starts its
generations at a random 64-bit value, so a restarted sleeper never repeats the one a notifier remembers.

Why nap: a post is a system call that wakes a process on another CPU, which on a virtual machine costs the
*poster* many times what a fence or a load does (docs/ipc.md: the partition writer's ack when its producer
slept for a slot).  Where
the poster is the pipeline's bottleneck and the sleeper has slack (a producer waiting for an in-flight slot
while the writer works through the frames published before), the sleeper naps instead: it wakes on its own
timer, up to ``nap_s`` plus the kernel's timer slack late, and the poster never pays.  After ``nap_for_s``
it sleeps as above; and a park that timed out turns the naps off until a park finds work again, so a waiter
that waits in slices naps in the first one only (a wait for a stalled writer costs no CPU).

Extra posts (a post arriving after a timeout already woke the sleeper) make a later sleep return at once; the
sleeper then re-checks and sleeps again: harmless.  The timeout bounds every sleep, so a notifier that died
between (a) and (c) delays, but never strands, a sleeper.  An idle process wakes only on its timeout, which
the sleeper chooses: the partition writer sleeps until its next timer is due, however far off
(``appliance.server.writer_timers``), because a producer that dies between (a) and (c) has its ring
detached by the supervisor, and the detach command rings the writer's doorbell.  :attr:`Doorbell.pending`
(the semaphore's count) lets a third party see a post the sleeper has not taken, without waking it.

Futexes: waking any number of readers of one published word
-----------------------------------------------------------
A doorbell wakes one sleeper that the notifier knows.  The readers of a partition's high watermark (local
consumers) are any number of processes the writer never hears of, so they sleep on the published word
itself with the kernel's futex: :func:`futex_wait_any` sleeps until one of a few 32-bit words (the low half
of each high watermark) differs from the value the sleeper last loaded -- the kernel compares it atomically
with going to sleep, so a store made before the sleep starts ends it at once -- and the publisher calls
:func:`futex_wake` on the word right after storing it, waking every sleeper in one system call.  The
publisher skips that call while no reader has said recently that it sleeps (``ipc.state_page`` keeps the
"a reader sleeps" stamp and writes that protocol down).  Shared (not process-private) futexes, so the word
may be mapped at different addresses in each process.  ``futex_waitv`` (Linux 5.16) waits on up to 128
words at once; where it is missing :data:`FUTEX_WAITV_AVAILABLE` is False and callers fall back to
their own means (timed sleeps, inotify).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import time
from collections.abc import Callable, Sequence

import posix_ipc

from ipc.memory_order import full_fence, load_int64, publish_int64
from ipc.shm import Permissions, create_semaphore, open_semaphore, unlink_semaphore

__all__ = [
    "DEFAULT_SPIN_ITERATIONS",
    "FUTEX_WAITV_AVAILABLE",
    "MAX_FUTEX_WAITERS",
    "Doorbell",
    "FlagSlot",
    "Notifier",
    "Waiter",
    "futex_wait_any",
    "futex_wake",
]

DEFAULT_SPIN_ITERATIONS = 64  # checks for work before napping or sleeping on the semaphore
_GENERATIONS = 1 << 62

FlagSlot = tuple[memoryview, int]
"""A waiting flag: an int64 ``memoryview.cast('q')`` over shared memory and the word index in it."""


class Doorbell:
    """A named POSIX semaphore one process sleeps on and others post (ring)."""

    def __init__(self, name: str, semaphore: posix_ipc.Semaphore) -> None:
        self.name = name
        self._semaphore: posix_ipc.Semaphore | None = semaphore

    @classmethod
    def create(cls, name: str, permissions: Permissions | None = None) -> Doorbell:
        """Create the semaphore (value 0) exclusively; see :func:`ipc.shm.create_semaphore`."""
        return cls(name, create_semaphore(name, permissions))

    @classmethod
    def open(cls, name: str) -> Doorbell:
        """Open an existing doorbell by name; FileNotFoundError if there is none."""
        return cls(name, open_semaphore(name))

    def ring(self) -> None:
        """Post: wake the sleeper, or make its next sleep return at once."""
        assert self._semaphore is not None, f"doorbell {self.name} is closed"
        self._semaphore.release()

    def sleep(self, timeout_s: float) -> bool:
        """Sleep until rung or ``timeout_s`` passes; True if rung.  A signal ends the sleep early (False)."""
        assert self._semaphore is not None, f"doorbell {self.name} is closed"
        try:
            self._semaphore.acquire(max(timeout_s, 0.0))
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return False
        return True

    @property
    def pending(self) -> int:
        """Posts not yet taken by a sleep (the semaphore's value; 0 where the platform cannot tell)."""
        if self._semaphore is None or not posix_ipc.SEMAPHORE_VALUE_SUPPORTED:
            return 0
        return int(self._semaphore.value)

    def close(self) -> None:
        """Close this process's handle (the semaphore lives on until unlinked)."""
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            semaphore.close()

    def unlink(self) -> None:
        """Remove the name (quiet if already gone)."""
        unlink_semaphore(self.name)


class Waiter:
    """The sleeping side of the protocol for one doorbell (see the module docstring, steps 1-6)."""

    def __init__(self, doorbell: Doorbell, spin_iterations: int = DEFAULT_SPIN_ITERATIONS, *,
                 nap_s: float = 0.0, nap_for_s: float = 0.0) -> None:
        self.doorbell = doorbell
        self.spin_iterations = spin_iterations
        self.nap_s = nap_s  # step 1b: each nap (0: no naps)
        self.nap_for_s = nap_for_s  # step 1b: naps for at most this long, then the flag and the semaphore
        self._generation = int.from_bytes(os.urandom(8), "little") % _GENERATIONS + 1
        self._napping = True  # step 1b on: the last park found work (off after one that timed out)
        self.sleeps = 0  # how many times park() really slept (for tests and stats)

    def park(self, flags: Sequence[FlagSlot], ready: Callable[[], bool], timeout_s: float) -> bool:
        """Return True as soon as ``ready()`` is true (up to a nap late while napping), False if it is still
        false after ``timeout_s``.

        ``flags`` are the waiting flags this sleeper owns (one per ring it serves); ``ready`` must only load
        what the notifiers publish.  A park that times out turns the naps off until a park finds work again:
        a caller that waits in slices (a flush, ``max.block.ms``) naps in the first slice only.
        """
        found = self._park(flags, ready, timeout_s)
        self._napping = found
        return found

    def _park(self, flags: Sequence[FlagSlot], ready: Callable[[], bool], timeout_s: float) -> bool:
        for _ in range(self.spin_iterations):
            if ready():
                return True
        deadline = time.monotonic() + timeout_s
        if self.nap_s > 0 and self._napping and timeout_s > 0:
            naps_until = min(deadline, time.monotonic() + self.nap_for_s)
            while (left := naps_until - time.monotonic()) > 0:
                time.sleep(min(self.nap_s, left))
                if ready():
                    return True
        while True:
            self._generation = self._generation % _GENERATIONS + 1  # never 0, fits an int64
            for words, index in flags:
                publish_int64(words, index, self._generation)
            full_fence()
            if ready():
                self._clear(flags)
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._clear(flags)
                return False
            self.sleeps += 1
            self.doorbell.sleep(remaining)
            self._clear(flags)
            if ready():
                return True
            if time.monotonic() >= deadline:
                return False

    @staticmethod
    def _clear(flags: Sequence[FlagSlot]) -> None:
        for words, index in flags:
            publish_int64(words, index, 0)


class Notifier:
    """The waking side for one waiting flag: call :meth:`notify` right after each publishing store."""

    __slots__ = ("_doorbell", "_index", "_last_generation", "_words")

    def __init__(self, doorbell: Doorbell, flag: FlagSlot) -> None:
        self._doorbell = doorbell
        self._words, self._index = flag
        self._last_generation = 0

    def notify(self) -> bool:
        """Post the doorbell if its owner sleeps and was not posted for this sleep yet; True if posted."""
        full_fence()
        generation = load_int64(self._words, self._index)
        if generation == 0 or generation == self._last_generation:
            return False
        self._last_generation = generation
        self._doorbell.ring()
        return True

    def release(self) -> None:
        """Drop the reference to the shared flag (before its mapping is closed)."""
        self._words = memoryview(bytearray(8)).cast("q")
        self._index = 0


# -- futexes (Linux x86-64) ----------------------------------------------------------------------------------

_SYS_FUTEX = 202
_SYS_FUTEX_WAITV = 449
_FUTEX_WAKE = 1  # shared: not FUTEX_PRIVATE_FLAG
_FUTEX2_SIZE_U32 = 0x02
_WAKE_ALL = 0x7FFFFFFF
MAX_FUTEX_WAITERS = 128  # the kernel's FUTEX_WAITV_MAX


class _FutexWaitv(ctypes.Structure):
    """``struct futex_waitv`` of <linux/futex.h>: the expected value, the word's address, flags."""

    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64), ("flags", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall() -> Callable[..., int] | None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "amd64"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    syscall: Callable[..., int] = libc.syscall
    syscall.restype = ctypes.c_long  # type: ignore[attr-defined]
    return syscall


_syscall = _load_syscall()


def _probe_waitv() -> bool:
    """Whether this kernel has futex_waitv: a call with no words answers EINVAL, not ENOSYS."""
    if _syscall is None:
        return False
    result = _syscall(ctypes.c_long(_SYS_FUTEX_WAITV), None, ctypes.c_uint(0), ctypes.c_uint(0), None,
                      ctypes.c_int(time.CLOCK_MONOTONIC))
    return not (result < 0 and ctypes.get_errno() == errno.ENOSYS)


FUTEX_WAITV_AVAILABLE = _probe_waitv()


def futex_wake(address: int) -> None:
    """Wake every process sleeping in :func:`futex_wait_any` on the 32-bit word at ``address``."""
    if _syscall is not None:
        _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL)


def futex_wait_any(words: Sequence[tuple[int, int]], timeout_s: float) -> bool:
    """Sleep until one of ``words`` -- (address of a 32-bit word in shared memory, the value last loaded
    from it) -- holds another value or is woken, or ``timeout_s`` passes; False on the timeout.  A word that
    differs already returns at once (True), as does a signal (True: the caller looks again either way).
    At most :data:`MAX_FUTEX_WAITERS` words; needs :data:`FUTEX_WAITV_AVAILABLE`."""
    assert _syscall is not None and FUTEX_WAITV_AVAILABLE, "futex_waitv is not available here"
    count = len(words)
    assert 0 < count <= MAX_FUTEX_WAITERS, count
    vector = (_FutexWaitv * count)()
    for slot, (address, expected) in zip(vector, words, strict=True):
        slot.val = expected & 0xFFFFFFFF
        slot.uaddr = address
        slot.flags = _FUTEX2_SIZE_U32
    deadline_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + max(int(timeout_s * 1e9), 0)
    timeout = _Timespec(deadline_ns // 1_000_000_000, deadline_ns % 1_000_000_000)
    result = _syscall(ctypes.c_long(_SYS_FUTEX_WAITV), vector, ctypes.c_uint(count), ctypes.c_uint(0),
                      ctypes.byref(timeout), ctypes.c_int(time.CLOCK_MONOTONIC))
    return result >= 0 or ctypes.get_errno() != errno.ETIMEDOUT
