"""The public surface of each package, guarded: changing what a package exports is a deliberate act; and the
one-way import rule between packages and between the rooms of ``appliance/``.

Each package's ``__init__`` names its surface in ``__all__`` and resolves the names lazily; this test pins
the lists and checks that every name resolves (so a rename in a module cannot silently break the surface).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

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
        "KafkaStorageError",
        "SwapInProgressError",
        "LATEST_TIMESTAMP",
        "MAX_TIMESTAMP",
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
        "GroupError",
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


# -- the rooms of appliance/ and the one-way rule, read from the source ------------------------------------

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("cli", "server", "broker", "follower", "client", "config", "spark", "cleaner", "coordinator")
# what each room may not import (besides `bench`, which nothing imports): `cli` is on top; `client` never
# reaches the service side; the service side never reaches the client; `config` is read by every room;
# `coordinator` (the group state machine) is called by the broker alone
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "appliance.cli": (),
    "appliance.server": ("appliance.cli", "appliance.client", "appliance.spark", "appliance.broker",
                         "appliance.follower", "appliance.cleaner", "appliance.coordinator"),
    "appliance.broker": ("appliance.cli", "appliance.client", "appliance.spark", "appliance.follower",
                         "appliance.cleaner"),
    "appliance.follower": ("appliance.cli", "appliance.client", "appliance.spark", "appliance.broker",
                           "appliance.cleaner", "appliance.coordinator"),
    "appliance.cleaner": ("appliance.cli", "appliance.client", "appliance.spark", "appliance.broker",
                          "appliance.follower", "appliance.coordinator"),
    "appliance.client": ("appliance.cli", "appliance.server", "appliance.broker", "appliance.follower",
                         "appliance.spark", "appliance.cleaner", "appliance.coordinator"),
    "appliance.spark": ("appliance.cli", "appliance.server", "appliance.broker", "appliance.follower",
                        "appliance.cleaner", "appliance.coordinator"),
    "appliance.config": ("appliance.cli", "appliance.server", "appliance.broker", "appliance.follower",
                         "appliance.client", "appliance.spark", "appliance.cleaner", "appliance.coordinator"),
    "appliance.coordinator": ("appliance.cli", "appliance.server", "appliance.broker", "appliance.follower",
                              "appliance.client", "appliance.spark", "appliance.cleaner"),
    "storage": ("appliance", "ipc", "replicas"),
    "ipc": ("appliance", "replicas"),
    "replicas": ("appliance",),
}


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (``from X import y`` counts X.y too)."""
    names: set[str] = set()
    package = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package upwards
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_every_module_of_appliance_lives_in_a_room() -> None:
    flat = sorted(p.name for p in (REPO / "appliance").glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules directly in appliance/: {flat}"
    rooms = sorted(p.name for p in (REPO / "appliance").iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(ROOMS)


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_only_what_the_rule_allows(room: str) -> None:
    """Static: function-level imports count; a child named by string (``"module:function"``) does not."""
    forbidden = (*FORBIDDEN[room], "bench")
    bad = []
    for path in sorted((REPO / room.replace(".", "/")).rglob("*.py")):
        for name in _imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert bad == []
