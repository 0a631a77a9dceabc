"""``appliance serve`` as a real process tree: start, serve, produce, refuse, crash, restart, stop.

Every test runs the real command in a temporary working directory (``support.harness.Appliance``),
listens on a NOTIFY_SOCKET like systemd, attaches rings through the control socket and reads the logs back
with the storage reader.  Writer crashes under load are in test_supervisor_crash.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import stat
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support.harness import Appliance, RawProducer, _title, cpu_ticks, logged_sequences

from appliance.server.proctitle import get_comm, get_proctitle
from ipc.control import ControlError
from ipc.memory_order import publish_int32
from ipc.ring import RingFailedError, warm_up
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.batch_reader import iter_records
from storage.errors import ConfigError, TopicExistsError, UnknownTopicOrPartitionError

warm_up()


@pytest.fixture
def appliances() -> Iterator[list[Appliance]]:
    """Appliances a test made; each is killed and cleaned up afterwards whatever happened."""
    made: list[Appliance] = []
    yield made
    for appliance in made:
        appliance.close()


@pytest.mark.slow
def test_serve_with_no_configuration_runs_from_the_working_directory_and_stops_cleanly(
    appliances: list[Appliance],
) -> None:
    serve = Appliance(env={"WATCHDOG_USEC": "300000"})
    appliances.append(serve)
    serve.start()
    assert serve.wait_for("STATUS=").startswith("STATUS=ready")
    assert serve.wait_for("WATCHDOG=1", timeout_s=2) and serve.wait_for("WATCHDOG=1", timeout_s=2)
    assert (serve.data / "meta").is_dir(), "data in ./data by default"
    assert stat.S_IMODE(os.stat(serve.socket_path).st_mode) == 0o600, "the control socket is owner-only"

    created = serve.cli("topics", "create", "--data-dir", "data", "orders", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "Created topic orders with 2 partitions."
    again = serve.cli("topics", "create", "--data-dir", "data", "orders")
    assert again.returncode == 1 and "already exists" in again.stderr
    assert serve.cli("topics", "create", "--data-dir", "data", "orders", "--if-not-exists").returncode == 0
    assert serve.cli("topics", "list", "--data-dir", "data").stdout.split() == ["orders"]
    described = serve.cli("topics", "describe", "--data-dir", "data", "orders").stdout.splitlines()
    assert described[0].startswith("Topic: orders\tTopicId: ") and "PartitionCount: 2" in described[0]
    assert [line.split("\t")[2] for line in described[1:]] == ["Partition: 0", "Partition: 1"]

    assert get_proctitle(serve.pid) == "appliance: supervisor"
    assert serve.writers() == [], "no partition is written yet: no writer runs (writer_demand)"
    with serve.client() as client:
        for partition in (0, 1):  # producers start the writers
            producer = RawProducer(client, "orders", partition)
            producer.send([b"wakes the writer"])
            assert producer.ring.wait_acks(0, 10_000)
            producer.close()
    writers = sorted(serve.writers(2))
    assert len(writers) == 2
    assert sorted(get_proctitle(pid) for pid in writers) == ["appliance: writer orders-0",
                                                             "appliance: writer orders-1"]  # fmt: skip
    assert sorted(get_comm(pid) for pid in writers) == ["writer orders-0", "writer orders-1"]

    tree = [serve.pid, *writers]
    before = sum(cpu_ticks(pid) for pid in tree)
    time.sleep(2.0)
    used = sum(cpu_ticks(pid) for pid in tree) - before
    assert used <= 8, f"{used} clock ticks in 2 s idle over 3 processes: something spins"

    assert serve.stop() == 0
    assert serve.wait_for("STOPPING=1", timeout_s=1)
    assert serve.leftovers() == []
    assert not serve.socket_path.exists()
    log = serve.log()
    assert f"supervisor (pid {serve.pid}): unique memory" in log, "its own memory is logged"
    assert "stopped in" in log


def test_produce_through_a_ring_refuse_bad_input_and_run_control_ops(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.events.partitions=2", "log.retention.check.interval.ms=100",
                      "topics.short.segment.bytes=2048", "topics.short.retention.bytes=3000")  # fmt: skip
    appliances.append(serve)
    serve.start()
    client = serve.client()
    metadata = client.metadata()
    assert sorted(metadata.topics) == ["events", "short"]
    assert metadata.shm_prefix == serve.names.prefix

    # produce through a ring attached via the control socket
    producer = RawProducer(client, "events", 1, ring_bytes=16 << 20)  # a raw ring does not grow
    for i in range(20):
        producer.send([b"event %d" % i, b"more %d" % i])
    assert producer.ring.wait_acks(19, 5000)
    producer.poll()
    assert producer.acked == {2 * i: 2 * i for i in range(20)}
    page = StatePage.attach(client.metadata(["events"]).topics["events"].partitions[1].state_page)
    assert (page.log_end_offset, page.high_watermark) == (40, 40)
    page.close()
    batches = serve.batches("events", 1)
    assert [parse_header(b).base_offset for b in batches] == [2 * i for i in range(20)]
    assert [r.value for r in iter_records(batches[7])] == [b"event 7", b"more 7"]
    segment = serve.data / "events-1" / "00000000000000000000.log"
    dumped = serve.cli("dump-log", str(segment))
    assert dumped.returncode == 0 and dumped.stdout.count("baseOffset:") == 20

    # bad frames: error acks to their sender only, nothing appended, the others go on
    other = RawProducer(client, "events", 1)
    corrupt = bytearray(build_batch([b"flipped"]))
    corrupt[-1] ^= 0xFF
    producer.ring.send(bytes(corrupt))
    producer.ring.send(b"garbage, not a batch" * 5)
    producer.ring.send(build_batch([b"x" * 1_100_000]))
    producer.send([b"fine after bad"])
    other.send([b"from the other producer"])
    assert producer.ring.wait_acks(producer.ring.next_seq - 1, 5000)
    assert other.ring.wait_acks(0, 5000)
    _, results = producer.ring.poll_acks()
    assert results.tolist() == [-2, -2, -10, 40]  # CORRUPT_MESSAGE, CORRUPT_MESSAGE, MESSAGE_TOO_LARGE
    assert len(serve.batches("events", 1)) == 22
    broken = RawProducer(client, "events", 1)
    publish_int32(broken.ring.data.view(np.int32), 0, 3)  # a published frame length no frame can have
    deadline = time.monotonic() + 5
    with pytest.raises(RingFailedError, match="bad frame length"):  # the writer fails that ring ...
        while time.monotonic() < deadline:
            broken.ring.check_failed()
            time.sleep(0.01)
    other.send([b"still served"])  # ... and serves the others
    assert other.ring.wait_acks(1, 5000)
    client.detach(broken.attachment)

    # control ops and their refusals
    with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0\.\.1, not 5"):
        client.attach("events", 5)
    auto = client.attach("created-on-attach", 0)
    assert "created-on-attach" in client.metadata().topics and auto.ring.startswith(serve.names.prefix)
    with pytest.raises(TopicExistsError):
        client.create_topic("events", 3)
    with pytest.raises(ConfigError, match="may contain only") as bad_name:
        client.create_topic("bad/name", 1)
    assert bad_name.value.error == "INVALID_TOPIC_EXCEPTION"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="replication factor 101"):
        client.create_topic("replicated", 1, replication_factor=101)
    with pytest.raises(ConfigError, match=r"retention\.ms"):
        client.create_topic("bad-config", 1, configs={"retention.ms": "soon"})
    with serve.client() as stranger, pytest.raises(ControlError, match="not attached through this"):
        stranger.detach(producer.attachment)
    temporary = client.create_topic("temporary", 2, configs={"retention.ms": 60000})
    assert temporary.configs == {"retention.ms": 60000} and temporary.partition_count == 2
    assert (serve.data / "temporary-1").is_dir()
    client.delete_topic("temporary")
    assert not (serve.data / "temporary-0").exists() and "temporary" not in client.metadata().topics
    with pytest.raises(UnknownTopicOrPartitionError):
        client.delete_topic("temporary")
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(serve.socket_path))
        raw.sendall(b"this is not json\n")
        assert b"INVALID_REQUEST" in raw.recv(4096)
        assert raw.recv(4096) == b"", "a malformed stream closes that connection"
    status = client.status()
    assert status["pid"] == serve.pid
    assert len([child for child in status["children"] if child["role"] == "writer"]) == 4
    assert all(child["uss_bytes"] > 0 for child in status["children"] if child["pid"])
    assert [child["uss_bytes"] for child in status["children"] if not child["pid"]] == [0, 0], \
        "the writers of the partitions nobody wrote do not run"
    fresh = client.status(memory=True)  # measured now, not as last measured
    assert all(child["uss_bytes"] > 0 and child["uss_age_s"] < 1.0 for child in fresh["children"]
               if child["pid"]), fresh

    # retention runs in the writers on their timer
    short = RawProducer(client, "short", 0)
    for i in range(30):
        short.send([b"r" * 200 + b"%d" % i])
    assert short.ring.wait_acks(29, 5000)
    deadline = time.monotonic() + 5
    while client.metadata(["short"]).topics["short"].partitions[0].log_start_offset == 0:
        assert time.monotonic() < deadline, "retention never deleted a segment"
        time.sleep(0.05)

    for p in (producer, other, short):
        p.close()
    client.close()
    assert serve.stop() == 0
    assert serve.leftovers() == []


def test_a_second_appliance_on_the_same_data_dir_is_refused(appliances: list[Appliance]) -> None:
    first = Appliance(None, "topics.t.partitions=1")
    appliances.append(first)
    first.start()
    objects = first.leftovers()
    assert any("-state-t-0" in name for name in objects)
    second = Appliance(first.cwd, "topics.t.partitions=1")
    appliances.append(second)
    second.start(wait=False)
    assert second.process is not None and second.process.wait(30) == 1
    assert "in use by another appliance" in second.log()
    assert first.leftovers() == objects, "the refused one reclaimed nothing of the running one"
    assert first.socket_path.exists()
    with first.client() as client:
        assert client.status()["pid"] == first.pid, "the first one is untouched"
    assert first.stop() == 0
    assert first.leftovers() == []


def test_two_appliances_with_different_data_dirs_run_side_by_side(appliances: list[Appliance]) -> None:
    a = Appliance(None, "topics.t.partitions=1")
    b = Appliance(None, "topics.t.partitions=1")
    appliances += [a, b]
    a.start(wait=False)
    b.start(wait=False)
    a.wait_for("READY=1")
    b.wait_for("READY=1")
    assert a.names.prefix != b.names.prefix
    with a.client() as ca, b.client() as cb:
        assert ca.metadata().instance_id != cb.metadata().instance_id
        pa, pb = RawProducer(ca, "t", 0), RawProducer(cb, "t", 0)
        for i in range(10):
            pa.send([b"a%d" % i])
            pb.send([b"b%d" % i, b"b%d" % i])
        assert pa.ring.wait_acks(9, 5000) and pb.ring.wait_acks(9, 5000)
        pa.close()
        pb.close()
    values_a = [r.value for x in a.batches("t", 0) for r in iter_records(x)]
    values_b = [r.value for x in b.batches("t", 0) for r in iter_records(x)]
    assert values_a == [b"a%d" % i for i in range(10)]
    assert values_b == [b"b%d" % (i // 2) for i in range(20)]
    assert a.stop() == 0
    assert b.leftovers(), "stopping one leaves the other's shared memory alone"
    with b.client() as cb:
        assert cb.metadata().topics["t"].partitions[0].log_end_offset == 20
    assert b.stop() == 0
    assert a.leftovers() == [] and b.leftovers() == []


def test_sigkill_of_the_whole_tree_then_restart_reclaims_and_recovers(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=2")
    appliances.append(serve)
    serve.start()
    client = serve.client()
    producer = RawProducer(client, "t", 0)
    for i in range(50):
        producer.send([b"acked %d" % i])
    assert producer.ring.wait_acks(49, 5000)
    producer.poll()
    acked = dict(producer.acked)
    for i in range(200):
        producer.send([b"in flight %d" % i])  # some may be appended before the kill, some not
    old_ring = producer.attachment.ring
    serve.kill_tree()
    producer.close()
    client.close()
    left = serve.leftovers()
    assert old_ring in left and any("-state-" in name for name in left), "a crash leaves shared memory"

    serve.start()
    assert "reclaimed" in serve.log() and "shared-memory objects a previous run left" in serve.log()
    assert old_ring not in serve.leftovers()
    client = serve.client()
    found = logged_sequences(serve.batches("t", 0), producer.producer_id)
    for sequence, offset in acked.items():
        assert found[sequence] == [offset], "every acknowledged batch is there, once, where it was acked"
    assert all(len(offsets) == 1 for offsets in found.values())
    end = client.metadata().topics["t"].partitions[0].log_end_offset
    assert end == sum(1 for _ in found)
    again = RawProducer(client, "t", 0)
    again.send([b"after the restart"])
    assert again.ring.wait_acks(0, 5000)
    again.poll()
    assert again.acked == {0: end}
    again.close()
    client.close()
    assert serve.stop() == 0
    assert serve.leftovers() == []
    assert json.loads((serve.data / "meta" / "topics.json").read_text())["topics"]["t"]["partitions"] == 2


def test_writers_of_a_killed_supervisor_exit_and_a_new_one_starts(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=2")
    appliances.append(serve)
    serve.start()
    with serve.client() as client:
        producer = RawProducer(client, "t", 1)
        for i in range(10):
            producer.send([b"before %d" % i])
        assert producer.ring.wait_acks(9, 5000)
        writers = serve.writers(1)  # the written partition's
        os.kill(serve.pid, signal.SIGKILL)  # only the supervisor
        assert serve.process is not None and serve.process.wait(10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in writers):
            assert time.monotonic() < deadline, "orphaned writers keep running"
            time.sleep(0.02)
        producer.close()
    serve.start()
    assert "reclaimed" in serve.log()
    assert [parse_header(b).base_offset for b in serve.batches("t", 1)] == list(range(10))
    assert serve.stop() == 0
    assert serve.leftovers() == []


def test_an_extra_child_produces_through_the_control_socket_gates_ready_and_is_restarted(
    appliances: list[Appliance],
) -> None:
    serve = Appliance(None, patch={"EXTRA_CHILDREN": ("support.harness:helper_child",)})
    appliances.append(serve)
    serve.start()  # READY=1 came after the helper called ready(): its batch is in the log already
    values = [r.value for b in serve.batches("from-helper", 0) for r in iter_records(b)]
    assert len(values) == 1 and values[0].startswith(b"hello from pid")
    titles = {get_proctitle(pid): pid for pid in serve.children()}
    assert {"appliance: helper", "appliance: writer from-helper-0"} <= set(titles)
    helper = titles["appliance: helper"]
    os.kill(helper, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while len(serve.batches("from-helper", 0)) < 2:
        assert time.monotonic() < deadline, "the extra child was not restarted"
        time.sleep(0.02)
    assert "extra helper was killed by signal 9 (SIGKILL); restarting it" in serve.log()
    assert serve.stop() == 0
    assert "extra helper stopped: exited with status 0" in serve.log()
    assert serve.leftovers() == []


def test_hostile_control_requests_get_an_answer_and_change_nothing(appliances: list[Appliance]) -> None:
    serve = Appliance(None, "topics.t.partitions=1", "delete.topic.enable=false",
                      "auto.create.topics.enable=false")  # fmt: skip
    appliances.append(serve)
    serve.start()
    rng = random.Random(7)
    values: list[object] = [None, True, -1, 0, 1, 2**40, "", "t", "../etc", "x" * 300, [], ["t"], {}, 1.5,
                            {"a": 1}, {"retention.ms": "soon"}, {"partitions": 2}]  # fmt: skip
    ops = ["metadata", "create_topic", "delete_topic", "init_producer_id", "attach", "detach", "status", 7]
    fields = ["topic", "topics", "partition", "partitions", "replication_factor", "configs", "ring"]
    with serve.client() as client:
        before = {name: info.topic_id for name, info in client.metadata().topics.items()}
        for _ in range(300):
            request: dict[str, object] = {"op": rng.choice(ops)}
            for name in rng.sample(fields, rng.randint(0, 4)):
                request[name] = rng.choice(values)
            if request["op"] == "create_topic" and isinstance(request.get("topic"), str):
                continue  # a valid creation is not hostile; refusals of bad ones are tested above
            try:
                reply = client.request(request)
            except ControlError as exc:
                assert exc.error != "UNKNOWN_SERVER_ERROR", f"{request} -> {exc}"
            else:
                assert reply["ok"] is True
        with pytest.raises(ControlError, match=r"delete\.topic\.enable is false"):
            client.delete_topic("t")
        assert {name: info.topic_id for name, info in client.metadata().topics.items()} == before
        assert client.status()["pid"] == serve.pid
    assert "failed unexpectedly" not in serve.log()
    assert serve.stop() == 0


def test_control_requests_are_answered_while_the_supervisor_waits_for_its_children_to_stop(
    appliances: list[Appliance],
) -> None:
    """A child that asks for metadata as it stops must not wait out its control timeout: the supervisor
    answers on the open connections while it waits for its children, and refuses what would change state."""
    serve = Appliance(None, "topics.t.partitions=1")
    appliances.append(serve)
    serve.start()
    (broker,) = [pid for pid in serve.children() if _title(pid) == "appliance: broker"]
    client = serve.client()
    try:
        assert "t" in client.metadata(["t"]).topics  # accepted (the backlog goes with the socket)
        os.kill(broker, signal.SIGSTOP)  # alive, but deaf to SIGTERM: the supervisor waits for it
        serve.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        serve.wait_for("STOPPING=1", timeout_s=10)
        started = time.monotonic()
        assert "t" in client.metadata(["t"]).topics
        assert time.monotonic() - started < 2.0
        with pytest.raises(ControlError, match="stopping"):
            client.create_topic("late", partitions=1)
        assert serve.process.poll() is None  # type: ignore[union-attr]  # still waiting for the broker
    finally:
        client.close()
        os.kill(broker, signal.SIGCONT)
    assert serve.process.wait(30) == 0  # type: ignore[union-attr]
