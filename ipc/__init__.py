"""How processes talk: shared-memory rings and state pages (posix_ipc + mmap), wakeups, and the sans-IO
Kafka wire codec (:mod:`ipc.kafka`).  Imports nothing from ``appliance`` or ``replicas``.

The names below are the package's public surface (guarded by tests/test_public_api.py).  They are
resolved lazily, so importing one submodule does not load the numba kernels of all the others.
"""

from __future__ import annotations

from storage.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "RingProducer": "ipc.ring",
    "RingConsumer": "ipc.ring",
    "RingNames": "ipc.ring",
    "RingFailedError": "ipc.ring",
    "Chunk": "ipc.ring",
    "create_ring": "ipc.ring",
    "unlink_ring": "ipc.ring",
    "wait_for_frames": "ipc.ring",
    "warm_up": "ipc.ring",
    "ShmNames": "ipc.shm",
    "Permissions": "ipc.shm",
    "instance_id": "ipc.shm",
    "reclaim": "ipc.shm",
    "StatePage": "ipc.state_page",
    "Doorbell": "ipc.wakeup",
    "Waiter": "ipc.wakeup",
}

__all__ = [
    "Chunk",
    "Doorbell",
    "Permissions",
    "RingConsumer",
    "RingFailedError",
    "RingNames",
    "RingProducer",
    "ShmNames",
    "StatePage",
    "Waiter",
    "create_ring",
    "instance_id",
    "reclaim",
    "unlink_ring",
    "wait_for_frames",
    "warm_up",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
