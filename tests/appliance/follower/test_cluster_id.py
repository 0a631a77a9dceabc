"""One cluster id for a replicated set (``appliance.config.cluster_id``): real processes, kafka-python.

A leader on an empty directory creates the id; a replica on an empty directory takes it; a promoted replica
reports it (``KafkaAdminClient.describe_cluster()``); a replica holding another cluster's id refuses to
follow; an appliance from before the file existed keeps the id it reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.replication_cluster import REPO, TOPIC, Node, in_sync, wait_until

from appliance.config.cluster_id import (
    ensure_cluster_id,
    meta_properties_path,
    read_cluster_id,
    write_cluster_id,
)
from ipc.shm import instance_id
from storage.errors import CorruptRecordError

kafka = pytest.importorskip("kafka")

SETTINGS = {"replica.lag.time.max.ms": 2000, "replica.fetch.backoff.ms": 50, "min.insync.replicas": 1}
TOPICS = {TOPIC: {"partitions": 1, "replication.factor": 2}}


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    root = Path(os.path.realpath(tmp_path))
    made = [Node(root, i, settings=SETTINGS, topics=TOPICS) for i in range(3)]
    for node in made:
        node.leaders = made[0].address + "," + made[1].address
    try:
        yield made
    finally:
        for node in made:
            node.close()


def described_cluster_id(node: Node) -> str:
    admin = kafka.KafkaAdminClient(bootstrap_servers=node.address, request_timeout_ms=10000)
    try:
        return str(admin.describe_cluster()["cluster_id"])
    finally:
        admin.close()


def stored(node: Node) -> str | None:
    return read_cluster_id([str(node.data)])


def sees_itself_in_sync(replica: Node) -> bool:
    partitions = replica.status()["partitions"]
    return bool(partitions) and all(p["in_isr"] for p in partitions)


def test_one_cluster_id_across_a_replica_on_an_empty_directory_and_a_promotion(nodes: list[Node]) -> None:
    n0, n1, n2 = nodes
    n0.start("serve")
    n0.wait_role("leader")
    cluster_id = stored(n0)
    assert cluster_id is not None and len(cluster_id) == 22 and not cluster_id.startswith("appliance-")
    assert described_cluster_id(n0) == cluster_id

    # a replica started on an empty directory joins under the leader's id
    assert not n1.data.exists()
    n1.start("replica", f"appliance.replica.leader={n1.leaders}")
    wait_until("replica 1 in the ISR", lambda: in_sync(n0, {1}), timeout_s=30)
    # promotion trusts the replica's own last view of the ISR, refreshed periodically: wait for it too
    wait_until("replica 1 sees itself in the ISR", lambda: sees_itself_in_sync(n1), timeout_s=30)
    assert stored(n1) == cluster_id
    assert f"joining cluster {cluster_id}" in n1.log_text()

    # a node holding another cluster's id refuses to follow this leader, and says why
    write_cluster_id([str(n2.data)], "another-cluster")
    n2.start("replica", f"appliance.replica.leader={n0.address}")
    wait_until("replica 2 refuses", lambda: "INCONSISTENT_CLUSTER_ID" in n2.log_text(), timeout_s=30)
    status = n2.wait_role("replica")
    assert "INCONSISTENT_CLUSTER_ID" in str(status["unreachable"])
    assert status["partitions"] == []
    assert stored(n2) == "another-cluster"
    assert not os.path.exists(n2.directory())
    n2.stop()

    # the leader dies; the replica is promoted and reports the same id
    n0.kill()
    time.sleep(0.3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    promoted = subprocess.run([sys.executable, "-m", "appliance.cli", "replicas", "promote", "--all",
                               "--control-socket", n1.control_socket, "--wait", "30"],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr + n1.log_text()[-3000:]
    n1.wait_role("leader")
    assert described_cluster_id(n1) == cluster_id
    assert stored(n1) == cluster_id
    # and the old leader, back as a replica of the new one, keeps it
    n0.start("serve", f"appliance.replica.leader={n1.address}")
    n0.wait_role("replica")
    wait_until("node 0 in the ISR of node 1", lambda: in_sync(n1, {0}), timeout_s=30)
    assert stored(n0) == cluster_id
    assert "INCONSISTENT_CLUSTER_ID" not in n0.log_text()


def test_an_existing_data_dir_keeps_the_id_it_reported_and_a_new_one_gets_a_fresh_id(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "topics.json").write_text('{"version": 1, "topics": {}}\n')
    instance = instance_id(old)
    assert ensure_cluster_id([str(old)], instance) == f"appliance-{instance}"
    assert ensure_cluster_id([str(old)], instance) == f"appliance-{instance}"  # created once, then read
    new = tmp_path / "new"
    fresh = ensure_cluster_id([str(new)], instance_id(new))
    assert len(fresh) == 22 and fresh == read_cluster_id([str(new)])
    assert fresh != ensure_cluster_id([str(tmp_path / "other")], instance_id(tmp_path / "other"))
    meta_properties_path([str(new)]).write_text("cluster.id=\n")
    with pytest.raises(CorruptRecordError, match=r"meta\.properties: cluster id ''"):
        read_cluster_id([str(new)])
