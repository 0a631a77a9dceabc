"""POSIX shared memory and semaphores for one appliance instance: names, creation, permissions, clean-up.

Naming
------
Every object an appliance creates carries its *instance id*, so two appliances on one host (different data
dirs) never touch each other's objects, and a crashed instance's leftovers can be found by prefix::

    /la-<instance>-ring-<topic>-<partition>-<producer>   shm: a producer ring
    /la-<instance>-space-<topic>-<partition>-<producer>  semaphore: "space freed / ack ready", that producer's
    /la-<instance>-wake-<topic>-<partition>              semaphore: "data in some ring", the writer's
    /la-<instance>-state-<topic>-<partition>             shm: the partition state page

Linux keeps them as ``/dev/shm/la-...`` and ``/dev/shm/sem.la-...``.  ``<instance>`` is 16 hex digits of
BLAKE2b over the real path of the data dir.  It is stable across restarts on purpose: the supervisor, holding
the data dir's lock, calls :func:`reclaim` at start to remove what a crashed run left, which it could not find
if the id were random.  Two live appliances cannot share a data dir (the log lock forbids it), so two live
instances never share an id.  Topic names may contain ``[A-Za-z0-9._-]``; partition and producer are
non-negative integers, so ``<topic>`` is recovered unambiguously from the right and no two (kind, topic,
partition, producer) tuples give the same name.  A topic too long for NAME_MAX is shortened to a prefix plus
``~`` and a hash (``~`` cannot occur in a topic name).

Permissions
-----------
Objects are created exclusively (``O_CREAT | O_EXCL``) with mode 0600, or 0660 and the configured group when
local producers run as other users.  ``shm_open``/``sem_open`` apply the umask, so the mode is set again with
``fchmod``/``chmod`` right after creation (the umask only ever narrows it, so the short window is not a leak).

Lifetime
--------
The creator unlinks on clean shutdown (:meth:`SharedSegment.unlink`, :func:`unlink_semaphore`).  A mapping
stays valid in every process that has it after the name is unlinked; the memory goes when the last one unmaps.
After a crash, :func:`reclaim` removes everything under the instance prefix.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import posix_ipc

__all__ = [
    "SHM_DIR",
    "Permissions",
    "SharedSegment",
    "ShmNames",
    "create_semaphore",
    "instance_id",
    "list_objects",
    "open_semaphore",
    "process_alive",
    "process_start_ticks",
    "reclaim",
    "semaphore_path",
    "shm_path",
    "unlink_semaphore",
    "unlink_shared_memory",
]

SHM_DIR = Path("/dev/shm")
_SEM_FILE_PREFIX = "sem."
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_INSTANCE_RE = re.compile(r"[0-9a-f]{16}")
# MAP_POPULATE: fault every page in at mmap time (shm pages are allocated then), so the first lap around a
# ring does not pay a page fault every 4 KiB on the hot path.
_MAP_FLAGS = mmap.MAP_SHARED | mmap.MAP_POPULATE
_MAX_TOPIC_IN_NAME = 180  # "sem." + "la-<16>-space-" + topic + "-<int>-<int>" stays under NAME_MAX (255)


def instance_id(data_dir: str | os.PathLike[str]) -> str:
    """The instance id of the appliance whose data dir is ``data_dir`` (16 hex digits, stable)."""
    real = os.path.realpath(os.fspath(data_dir))
    return hashlib.blake2b(real.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()


def _topic_component(topic: str) -> str:
    if not topic or _TOPIC_RE.fullmatch(topic) is None:
        raise ValueError(f"topic name {topic!r}: expected 1+ characters from [A-Za-z0-9._-]")
    if len(topic) <= _MAX_TOPIC_IN_NAME:
        return topic
    digest = hashlib.blake2b(topic.encode(), digest_size=8).hexdigest()
    return f"{topic[:64]}~{digest}"


def _non_negative(what: str, value: int) -> int:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r}: expected a non-negative integer")
    return value


@dataclass(frozen=True)
class ShmNames:
    """Names of one instance's objects.  All methods are pure: nothing is created."""

    instance: str

    def __post_init__(self) -> None:
        if _INSTANCE_RE.fullmatch(self.instance) is None:
            raise ValueError(f"instance id {self.instance!r}: expected 16 hex digits (see instance_id())")

    @classmethod
    def for_data_dir(cls, data_dir: str | os.PathLike[str]) -> ShmNames:
        return cls(instance_id(data_dir))

    @property
    def prefix(self) -> str:
        """Every name of this instance starts with this (``/la-<instance>-``)."""
        return f"/la-{self.instance}-"

    def ring(self, topic: str, partition: int, producer: int) -> str:
        """Shared memory of the ring from ``producer`` to the writer of ``topic``-``partition``."""
        return self._name("ring", topic, partition, producer)

    def space_semaphore(self, topic: str, partition: int, producer: int) -> str:
        """Semaphore the producer sleeps on when its ring is full or it waits for an ack."""
        return self._name("space", topic, partition, producer)

    def doorbell(self, topic: str, partition: int) -> str:
        """Semaphore the partition writer sleeps on; every producer of the partition rings it."""
        return self._name("wake", topic, partition)

    def state_page(self, topic: str, partition: int) -> str:
        """Shared memory of the partition state page."""
        return self._name("state", topic, partition)

    def _name(self, kind: str, topic: str, partition: int, producer: int | None = None) -> str:
        name = f"{self.prefix}{kind}-{_topic_component(topic)}-{_non_negative('partition', partition)}"
        if producer is not None:
            name += f"-{_non_negative('producer id', producer)}"
        return name


