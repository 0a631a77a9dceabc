"""Writers on demand: a partition's writer process runs only while the partition is being written.

Real ``appliance serve`` process trees with their broker (``support.kafka_appliance``); writers are found
by their process titles in ``/proc``; producers are the local Producer, confluent-kafka and the raw ring
producer of ``support.harness``; what was acknowledged is read back from the log files.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.harness import RawProducer
from support.kafka_appliance import Appliance, start_appliance, stop_appliance

from appliance.client.producer import Producer
from appliance.server.writer_demand import IDLE_STOPS_AT_ONCE
from ipc.control import ControlClient
from ipc.ring import warm_up
from storage.batch_header import parse_header
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")

warm_up()

IDLE_MS = 300


@pytest.fixture
def running() -> Iterator[list[Appliance]]:
    """Appliances a test started; stopped afterwards whatever happened."""
    made: list[Appliance] = []
    yield made
    for appliance in made:
        if appliance.process.poll() is None:
            appliance.process.kill()
            appliance.process.wait()


def start(tmp: Path, running: list[Appliance], topics: dict[str, int], *lines: str,
          idle_ms: int = IDLE_MS) -> Appliance:
    extra = "\n".join([f'"appliance.writer.idle.ms" = {idle_ms}', *lines])
    appliance = start_appliance(tmp, topics, extra)
    running.append(appliance)
    return appliance


def writers(appliance: Appliance) -> dict[str, int]:
    """The running partition writers: partition name -> pid, from the process titles."""
    pid = appliance.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    found = {}
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                title = f.read().rstrip(b"\0").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("appliance: writer "):
            found[title.removeprefix("appliance: writer ")] = child
    return found


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def control(appliance: Appliance) -> ControlClient:
    return ControlClient.connect(appliance.data_dir / ".appliance.sock", timeout_s=30)


def logged_offsets(appliance: Appliance, topic: str, partition: int) -> list[int]:
    """Every record offset in the partition's log files."""
    offsets: list[int] = []
    with LogReader(str(appliance.data_dir / f"{topic}-{partition}")) as reader:
        for batch in reader.batches():
            header = parse_header(batch)
            offsets += range(header.base_offset, header.base_offset + header.last_offset_delta + 1)
    return offsets


def test_an_idle_partition_has_no_writer_and_a_producer_starts_it(tmp_path: Path,
                                                                  running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {"t": 1, "k": 3})
    time.sleep(IDLE_MS / 1000)
    assert writers(appliance) == {}, "no partition is written: no writer runs"
    with control(appliance) as client:
        described = client.metadata(["k"]).topics["k"].partitions
    assert [p.writer_pid for p in described] == [0, 0, 0], "metadata shows the partitions without writers"

    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        acked = [producer.send("t", b"local %d" % i).get(30).offset for i in range(20)]
        assert set(writers(appliance)) == {"t-0"}, "the local producer started its partition's writer"
    wait_until(lambda: not writers(appliance), "the writer did not exit once the producer left", 10)
    assert logged_offsets(appliance, "t", 0) == acked == list(range(20))

    kafka = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 0,
                                      "enable.idempotence": True})  # fmt: skip
    delivered: list[int] = []
    for i in range(20):
        kafka.produce("k", b"kafka %d" % i, partition=2,
                      on_delivery=lambda err, msg: delivered.append(-1 if err else msg.offset()))
    assert kafka.flush(30) == 0
    assert delivered == list(range(20))
    assert "k-2" in writers(appliance), "the broker's produce started the partition's writer"
    assert logged_offsets(appliance, "k", 2) == delivered
    assert logged_offsets(appliance, "k", 0) == []

    with control(appliance) as client:  # the first writer left its state page as it was
        page = client.metadata(["t"]).topics["t"].partitions[0]
    assert (page.writer_pid, page.log_end_offset, page.high_watermark) == (0, 20, 20)
    stop_appliance(appliance)
    assert "Traceback" not in appliance.log_text()


def test_a_killed_writer_is_restarted_and_nothing_acknowledged_is_lost(tmp_path: Path,
                                                                       running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {"k": 1})
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        acked = [producer.send("k", b"before %d" % i).get(30).offset for i in range(50)]
        pid = writers(appliance)["k-0"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: writers(appliance).get("k-0") not in (None, pid),
                   "the killed writer was not restarted")
        acked += [producer.send("k", b"after %d" % i).get(30).offset for i in range(50)]
    assert acked == list(range(100))
    assert logged_offsets(appliance, "k", 0) == acked
    assert "writer k-0 was killed by signal 9" in appliance.log_text()
    stop_appliance(appliance)


def test_retention_by_time_runs_on_a_partition_with_no_writer(tmp_path: Path,
                                                              running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {}, '"log.retention.check.interval.ms" = 500',
                      "[topics.r]", "partitions = 1", '"segment.bytes" = 1024', '"retention.ms" = 4000')
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        for i in range(30):
            producer.send("r", b"%04d" % i + b"x" * 200).get(30)
    directory = appliance.data_dir / "r-0"
    segments = sorted(directory.glob("*.log"))
    assert len(segments) > 2
    wait_until(lambda: not writers(appliance), "the writer did not exit once the producer left", 10)

    def start_offset() -> int:
        with control(appliance) as client:
            return client.metadata(["r"]).topics["r"].partitions[0].log_start_offset

    assert start_offset() == 0 and sorted(directory.glob("*.log")) == segments, "not retained yet"
    # the log start offset moves before the segments below it are unlinked: wait for both
    wait_until(lambda: start_offset() > 0 and len(list(directory.glob("*.log"))) == 1,
               "retention did not delete every closed segment (all past retention.ms)", 20)
    wait_until(lambda: not writers(appliance), "the writer started for retention did not exit", 10)
    assert "retention deleted" in appliance.log_text()
    stop_appliance(appliance)


