"""One appliance per data dir and per instance: the locks that say so, and the instance's shared-memory names.

Every process that owns a data dir (``appliance serve``, ``appliance replica``) locks each of its log dirs:
``<dir>/.appliance.lock``, created 0600, held with ``flock`` by an open descriptor for the life of the
process, the holder's pid written inside.  A second process on the same data stops at start-up with an error
naming that pid; a process that dies releases its locks with its descriptors, so nothing is left to clean.

The supervisor also locks its instance's shared-memory names, ``/dev/shm/la-<instance>.lock``
(:func:`instance_lock_path`), before it reclaims what a crashed run left there: two appliances whose data
dirs hash to the same instance would otherwise remove each other's rings.

Shared memory is named after the data dir (:attr:`Config.instance_id`, ``ipc.shm``), so every local process
(producers, consumers, tools) finds an appliance's objects from its data dir alone.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from appliance.config.server_config import Config
from ipc.shm import SHM_DIR, ShmNames
from storage.errors import ApplianceError

__all__ = ["LOCK_FILE", "InstanceLocks", "instance_lock_path", "lock_file", "lock_log_dirs", "shm_names_for"]

LOCK_FILE: Final = ".appliance.lock"  # in every log dir


def lock_file(path: str, what: str) -> int:
    """Lock ``path`` (created 0600) for this process and write its pid there; the descriptor holds the lock.

    ApplianceError naming the holder's pid when another process holds it (``what``: what the lock guards).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ApplianceError(f"{what} is in use by another appliance (pid {holder}, lock {path})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_log_dirs(log_dirs: Sequence[str]) -> list[int]:
    """Create every log dir and lock it (:func:`lock_file`): one appliance or replica per data dir."""
    fds: list[int] = []
    try:
        for directory in log_dirs:
            os.makedirs(directory, exist_ok=True)
            fds.append(lock_file(os.path.join(directory, LOCK_FILE), f"log dir {directory}"))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def shm_names_for(config: Config) -> ShmNames:
    """The shared-memory names of the appliance ``config`` describes: ``ipc.shm``'s instance of the first
    log dir (16 hex digits of BLAKE2b over its real path; fixed width, so no instance's prefix is another's).
    """
    return ShmNames(config.instance_id)


def instance_lock_path(names: ShmNames) -> Path:
    """The lock file of an instance's shared-memory names: ``/dev/shm/la-<instance>.lock``."""
    return SHM_DIR / f"la-{names.instance}.lock"


class InstanceLocks:
    """The locks a running appliance holds: its log dirs' and its shared-memory names'."""

    def __init__(self, names: ShmNames) -> None:
        self.path = instance_lock_path(names)
        self.fds: list[int] = []
        self.locked = False  # the instance's names are ours: its shared memory may be reclaimed

    def acquire(self, config: Config, names: ShmNames) -> None:
        """Lock the log dirs, then the instance's names; ApplianceError if another appliance holds one."""
        self.fds += lock_log_dirs(config.log_dirs)
        self.fds.append(lock_file(str(self.path), f"instance {config.instance_id} (shared memory "
                                                  f"{names.prefix}*)"))  # fmt: skip
        self.locked = True

    def close_fds(self) -> None:
        """Close the lock descriptors (in a forked child: the locks stay the parent's)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def release(self) -> None:
        """Remove the instance's lock file (still locked by us: nobody else uses it) and unlock all."""
        if self.locked:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.close_fds()