@dataclass(frozen=True)
class Permissions:
    """Mode (and group) of created objects: 0600 by default, 0660 with a group for other-user producers."""

    mode: int = 0o600
    gid: int | None = None

    @classmethod
    def for_group(cls, gid: int) -> Permissions:
        return cls(mode=0o660, gid=gid)

    def __post_init__(self) -> None:
        if self.mode & ~0o660:
            raise ValueError(f"shared memory mode {self.mode:#o}: only owner/group read-write bits allowed")


def shm_path(name: str) -> Path:
    """Where Linux shows the shared-memory object ``name``."""
    return SHM_DIR / name.lstrip("/")


def semaphore_path(name: str) -> Path:
    """Where Linux shows the named semaphore ``name`` (``/dev/shm/sem.<name>``)."""
    return SHM_DIR / (_SEM_FILE_PREFIX + name.lstrip("/"))


class SharedSegment:
    """A mapped shared-memory object: ``buf`` (a memoryview over the whole mapping) and its name.

    Create with :meth:`create`, open an existing one with :meth:`open`.  :meth:`close` unmaps;
    :meth:`unlink` removes the name (the creator does that on clean shutdown).
    """

    def __init__(self, name: str, mapping: mmap.mmap) -> None:
        self.name = name
        self.size_bytes = len(mapping)
        self._mapping: mmap.mmap | None = mapping
        self.buf: memoryview = memoryview(mapping)

    @classmethod
    def create(cls, name: str, size_bytes: int, permissions: Permissions | None = None) -> SharedSegment:
        """Create ``name`` exclusively, zero-filled, with exactly ``permissions``.

        FileExistsError if it exists already.
        """
        permissions = permissions or Permissions()
        if size_bytes <= 0:
            raise ValueError(f"shared memory {name}: size {size_bytes} bytes, expected > 0")
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=permissions.mode, size=size_bytes)
        except posix_ipc.ExistentialError as exc:
            raise FileExistsError(
                f"shared memory {name} already exists: another appliance with the same data dir, "
                "or a leftover of a crash (reclaim() removes those)"
            ) from exc
        try:
            os.fchmod(shm.fd, permissions.mode)
            if permissions.gid is not None:
                os.fchown(shm.fd, -1, permissions.gid)
            mapping = mmap.mmap(shm.fd, size_bytes, flags=_MAP_FLAGS)
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(name)
            raise
        shm.close_fd()
        return cls(name, mapping)

    @classmethod
    def open(cls, name: str) -> SharedSegment:
        """Map the existing object ``name`` read-write; FileNotFoundError if there is none."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as exc:
            raise FileNotFoundError(
                f"shared memory {name} does not exist (unlinked, or never created)"
            ) from exc
        except posix_ipc.PermissionsError as exc:
            raise PermissionError(f"shared memory {name}: permission denied (not owner or group)") from exc
        try:
            mapping = mmap.mmap(shm.fd, shm.size, flags=_MAP_FLAGS)
        finally:
            shm.close_fd()
        return cls(name, mapping)

    @property
    def closed(self) -> bool:
        return self._mapping is None

    def close(self) -> None:
        """Unmap.  If numpy arrays or memoryviews over the mapping are still alive elsewhere, the unmapping
        happens when the last of them is garbage-collected instead (never under their feet)."""
        mapping, self._mapping = self._mapping, None
        if mapping is None:
            return
        try:
            self.buf.release()
            mapping.close()
        except BufferError:
            pass  # views still alive elsewhere: the mapping is released with the last of them

    def unlink(self) -> None:
        """Remove the name; mappings stay valid until unmapped.  Quiet if it is already gone."""
        unlink_shared_memory(self.name)


def unlink_shared_memory(name: str) -> bool:
    """Remove the shared-memory object ``name``; return False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def create_semaphore(
    name: str, permissions: Permissions | None = None, initial_value: int = 0
) -> posix_ipc.Semaphore:
    """Create the named semaphore exclusively with exactly ``permissions``; FileExistsError if it exists."""
    permissions = permissions or Permissions()
    try:
        sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=permissions.mode, initial_value=initial_value)
    except posix_ipc.ExistentialError as exc:
        raise FileExistsError(
            f"semaphore {name} already exists: another appliance with the same data dir, "
            "or a leftover of a crash (reclaim() removes those)"
        ) from exc
    try:
        path = semaphore_path(name)
        os.chmod(path, permissions.mode)
        if permissions.gid is not None:
            os.chown(path, -1, permissions.gid)
    except BaseException:
        sem.close()
        unlink_semaphore(name)
        raise
    return sem