def test_attaches_racing_idle_exits_lose_nothing(tmp_path: Path, running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {"race": 1}, idle_ms=0)
    acked: list[int] = []
    pids: set[int] = set()
    with control(appliance) as client:
        for cycle in range(40):
            producer = RawProducer(client, "race", 0)
            producer.send([b"cycle %d" % cycle, b"second"])
            assert producer.ring.wait_acks(0, 30_000), f"cycle {cycle}: no ack"
            pids.add(writers(appliance).get("race-0", 0))
            producer.poll()
            acked += list(producer.acked.values())  # the base offset of the batch of two
            producer.close()
            client.detach(producer.attachment)
            time.sleep(0.02 * (cycle % 4))  # some attaches meet a writer stopping, some a new one
    assert sorted(acked) == list(range(0, 80, 2))
    assert len(pids - {0}) > 5, "writers stopped between the producers and new ones were started"
    assert logged_offsets(appliance, "race", 0) == list(range(80))
    stop_appliance(appliance)
    assert "Traceback" not in appliance.log_text()


def test_writers_idle_together_stop_a_few_at_a_time(tmp_path: Path, running: list[Appliance]) -> None:
    """Many writers idle at the same moment are told to stop at most IDLE_STOPS_AT_ONCE at a time (each
    clean stop fsyncs several files); every one stops cleanly, none is killed, nothing is lost."""
    partitions = 4 * IDLE_STOPS_AT_ONCE
    appliance = start(tmp_path, running, {"many": partitions}, '"appliance.log.level" = "DEBUG"')
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        sent = [producer.send("many", b"record", partition=p) for p in range(partitions)]
        assert [future.get(30).offset for future in sent] == [0] * partitions
    wait_until(lambda: not writers(appliance) and appliance.log_text().count(" stopped: no producer attached")
               >= partitions, "the idle writers did not all stop", 120)  # fmt: skip
    stopping: set[str] = set()
    most = 0
    for line in appliance.log_text().splitlines():
        told = re.search(r"writer (many-\d+) \(pid \d+\) told to stop: no producer attached", line)
        stopped = re.search(r"writer (many-\d+) stopped: no producer attached", line)
        if told:
            stopping.add(told[1])
            most = max(most, len(stopping))
        elif stopped:
            assert stopped[1] in stopping, f"{stopped[1]} stopped without being told: {line}"
            stopping.remove(stopped[1])
    assert 1 <= most <= IDLE_STOPS_AT_ONCE, f"{most} writers were stopping at once"
    assert not stopping, f"told to stop, never stopped cleanly: {sorted(stopping)}"
    assert "did not stop" not in appliance.log_text()
    assert [logged_offsets(appliance, "many", p) for p in range(partitions)] == [[0]] * partitions
    stop_appliance(appliance)


def test_a_restart_with_idle_partitions_forks_no_writer(tmp_path: Path, running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {"again": 4})
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        for p in range(4):
            producer.send("again", b"first run", partition=p).get(30)
    stop_appliance(appliance)
    running.clear()

    appliance = start(tmp_path, running, {"again": 4})
    assert writers(appliance) == {}, "recovered partitions get no writer at start-up"
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        offsets = [producer.send("again", b"second run", partition=p).get(30).offset for p in range(4)]
    assert offsets == [1, 1, 1, 1]
    assert [logged_offsets(appliance, "again", p) for p in range(4)] == [[0, 1]] * 4
    stop_appliance(appliance)


def rings_of(topic: str) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if f"-ring-{topic}-" in name]


def test_rings_attached_ahead_start_no_writer_until_a_record_is_published(tmp_path: Path,
                                                                           running: list[Appliance]) -> None:
    appliance = start(tmp_path, running, {"ahead": 8, "kahead": 40},
                      '"appliance.ring.idle.ms" = 500')  # fmt: skip
    seen: set[str] = set()
    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        assert producer.send("ahead", b"zero", partition=0).get(30).offset == 0
        assert len(rings_of("ahead")) == 8, "the local producer attached rings ahead to the other partitions"
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # several looks of the supervisor at the held partitions
            seen |= set(writers(appliance))
            time.sleep(0.05)
        assert seen == {"ahead-0"}, "a ring attached ahead and not written started a writer"
        assert producer.send("ahead", b"three", partition=3).get(30).offset == 0
        assert set(writers(appliance)) == {"ahead-0", "ahead-3"}, "the first record started its writer"
    wait_until(lambda: not rings_of("ahead"), "rings attached ahead were not removed when the producer left")
    assert logged_offsets(appliance, "ahead", 3) == [0]
    assert all(logged_offsets(appliance, "ahead", p) == [] for p in (1, 2, 4, 5, 6, 7))

    kafka = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 0,
                                      "enable.idempotence": True})  # fmt: skip
    kafka.produce("kahead", b"zero", partition=0)
    assert kafka.flush(30) == 0
    assert len(rings_of("kahead")) > 1, "the broker attached rings ahead"
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        seen |= set(writers(appliance))
        time.sleep(0.05)
    assert {w for w in seen if w.startswith("kahead")} == {"kahead-0"}
    wait_until(lambda: not rings_of("kahead"), "the broker's rings attached ahead were not let go")
    assert "kahead-1" not in writers(appliance) and logged_offsets(appliance, "kahead", 1) == []
    stop_appliance(appliance)
    assert "Traceback" not in appliance.log_text()
