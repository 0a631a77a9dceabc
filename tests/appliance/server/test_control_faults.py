"""Control operations that fail half-way, through the fault points of ``appliance.server.faults``, against a
real ``appliance serve`` (supervisor, writers, broker) and a real Kafka client (confluent-kafka).

What a user must see: the other topics' metadata stays right throughout, the failed topic ends whole or gone
(never both), a retry works, and a restart agrees.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harness import Appliance
from support.kafka_appliance import free_port

from ipc.control import ControlError
from storage.errors import TopicExistsError

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

KEEP = "keep"


class Running:
    """An appliance on a fixed port with a topic ``keep`` of 2 partitions holding 10 records."""

    def __init__(self, cwd: Path, *overrides: str) -> None:
        self.port = free_port()
        self.cwd = cwd
        self.app = Appliance(cwd, f"listeners=PLAINTEXT://127.0.0.1:{self.port}", "num.partitions=2",
                             "topics.keep.partitions=2", *overrides)  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def topics(self) -> dict[str, int]:
        """Topic -> partition count as a Kafka client lists them; every topic and partition error-free.
        The internal topic ``__consumer_offsets`` (created by a consumer's first group request) is left
        out: these tests count the topics they create."""
        metadata = self.admin().list_topics(timeout=10)
        out = {}
        for name, topic in metadata.topics.items():
            if name == "__consumer_offsets":
                continue
            assert topic.error is None, (name, topic.error)
            for partition in topic.partitions.values():
                assert partition.error is None, (name, partition.id, partition.error)
                assert partition.leader == 0, (name, partition.id)
            out[name] = len(topic.partitions)
        return out

    def directories(self, topic: str) -> list[str]:
        return sorted(p.name for p in self.app.data.iterdir() if p.name.startswith(f"{topic}-"))

    def recorded(self) -> dict[str, list[str]]:
        """What topics.json holds: "topics" and "deleting" names."""
        document = json.loads((self.app.data / "meta" / "topics.json").read_text())
        return {part: sorted(document.get(part, {})) for part in ("topics", "deleting")}


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, f"{topic}-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


def consume_count(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                                         "enable.auto.commit": False})  # fmt: skip
    try:
        high = 0
        for p in range(partitions):
            _, end = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)
            high += end
        return high
    finally:
        consumer.close()


@pytest.fixture
def cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield Path(tmp_path_factory.mktemp("faults", numbered=True))


def started(cwd: Path, *overrides: str) -> Running:
    running = Running(cwd, *overrides)
    running.app.start()
    return running


def wait_until(what: str, condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} in {timeout_s} s")
        time.sleep(0.05)


# -- delete -------------------------------------------------------------------------------------------------


def test_a_delete_failing_after_the_writers_stopped_finishes_by_itself(cwd: Path) -> None:
    running = started(cwd, 'appliance.test.faults=["delete.stopped:3"]')
    try:
        produce(running.bootstrap, KEEP, 10)
        with running.app.client() as client:
            client.create_topic("junk", 2)
        wait_until("junk is listed", lambda: running.topics() == {KEEP: 2, "junk": 2})
        produce(running.bootstrap, "junk", 4)
        result = running.app.cli("topics", "delete", "junk", "--bootstrap-server", running.bootstrap)
        assert result.returncode == 0, result.stderr
        # recorded: gone for clients at once, while its directories wait for the retries
        assert running.topics() == {KEEP: 2}
        assert running.recorded()["deleting"] == ["junk"] or running.directories("junk") == []
        wait_until("the deletion finished", lambda: running.recorded() == {"topics": [KEEP], "deleting": []})
        assert running.directories("junk") == []
        # the supervisor logs the end after it rewrote topics.json: wait for the line, don't race it
        wait_until("the end is logged",
                   lambda: "topic junk: its pending deletion finished" in running.app.log())
        log = running.app.log()
        assert "topic junk is marked for deletion but its deletion did not finish" in log
        assert "test fault point delete.stopped" in log
        assert running.topics() == {KEEP: 2}
        assert consume_count(running.bootstrap, KEEP, 2) == 10
        # a retry of the whole story works: the name is free again
        with running.app.client() as client:
            client.create_topic("junk", 2)
        wait_until("junk is listed", lambda: running.topics() == {KEEP: 2, "junk": 2})
        produce(running.bootstrap, "junk", 2)
        assert running.app.stop() == 0
        running.app.overrides = [o for o in running.app.overrides if "test.faults" not in o]
        running.app.start()
        assert running.topics() == {KEEP: 2, "junk": 2}
        assert consume_count(running.bootstrap, "junk", 2) == 2
        assert consume_count(running.bootstrap, KEEP, 2) == 10
        assert "Traceback" not in running.app.log()
    finally:
        running.app.close()


def test_a_delete_that_cannot_finish_is_finished_at_the_next_start(cwd: Path) -> None:
    running = started(cwd, 'appliance.test.faults=["delete.removed:1000000"]')
    try:
        produce(running.bootstrap, KEEP, 10)
        with running.app.client() as client:
            client.create_topic("junk", 2)
            client.delete_topic("junk")
            wait_until("junk is gone", lambda: running.topics() == {KEEP: 2})
            assert running.recorded() == {"topics": [KEEP], "deleting": ["junk"]}
            assert running.directories("junk") == []  # removed before the fault point; the mark stays
            with pytest.raises(TopicExistsError, match="marked for deletion"):
                client.create_topic("junk", 2)
            with pytest.raises(ControlError, match=r"'junk' does not exist"):
                client.delete_topic("junk")
            assert client.metadata([KEEP]).topics[KEEP].partition_count == 2
        assert running.topics() == {KEEP: 2}
        assert running.app.stop() == 0
        running.app.overrides = [o for o in running.app.overrides if "test.faults" not in o]
        running.app.start()
        assert running.recorded() == {"topics": [KEEP], "deleting": []}
        assert "topic junk: its pending deletion finished" in running.app.log()
        assert running.topics() == {KEEP: 2}
        assert consume_count(running.bootstrap, KEEP, 2) == 10
        with running.app.client() as client:
            client.create_topic("junk", 1)
        wait_until("junk is listed", lambda: running.topics() == {KEEP: 2, "junk": 1})
    finally:
        running.app.close()


def test_a_full_disk_at_the_metadata_write_uses_the_reserve_or_changes_nothing(cwd: Path) -> None:
    running = started(cwd)  # keep is created; then the faults, for the writes the client asks for
    assert running.app.stop() == 0
    running.app.overrides.append('appliance.test.faults=["metadata.write:3"]')
    running.app.start()
    try:
        reserve = running.app.data / "meta" / ".reserve"
        assert reserve.stat().st_size >= 256 * 1024
        with running.app.client() as client:
            # the first write fails with ENOSPC, the reserve is released, the second write fails too:
            # the create changes nothing
            with pytest.raises(ControlError, match=r"ENOSPC at test fault point metadata\.write"):
                client.create_topic("junk", 2)
            assert running.topics() == {KEEP: 2}
            assert running.directories("junk") == []
            wait_until("the reserve is back", lambda: reserve.exists() and reserve.stat().st_size >= 262144)
            # one more ENOSPC: the reserve makes room, the create succeeds
            client.create_topic("junk", 2)
            assert "released the metadata reserve" in running.app.log()
            wait_until("junk is listed", lambda: running.topics() == {KEEP: 2, "junk": 2})
            client.delete_topic("junk")
            wait_until("junk is gone", lambda: running.topics() == {KEEP: 2})
            assert reserve.stat().st_size >= 256 * 1024
    finally:
        running.app.close()


# -- create -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["create.partition", "create.recorded"])
def test_a_create_failing_half_way_is_rolled_back_and_a_retry_works(cwd: Path, point: str) -> None:
    running = started(cwd, f'appliance.test.faults=["{point}"]')
    try:
        produce(running.bootstrap, KEEP, 10)
        admin = running.admin()
        futures = admin.create_topics([NewTopic("half", 3, 1)], request_timeout=30)
        with pytest.raises(confluent_kafka.KafkaException, match=f"test fault point {point}"):
            futures["half"].result(30)
        assert running.topics() == {KEEP: 2}
        assert running.recorded() == {"topics": [KEEP], "deleting": []}
        assert running.directories("half") == []
        assert "creating topic half failed after it was recorded" in running.app.log()
        # the retry
        futures = admin.create_topics([NewTopic("half", 3, 1)], request_timeout=30)
        futures["half"].result(30)
        wait_until("half is listed", lambda: running.topics() == {KEEP: 2, "half": 3})
        assert running.app.stop() == 0
        running.app.start()
        assert running.topics() == {KEEP: 2, "half": 3}
        assert consume_count(running.bootstrap, KEEP, 2) == 10
    finally:
        running.app.close()


# -- a real full disk ---------------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True).returncode == 0  # fmt: skip


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the file system is full (to the last block)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 1 << 20
        while size >= 512:
            try:
                os.write(fd, bytes(size))
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                size //= 2
    finally:
        os.close(fd)


def test_a_topic_is_deleted_on_a_full_tmpfs_through_the_reserve(cwd: Path) -> None:
    data = cwd / "data"
    if not _mount_tmpfs(data, "6m"):
        pytest.skip("needs root and tmpfs to mount a small file system")
    # no log-dir reserve (it would refuse every write on 6 MiB): the disk fills for real
    running = Running(cwd, "preallocate=false", "log.dir.min.free.bytes=0", "segment.bytes=262144",
                      "segment.index.bytes=65536")
    try:
        running.app.start()
        produce(running.bootstrap, KEEP, 10)
        with running.app.client() as client:
            client.create_topic("junk", 2)
        wait_until("junk is listed", lambda: running.topics() == {KEEP: 2, "junk": 2})
        produce(running.bootstrap, "junk", 10)
        _fill(data / "filler")
        assert os.statvfs(data).f_bavail == 0
        result = running.app.cli("topics", "delete", "junk", "--bootstrap-server", running.bootstrap)
        assert result.returncode == 0, result.stderr
        assert "released the metadata reserve" in running.app.log()
        wait_until("junk is gone", lambda: running.topics() == {KEEP: 2})
        assert running.recorded() == {"topics": [KEEP], "deleting": []}
        assert running.directories("junk") == []
        assert consume_count(running.bootstrap, KEEP, 2) == 10
        (data / "filler").unlink()
        reserve = data / "meta" / ".reserve"
        wait_until("the reserve is back", lambda: reserve.exists() and reserve.stat().st_size >= 262144)
        assert running.app.stop() == 0
        running.app.start()
        assert running.topics() == {KEEP: 2}
    finally:
        running.app.close()
        subprocess.run(["umount", "-l", str(data)], capture_output=True)
