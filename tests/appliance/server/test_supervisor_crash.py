"""Crash tests with real processes: writers SIGKILLed under load, producers SIGKILLed at random moments.

Producers are children forked from this (already imported) test process: each connects to the control
socket, attaches a ring and publishes RecordBatch v2 frames built by ``storage.batch_builder``
(``support.harness.RawProducer``); it reports what was acknowledged through a pipe.  The log is then
read back and checked against the acknowledgements: every acknowledged batch is there exactly once, at the
offset its ack gave, and every segment verifies.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.campaign import rounds
from support.harness import Appliance, RawProducer, logged_sequences

from ipc.control import ControlClient
from ipc.ring import warm_up
from ipc.shm import list_objects
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.batch_header import parse_header

warm_up()
build_batch([b"warm"])  # the builder's kernels are loaded before any fork

VICTIMS = rounds(100, 2000)


@pytest.fixture
def serve(request: pytest.FixtureRequest) -> Iterator[Appliance]:
    appliance = Appliance(None, *request.param)
    try:
        yield appliance.start()
    finally:
        appliance.close()


def spawn(body: Callable[..., dict[str, Any]], *args: Any) -> tuple[int, int]:
    """Fork a child running ``body(*args)``; its result comes back as JSON on the returned pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            data = json.dumps(body(*args)).encode()
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def collect(pid: int, read_fd: int, timeout_s: float = 90.0) -> dict[str, Any]:
    """Read the child's result, then reap it (it must exit 0)."""
    chunks = []
    deadline = time.monotonic() + timeout_s
    with os.fdopen(read_fd, "rb") as pipe:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], 0.5)
            if ready:
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"producer {pid} ended with status {status}"
    result: dict[str, Any] = json.loads(b"".join(chunks))
    return result


# -- producers (run in forked children) ----------------------------------------------------------------------


def careful_producer(socket_path: str, topic: str, batches: int) -> dict[str, Any]:
    """At most five batches in flight (Kafka's idempotence limit); after 300 ms without an ack it attaches a
    new ring and sends every unacknowledged batch again with the same sequence."""
    client = ControlClient.connect(socket_path, timeout_s=30)
    producer = RawProducer(client, topic, 0)
    sent = reattaches = 0
    last_progress = time.monotonic()
    while sent < batches or producer.in_flight:
        if producer.poll():
            last_progress = time.monotonic()
        if sent < batches and len(producer.in_flight) < 5:
            producer.send([b"careful %d.%d" % (sent, i) for i in range(3)])
            sent += 1
            if sent % 8 == 0:
                time.sleep(0.001)
        elif not producer.in_flight:
            continue
        elif time.monotonic() - last_progress > 0.3:
            producer.reattach()
            reattaches += 1
            last_progress = time.monotonic()
        else:
            producer.ring.wait_acks(min(producer.in_flight), 20)
    producer.close()
    client.close()
    return {"producer_id": producer.producer_id, "acked": producer.acked, "reattaches": reattaches}


def deep_producer(socket_path: str, topic: str, batches: int) -> dict[str, Any]:
    """Up to 400 batches in flight and never resends: a restarted writer must re-read its ring and answer
    the batches its predecessor appended as duplicates, even the ones older than the last five."""
    client = ControlClient.connect(socket_path, timeout_s=30)
    producer = RawProducer(client, topic, 0, max_block_ms=30_000)
    sent = 0
    deadline = time.monotonic() + 60
    while (sent < batches or producer.in_flight) and time.monotonic() < deadline:
        producer.poll()
        if sent < batches and len(producer.in_flight) < 400:
            producer.send([b"deep %d" % sent, b"deep %d bis" % sent])
            sent += 1
        elif producer.in_flight:
            producer.ring.wait_acks(min(producer.in_flight), 50)
    producer.close()
    client.close()
    return {"producer_id": producer.producer_id, "acked": producer.acked, "unacked": len(producer.in_flight)}


def steady_producer(socket_path: str, topic: str, stop_path: str) -> dict[str, Any]:
    """Produces until the file ``stop_path`` exists, up to 50 batches in flight, then waits for every ack."""
    client = ControlClient.connect(socket_path, timeout_s=30)
    producer = RawProducer(client, topic, 0)
    sent = 0
    while not os.path.exists(stop_path):
        producer.poll()
        if len(producer.in_flight) < 50:
            producer.send([b"steady %d" % sent])
            sent += 1
            time.sleep(0.0005)
        elif producer.in_flight:
            producer.ring.wait_acks(min(producer.in_flight), 20)
    deadline = time.monotonic() + 30
    while producer.poll() or (producer.in_flight and time.monotonic() < deadline):
        if producer.in_flight:
            producer.ring.wait_acks(min(producer.in_flight), 50)
    producer.close()
    client.close()
    return {"producer_id": producer.producer_id, "acked": producer.acked, "sent": sent}


