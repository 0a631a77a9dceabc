"""The supervisor's topic metadata store: persistence, placement, refusals, and damaged files."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from appliance.config.server_config import load_config
from appliance.config.topic_metadata import read_topics
from appliance.server.faults import ControlFaults
from appliance.server.metadata import MetadataStore
from storage.errors import ConfigError, CorruptRecordError, TopicExistsError, UnknownTopicOrPartitionError


def test_topics_persist_and_reload_in_creation_order(tmp_path: Path) -> None:
    store = MetadataStore.open([str(tmp_path)])
    orders = store.create_topic("orders", 3, 1, {"retention.ms": 1000})
    store.create_topic("audit.log", 1, 1)
    uuid.UUID(orders.topic_id)
    assert orders.directory(2) == str(tmp_path / "orders-2")
    reopened = MetadataStore.open([str(tmp_path)])
    assert list(reopened.topics) == ["orders", "audit.log"]
    assert reopened.get("orders") == orders
    assert read_topics(store.path) == reopened.topics
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"
    assert not list(store.path.parent.glob("*.tmp"))


@pytest.mark.parametrize(("stored", "policy"), [
    ("compact", ("compact",)),
    (["compact", "delete"], ("delete", "compact")),
])
def test_a_compacted_topic_stored_by_an_earlier_version_is_compacted_now(
        tmp_path: Path, stored: object, policy: tuple[str, ...]) -> None:
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("kept", 1, 1, {"retention.ms": 5})
    raw = json.loads(store.path.read_text())
    raw["topics"]["kept"]["configs"]["cleanup.policy"] = stored
    store.path.write_text(json.dumps(raw))
    assert read_topics(store.path)["kept"].configs == {"cleanup.policy": stored, "retention.ms": 5}
    assert load_config().topic("kept", read_topics(store.path)["kept"].configs).cleanup_policy == policy


def test_a_per_topic_replica_list_written_before_per_partition_sets_still_loads(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    meta.mkdir()
    old = {"version": 1, "topics": {"kept": {
        "topic_id": str(uuid.uuid4()), "partitions": 2, "replication_factor": 3, "configs": {},
        "log_dirs": [str(tmp_path)] * 2, "replicas": [0, 1, 2]}}}  # fmt: skip
    (meta / "topics.json").write_text(json.dumps(old))
    kept = MetadataStore.open([str(tmp_path)]).get("kept")
    assert [kept.partition_replicas(p) for p in range(2)] == [(0, 1, 2), (0, 1, 2)]
    assert kept.nodes == (0, 1, 2) and kept.assignments == ()
    assert json.loads((meta / "topics.json").read_text()) == old  # opened, not rewritten


def test_replicas_per_partition_are_kept_in_the_order_given(tmp_path: Path) -> None:
    store = MetadataStore.open([str(tmp_path)])
    spread = store.create_topic("spread", 3, 2, assignments=((0, 1), (2, 0), (0, 2)))
    alike = store.create_topic("alike", 2, 2, assignments=((0, 1), (0, 1)))
    assert [spread.partition_replicas(p) for p in range(3)] == [(0, 1), (2, 0), (0, 2)]
    assert spread.nodes == (0, 1, 2)
    assert alike.replicas == (0, 1) and alike.assignments == ()  # the per-topic form when all are alike
    raw = json.loads(store.path.read_text())["topics"]
    assert raw["spread"]["assignments"] == [[0, 1], [2, 0], [0, 2]] and "replicas" not in raw["spread"]
    assert raw["alike"]["replicas"] == [0, 1] and "assignments" not in raw["alike"]
    assert MetadataStore.open([str(tmp_path)]).topics == store.topics
    grown = store.set_partition_count("alike", 4, assignments=((1, 0), (0, 1)))
    assert [grown.partition_replicas(p) for p in range(4)] == [(0, 1), (0, 1), (1, 0), (0, 1)]
    assert store.set_partition_count("alike", 2).replicas == (0, 1)  # the roll-back: alike again
    with pytest.raises(ConfigError, match="replicas \\[0, 0\\]"):
        store.create_topic("bad", 2, 2, assignments=((0, 1), (0, 0)))
    assert "bad" not in MetadataStore.open([str(tmp_path)])


def test_delete_forgets_the_topic(tmp_path: Path) -> None:
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("t", 1, 1)
    store.delete_topic("t")
    assert "t" not in MetadataStore.open([str(tmp_path)])
    with pytest.raises(UnknownTopicOrPartitionError, match="'t' does not exist"):
        store.delete_topic("t")


@pytest.mark.parametrize(
    ("name", "partitions", "error", "match"),
    [
        ("bad name!", 1, ConfigError, "may contain only"),
        ("", 1, ConfigError, "cannot be empty"),
        ("..", 1, ConfigError, "cannot be"),
        ("t", 0, ConfigError, "0 partitions"),
        ("dup", 1, TopicExistsError, "already exists"),
        ("a_b", 1, TopicExistsError, "collides with existing topic 'a.b'"),
    ],
)
def test_refusals_change_nothing(tmp_path: Path, name: str, partitions: int, error: type[Exception],
                                 match: str) -> None:  # fmt: skip
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("dup", 2, 1)
    store.create_topic("a.b", 1, 1)
    before = store.path.read_bytes()
    with pytest.raises(error, match=match):
        store.create_topic(name, partitions, 1)
    assert store.path.read_bytes() == before
    with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0\.\.1, not 2"):
        store.get("dup").directory(2)


def test_partitions_spread_over_log_dirs_and_follow_a_dir_that_moved(tmp_path: Path) -> None:
    dirs = [str(tmp_path / d) for d in ("a", "b", "c")]
    store = MetadataStore.open(dirs)
    first = store.create_topic("x", 4, 1)
    assert first.log_dirs == (dirs[0], dirs[1], dirs[2], dirs[0])
    second = store.create_topic("y", 2, 1)
    assert second.log_dirs == (dirs[1], dirs[2]), "the emptiest dirs first"
    os.makedirs(os.path.join(dirs[2], "x-2"))
    os.makedirs(os.path.join(dirs[0], "x-2.old"))
    moved = MetadataStore.open([dirs[0], dirs[2]])  # dir b left log.dirs; x-1 and y-0 lived there
    assert moved.get("x").log_dirs[2] == dirs[2]
    assert set(moved.get("x").log_dirs) <= {dirs[0], dirs[2]}
    assert moved.get("y").log_dirs[0] in (dirs[0], dirs[2])
    assert MetadataStore.open([dirs[0], dirs[2]]).topics == moved.topics, "the move was saved"


def _valid_file(tmp_path: Path) -> Path:
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("orders", 2, 1, {"retention.ms": 5})
    return store.path


def test_every_truncation_of_the_file_is_refused_never_guessed(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    data = path.read_bytes()
    for size in range(len(data.rstrip())):
        path.write_bytes(data[:size])
        if size == 0:
            with pytest.raises(CorruptRecordError, match="not valid JSON"):
                read_topics(path)
            continue
        with pytest.raises(CorruptRecordError, match=str(path)):
            read_topics(path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d.pop("topics"), "no \"topics\" object"),
        (lambda d: d["topics"].update({"bad name": d["topics"]["orders"]}), "not a legal topic name"),
        (lambda d: d["topics"]["orders"].update(partitions=0), "partitions 0"),
        (lambda d: d["topics"]["orders"].update(partitions=True), "partitions True"),
        (lambda d: d["topics"]["orders"].update(topic_id="nope"), "not a UUID"),
        (lambda d: d["topics"]["orders"].update(replication_factor=0), "replication_factor 0"),
        (lambda d: d["topics"]["orders"].update(log_dirs=["relative"] * 2), "absolute paths"),
        (lambda d: d["topics"]["orders"].update(log_dirs=["/a"]), "must list 2"),
        (lambda d: d["topics"]["orders"].update(configs=[1]), "configs"),
        (lambda d: d["topics"].update(orders=[]), "expected an object"),
        (lambda d: d["topics"]["orders"].update(replication_factor=2, assignments=[[0, 1]]),
         "assignments must list the replicas of 2 partitions"),
        (lambda d: d["topics"]["orders"].update(replication_factor=2, assignments=[[0, 1], [1, 1]]),
         "partition 1: replicas must list 2 distinct"),
        (lambda d: d["topics"]["orders"].update(replication_factor=2, replicas=[0, 1],
                                                assignments=[[0, 1], [1, 0]]), "both replicas and"),
    ],
)
def test_damaged_content_is_refused_with_the_file_and_the_reason(tmp_path: Path, change: object,
                                                                 match: str) -> None:  # fmt: skip
    path = _valid_file(tmp_path)
    document = json.loads(path.read_text())
    change(document)  # type: ignore[operator]
    path.write_text(json.dumps(document))
    with pytest.raises(CorruptRecordError, match=match):
        MetadataStore.open([str(tmp_path)])


def test_trailing_garbage_and_a_stale_temporary_file(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    good = path.read_bytes()
    path.with_name(path.name + ".tmp").write_bytes(b"half a write")
    assert "orders" in MetadataStore.open([str(tmp_path)]), "a crash during a write leaves the old file"
    assert not path.with_name(path.name + ".tmp").exists()
    path.write_bytes(good + b"}")
    with pytest.raises(CorruptRecordError, match="not valid JSON"):
        read_topics(path)


def test_a_deletion_in_progress_is_recorded_apart_and_blocks_the_name(tmp_path: Path) -> None:
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("keep", 1, 1)
    store.create_topic("gone", 2, 1)
    store.mark_deleting("gone")
    assert list(read_topics(store.path)) == ["keep"]  # every reader sees it gone
    reopened = MetadataStore.open([str(tmp_path)])
    assert list(reopened.topics) == ["keep"] and list(reopened.deleting) == ["gone"]
    with pytest.raises(TopicExistsError, match="marked for deletion"):
        reopened.create_topic("gone", 1, 1)
    with pytest.raises(UnknownTopicOrPartitionError):
        reopened.get("gone")
    reopened.forget_deleted("gone")
    assert MetadataStore.open([str(tmp_path)]).deleting == {}
    reopened.create_topic("gone", 1, 1)


def test_a_failed_write_changes_nothing_and_the_reserve_makes_room(tmp_path: Path) -> None:
    store = MetadataStore.open([str(tmp_path)], reserve=True, faults=ControlFaults(["metadata.write:2"]))
    reserve = tmp_path / "meta" / ".reserve"
    assert reserve.stat().st_size >= 256 * 1024
    with pytest.raises(OSError, match="ENOSPC"):  # fails twice: before and after the reserve is released
        store.create_topic("t", 1, 1)
    assert "t" not in store and read_topics(store.path) == {}
    assert not list(store.path.parent.glob("*.tmp"))
    assert reserve.stat().st_size >= 256 * 1024  # made again at once: the disk is not really full
    store.faults = ControlFaults(["metadata.write:1"])
    store.create_topic("t", 1, 1)  # the first write fails, the second (after the release) succeeds
    assert list(read_topics(store.path)) == ["t"]
    with pytest.raises(ConfigError, match="reserved for the appliance's internal topics"):
        store.create_topic("__t", 1, 1)
    store.create_topic("__t", 1, 1, internal=True)
