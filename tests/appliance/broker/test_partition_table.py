"""The broker's partition table (``appliance.broker.partitions``) and its replica bookkeeping
(``appliance.broker.replication``) as the supervisor's metadata changes: which partitions it answers for as
their leader, and the ``min.insync.replicas`` acks=all writes are judged by; on a real partition directory
and state page."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.partitions import PartitionTable, TopicMeta
from appliance.broker.replication import LeaderReplication
from ipc.kafka import ErrorCode
from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import StatePage

TOPIC = "moved"
NODE = 1


@pytest.fixture
def table(tmp_path: Path) -> Iterator[PartitionTable]:
    """A table of node 1 over a log dir holding ``moved-0`` and its state page."""
    log_dir = tmp_path / "data"
    (log_dir / f"{TOPIC}-0").mkdir(parents=True)
    names = ShmNames.for_data_dir(str(log_dir))
    name = names.state_page(TOPIC, 0)
    unlink_shared_memory(name)
    page = StatePage.create(name)
    table = PartitionTable((str(log_dir),), names, NODE)
    try:
        yield table
    finally:
        table.close()
        page.close()
        page.unlink()


def test_a_partition_whose_leadership_moved_away_is_answered_not_leader(table: PartitionTable) -> None:
    led_here = TopicMeta(TOPIC, 1, replication_factor=2, replicas={0: (NODE, 2)}, leaders={0: NODE})
    table.update({TOPIC: led_here})
    handle, code = table.lookup(TOPIC, 0)
    assert code == ErrorCode.NONE and handle is not None

    table.update({TOPIC: dataclasses.replace(led_here, leaders={0: 2})})

    assert table.lookup(TOPIC, 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert handle.closed  # the replication layer drops its state for it (LeaderReplication.sync)

    table.update({TOPIC: led_here})  # led here again: a fresh handle
    again, code = table.lookup(TOPIC, 0)
    assert code == ErrorCode.NONE and again is not None and again is not handle


def test_an_altered_min_insync_replicas_judges_the_next_acks_all_append(table: PartitionTable) -> None:
    meta = TopicMeta(TOPIC, 1, replication_factor=2, replicas={0: (NODE, 2)}, leaders={0: NODE})
    table.update({TOPIC: meta})
    replication = LeaderReplication(table, NODE, replica_lag_time_max_ms=30_000,
                                    min_insync_replicas=lambda m: m.min_insync_replicas)
    try:
        replication.sync()
        handle, _ = table.lookup(TOPIC, 0)
        assert handle is not None
        assert replication.append_error(handle, -1) == ErrorCode.NONE  # ISR {1, 2}, min.insync 1

        table.update({TOPIC: dataclasses.replace(meta, min_insync_replicas=3)})  # an AlterConfigs
        replication.sync()

        assert replication.append_error(handle, -1) == ErrorCode.NOT_ENOUGH_REPLICAS
        assert replication.append_error(handle, 1) == ErrorCode.NONE
        assert handle.page.min_insync_replicas == 3  # what the writer and `appliance replica` read
    finally:
        replication.close()
