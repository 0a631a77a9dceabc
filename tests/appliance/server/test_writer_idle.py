"""An idle partition writer sleeps until it has something to do; liveness is read from shared memory.

Real ``appliance serve`` process trees (``support.harness.Appliance``).  Wake-ups are counted as the kernel
counts them: the voluntary context switches of every thread of the writer process (``/proc/PID/task/*/
status``); nothing is timed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harness import Appliance, RawProducer, logged_sequences

from appliance.server.faults import WRITER_STALL_MARKER
from ipc.ring import warm_up
from ipc.state_page import StatePage

warm_up()

RESIDENT = "appliance.writer.idle.ms=-1"  # these tests are about running writers: every partition has one


@pytest.fixture
def appliances() -> Iterator[list[Appliance]]:
    """Appliances a test made; each is killed and cleaned up afterwards whatever happened."""
    made: list[Appliance] = []
    yield made
    for appliance in made:
        appliance.close()


def wake_ups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` so far (each sleep that ended is one)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def page_of(serve: Appliance, topic: str, partition: int) -> StatePage:
    with serve.client() as client:
        return StatePage.attach(client.metadata([topic]).topics[topic].partitions[partition].state_page)


def wait_until(condition: object, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_an_idle_writer_makes_no_wake_ups_and_is_seen_asleep(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=2", RESIDENT)
    appliances.append(serve)
    serve.start()
    writers = serve.writers(2)
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)
        producer.send([b"one record, then nothing"])
        assert producer.ring.wait_acks(0, 5000)
        page = page_of(serve, "t", 0)
        try:
            wait_until(lambda: page.writer_busy_ms < 0, "the writer never went to sleep")
            time.sleep(0.5)  # the producer's attach and ack have settled
            before = {pid: wake_ups(pid) for pid in writers}
            time.sleep(4.0)
            woke = {pid: wake_ups(pid) - before[pid] for pid in writers}
            assert woke == dict.fromkeys(writers, 0), f"idle writers woke up (pid: wake-ups in 4 s): {woke}"
            assert page.writer_busy_ms < 0, "an idle writer is seen asleep in its state page"
            assert page.writer_alive(stale_after_ms=1000), "asleep for seconds is alive"
            producer.send([b"and it wakes for a producer"])
            assert producer.ring.wait_acks(1, 5000)
            producer.poll()
            assert producer.acked == {0: 0, 1: 1}
        finally:
            page.close()
            producer.close()
    assert serve.stop() == 0


def test_retention_runs_on_time_with_no_producer(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", RESIDENT, "log.retention.check.interval.ms=500",
                      "topics.t.segment.bytes=2048", "topics.t.retention.ms=1500")  # fmt: skip
    appliances.append(serve)
    serve.start()
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)
        for i in range(30):
            producer.send([b"r" * 200 + b"%d" % i])
        assert producer.ring.wait_acks(29, 5000)
        producer.close()
        client.detach(producer.attachment)
    page = page_of(serve, "t", 0)
    try:
        assert page.log_start_offset == 0, "nothing is old enough yet"
        # the closed segments past retention.ms go (the log start offset moves first, then they are unlinked)
        directory = Path(serve.data, "t-0")
        wait_until(lambda: page.log_start_offset > 0 and len(list(directory.glob("*.log"))) < 10,
                   "retention.ms passed and no segment was deleted")
        assert page.log_end_offset == 30
    finally:
        page.close()
    assert "retention deleted" in serve.log()
    assert serve.stop() == 0


def test_a_sigkilled_idle_writer_is_restarted(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", RESIDENT)
    appliances.append(serve)
    serve.start()
    (writer,) = serve.writers(1)
    os.kill(writer, signal.SIGKILL)
    wait_until(lambda: serve.writers() not in ([writer], []), "the killed writer was not restarted")
    assert "writer t-0 was killed by signal 9 (SIGKILL); recovering its partition log" in serve.log()
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)
        producer.send([b"served by the new writer"])
        assert producer.ring.wait_acks(0, 5000)
        producer.poll()
        assert producer.acked == {0: 0}
        producer.close()
    assert serve.stop() == 0


def test_a_writer_stuck_in_a_round_is_killed_and_restarted_loses_nothing(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", RESIDENT, 'appliance.test.faults=["writer.stall"]',
                      patch={"WRITER_STALL_S": 1.0})  # fmt: skip
    appliances.append(serve)
    serve.start()
    (stuck,) = serve.writers(1)
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)
        for i in range(20):
            producer.send([b"record %d" % i])
        assert producer.ring.wait_acks(19, 20_000), "the frames were acknowledged by the next writer"
        producer.poll()
        assert producer.acked == {i: i for i in range(20)}, "each record acked once, at its offset"
        producer.send([b"after"])
        assert producer.ring.wait_acks(20, 5000)
        producer.close()
    assert stuck not in serve.writers(1)
    log = serve.log()
    assert "test fault point writer.stall fired" in log
    assert f"writer t-0 (pid {stuck}) has been busy in one round for" in log
    assert "writer t-0 was killed by signal 9 (SIGKILL); recovering its partition log" in log
    assert serve.stop() == 0
    sequences = logged_sequences(serve.batches("t", 0), producer.producer_id)
    assert sequences == {i: [i] for i in range(21)}, "everything acknowledged is in the log exactly once"
    assert (serve.data / "t-0" / WRITER_STALL_MARKER).exists()


def test_a_writer_asleep_through_its_doorbell_is_killed_and_restarted(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", RESIDENT, patch={"WRITER_STALL_S": 1.0})
    appliances.append(serve)
    serve.start()
    (stuck,) = serve.writers(1)
    page = page_of(serve, "t", 0)
    try:
        wait_until(lambda: page.writer_pid == stuck and page.writer_busy_ms < 0, "the writer never slept")
    finally:
        page.close()
    os.kill(stuck, signal.SIGSTOP)  # alive and asleep, but it will not wake
    time.sleep(3.0)
    assert serve.writers() == [stuck], "an idle writer nobody rang is left alone, however long it sleeps"
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)  # the attach command rings the doorbell
        producer.send([b"waits for a writer that wakes"])
        assert producer.ring.wait_acks(0, 20_000)
        producer.poll()
        assert producer.acked == {0: 0}
        producer.close()
    assert stuck not in serve.writers(1)
    assert f"writer t-0 (pid {stuck}) has not woken for its rung doorbell for" in serve.log()
    assert serve.stop() == 0


def recovery_point(directory: Path) -> int:
    """The offset in the partition's recovery-point checkpoint (0 when there is none yet)."""
    path = directory / "recovery-point-offset-checkpoint"
    return int(path.read_text().split()[-1]) if path.exists() else 0


def test_flush_ms_flushes_an_idle_partition_on_time_then_it_sleeps(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", RESIDENT, "topics.t.flush.ms=1500")
    appliances.append(serve)
    serve.start()
    (writer,) = serve.writers(1)
    with serve.client() as client:
        producer = RawProducer(client, "t", 0)
        producer.send([b"to be flushed by the timer"])
        assert producer.ring.wait_acks(0, 5000)
        producer.close()
        client.detach(producer.attachment)
    directory = serve.data / "t-0"
    wait_until(lambda: recovery_point(directory) == 1, "flush.ms passed and the record was not flushed")
    time.sleep(0.5)
    before = wake_ups(writer)
    time.sleep(3.0)
    assert wake_ups(writer) - before == 0, "nothing unflushed: no flush.ms wake-up"
    assert serve.stop() == 0