def open_semaphore(name: str) -> posix_ipc.Semaphore:
    """Open the existing named semaphore; FileNotFoundError if there is none."""
    try:
        return posix_ipc.Semaphore(name)
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(f"semaphore {name} does not exist (unlinked, or never created)") from exc
    except posix_ipc.PermissionsError as exc:
        raise PermissionError(f"semaphore {name}: permission denied (not owner or group)") from exc


def unlink_semaphore(name: str) -> bool:
    """Remove the named semaphore; return False if it did not exist."""
    try:
        posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def list_objects(instance: str) -> tuple[list[str], list[str]]:
    """Names of this instance's (shared-memory objects, semaphores) that exist now, sorted."""
    prefix = ShmNames(instance).prefix.lstrip("/")
    segments: list[str] = []
    semaphores: list[str] = []
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(prefix):
            segments.append("/" + entry)
        elif entry.startswith(_SEM_FILE_PREFIX + prefix):
            semaphores.append("/" + entry[len(_SEM_FILE_PREFIX) :])
    return sorted(segments), sorted(semaphores)


def reclaim(instance: str) -> list[str]:
    """Unlink every object of ``instance`` (leftovers of a crash); return the names removed.

    Call it only while holding the instance's data dir lock, before creating anything: it removes live
    objects too.  Processes that still map a removed object keep their mapping; nobody can open it again.
    """
    segments, semaphores = list_objects(instance)
    removed = [name for name in segments if unlink_shared_memory(name)]
    removed += [name for name in semaphores if unlink_semaphore(name)]
    return removed


def _proc_stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name, which may hold spaces and ')')."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat[stat.rindex(b")") + 2 :].split()


_STATE = 0  # field 3: R, S, D, Z (zombie), X (dead) ...
_START_TICKS = 19  # field 22: start time in clock ticks since boot


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None.

    Stored next to a pid in shared memory so a reused pid is not mistaken for the original process.
    """
    fields = _proc_stat_fields(pid)
    return None if fields is None else int(fields[_START_TICKS])


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if ``pid`` runs and, when ``start_ticks`` is given, is the same process that recorded it.

    A zombie (killed but not yet reaped) counts as dead.
    """
    if pid <= 0:
        return False
    fields = _proc_stat_fields(pid)
    if fields is None or fields[_STATE] in (b"Z", b"X"):
        return False
    return start_ticks is None or int(fields[_START_TICKS]) == start_ticks