def victim(socket_path: str, topic: str, seed: int) -> None:
    """Attach and publish batches of random sizes for ever (killed by the test at a random moment)."""
    rng = random.Random(seed)
    client = ControlClient.connect(socket_path, timeout_s=30)
    producer = RawProducer(client, topic, 0)
    while True:
        producer.send([rng.randbytes(rng.randint(1, 3000)) for _ in range(rng.randint(1, 20))])
        producer.poll()


def _check_exactly_once(serve: Appliance, topic: str, result: dict[str, Any], count: int) -> None:
    found = logged_sequences(serve.batches(topic, 0), int(result["producer_id"]))
    acked = {int(seq): offset for seq, offset in result["acked"].items()}
    assert len(acked) == count, f"{count - len(acked)} batches never acknowledged"
    assert all(offset >= 0 for offset in acked.values()), "no batch was refused"
    for seq, offsets in found.items():
        assert len(offsets) == 1, f"batch with sequence {seq} appended {len(offsets)} times: {offsets}"
    for seq, offset in acked.items():
        assert found.get(seq) == [offset], f"acknowledged batch {seq} at {offset}, log has {found.get(seq)}"


def _verify_log(serve: Appliance, topic: str) -> int:
    """dump-log over every segment exits 0; offsets are dense; returns the record count."""
    segments = sorted((serve.data / f"{topic}-0").glob("*.log"))
    dumped = serve.cli("dump-log", *map(str, segments))
    assert dumped.returncode == 0, dumped.stderr
    expected = 0
    for data in serve.batches(topic, 0):
        header = parse_header(data)
        assert header.base_offset == expected
        expected = header.next_offset
    return expected


# -- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "serve", [("topics.t.partitions=1", "topics.t.segment.bytes=65536", "appliance.ring.bytes=1048576")],
    indirect=True,
)  # fmt: skip
def test_writer_sigkilled_under_load_is_restarted_and_acked_batches_are_there_once(serve: Appliance) -> None:
    path = str(serve.socket_path)
    careful = spawn(careful_producer, path, "t", 2000)
    deep = spawn(deep_producer, path, "t", 4000)
    with serve.client() as client:
        partition = client.metadata(["t"]).topics["t"].partitions[0]
    page = StatePage.attach(partition.state_page)
    killed = []
    try:
        for threshold in (2000, 6000, 10_000):
            deadline = time.monotonic() + 30
            while page.log_end_offset < threshold:
                assert time.monotonic() < deadline, f"log end offset stuck at {page.log_end_offset}"
                time.sleep(0.0005)
            pid = page.writer_pid
            assert pid not in killed
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            while page.writer_pid in killed:  # the restarted writer claims the page
                assert time.monotonic() < deadline, "the writer was not restarted"
                time.sleep(0.001)
    finally:
        page.close()
    careful_result = collect(*careful)
    deep_result = collect(*deep)
    assert deep_result["unacked"] == 0
    _check_exactly_once(serve, "t", careful_result, 2000)
    _check_exactly_once(serve, "t", deep_result, 4000)
    assert _verify_log(serve, "t") == 2000 * 3 + 4000 * 2
    log = serve.log()
    assert log.count("was killed by signal 9 (SIGKILL); recovering its partition log and restarting it") == 3
    with serve.client() as client:
        assert client.metadata(["t"]).topics["t"].partitions[0].writer_restarts == 3
    assert serve.stop() == 0
    assert serve.leftovers() == []


@pytest.mark.slow
@pytest.mark.campaign
@pytest.mark.parametrize("serve", [("topics.v.partitions=1", "appliance.ring.bytes=262144")], indirect=True)
def test_producers_sigkilled_at_random_moments_never_disturb_the_others(serve: Appliance) -> None:
    path = str(serve.socket_path)
    stop_path = serve.cwd / "stop"
    steady = spawn(steady_producer, path, "v", str(stop_path))
    rng = random.Random(20260101)
    for i in range(VICTIMS):
        pid = os.fork()
        if pid == 0:
            try:
                victim(path, "v", i)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0, 0.02))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    stop_path.touch()
    result = collect(*steady)
    _check_exactly_once(serve, "v", result, int(result["sent"]))
    records = _verify_log(serve, "v")
    assert records > int(result["sent"]), "the victims' published batches were appended too"
    deadline = time.monotonic() + 10
    while (rings := [n for n in list_objects(serve.names.instance)[0] if "-ring-" in n]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert rings == [], "every dead producer's ring was drained and removed"
    with serve.client() as client:
        assert client.metadata(["v"]).topics["v"].partitions[0].writer_restarts == 0
        assert client.status()["rings"] == 0
    assert serve.stop() == 0
    assert serve.leftovers() == []
