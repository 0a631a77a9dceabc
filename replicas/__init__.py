"""Replication: leader-side replica state (follower offsets, ISR, high watermark), acks=all waiters,
leader epochs and truncation, and the follower fetcher.  Never imports ``appliance``.

The names below are the package's public surface (guarded by tests/test_public_api.py).  They are
resolved lazily, so importing one submodule does not load the numba kernels of all the others.
"""

from __future__ import annotations

from storage.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "PartitionReplicaState": "replicas.replica_state",
    "ReplicaUpdate": "replicas.replica_state",
    "FollowerStatus": "replicas.replica_state",
    "PendingAcks": "replicas.acks",
    "follower_truncation": "replicas.leader_epochs",
    "begin_leader_epoch": "replicas.leader_epochs",
    "answer_offset_for_leader_epoch": "replicas.leader_epochs",
    "LeaderConnection": "replicas.leader_connection",
    "leader_from_metadata": "replicas.leader_connection",
    "PartitionFetcher": "replicas.fetcher",
    "FetcherConfig": "replicas.fetcher",
}

__all__ = [
    "FetcherConfig",
    "FollowerStatus",
    "LeaderConnection",
    "PartitionFetcher",
    "PartitionReplicaState",
    "PendingAcks",
    "ReplicaUpdate",
    "answer_offset_for_leader_epoch",
    "begin_leader_epoch",
    "follower_truncation",
    "leader_from_metadata",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
