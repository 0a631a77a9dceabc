"""The public surface of each package, guarded: changing what a package exports is a deliberate act.

Each package's ``__init__`` names its surface in ``__all__`` and resolves the names lazily; this test pins
the lists and checks that every name resolves (so a rename in a module cannot silently break the surface).
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

SURFACES: dict[str, set[str]] = {
    "storage": {
        "AppendInfo",
        "ApplianceError",
        "BackPressureError",
        "BatchHeader",
        "BrokerConnectionError",
        "ByteColumn",
        "ConfigError",
        "CorruptRecordError",
        "DecodedBatch",
        "EARLIEST_TIMESTAMP",
        "FetchSlice",
        "HeaderColumns",
        "InvalidRecordError",
        "LATEST_TIMESTAMP",
        "Log",
        "LogConfig",
        "LogLockedError",
        "LogReader",
        "NotEnoughReplicasError",
        "NotLeaderError",
        "OffsetAndTimestamp",
        "OffsetOutOfRangeError",
        "ProducerIdBlockAllocator",
        "ProducerStateManager",
        "ProtocolError",
        "Record",
        "RecordColumns",
        "RequestTimeoutError",
        "SegmentInfo",
        "UnknownTopicOrPartitionError",
        "Verdict",
        "build",
        "build_batch",
        "build_into",
        "decode_batch",
        "encoded_size",
        "iter_batches",
        "iter_records",
        "max_encoded_size",
        "open_read_only",
        "parse_header",
        "validate_batch",
    },
    "ipc": {
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
    },
    "replicas": {
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
    },
    "appliance": {
        "BulkHandle",
        "BulkMetadata",
        "Config",
        "Consumer",
        "ConsumerRecord",
        "ControlClient",
        "ControlError",
        "KafkaAdmin",
        "Producer",
        "RecordArrays",
        "RecordHandle",
        "RecordMetadata",
        "TopicPartition",
        "load_config",
    },
}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_the_public_surface_is_exactly_the_agreed_one(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == SURFACES[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name} does not resolve"


def test_every_error_derives_from_the_one_root() -> None:
    import storage

    for name in SURFACES["storage"]:
        value = getattr(storage, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, storage.ApplianceError), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    import storage

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = storage.Nope  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "package,forbidden",
    [
        ("storage", ("appliance", "ipc", "replicas")),
        ("ipc", ("appliance", "replicas")),
        ("replicas", ("appliance",)),
    ],
)
def test_packages_import_only_downward(package: str, forbidden: tuple[str, ...]) -> None:
    """Importing every module of a package loads nothing from the packages above it."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"import {package}\n"
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {forbidden!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{package} imports {out.stdout.strip()}"
