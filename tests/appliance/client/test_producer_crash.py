"""Crash tests with real processes: producers SIGKILLed mid-send, writers SIGKILLed under a producer's load.

* 200 producer processes, each killed with SIGKILL at a random moment of its life (connecting, attaching a
  ring, building a batch in ring memory, publishing, waiting for acks).  Meanwhile a steady producer keeps
  sending to the same partition.  Afterwards every segment passes ``appliance dump-log --verify``, the steady
  producer's records are all there once and in order, and each victim's records are whole and a gap-free
  prefix of what it sent (what it published was appended; nothing half-written ever was).
* The partition writer SIGKILLed three times while an idempotent producer streams: the supervisor restarts
  it, the log recovers, every record is in the log exactly once and in order, and ``send`` just carries on.

The victims are forked by a helper process that never starts a producer itself (no threads when forking):
it imports everything once, so a victim starts in about a millisecond.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.campaign import rounds
from support.harness import REPO, Appliance

from appliance.client.producer import Producer
from storage.batch_reader import Record, iter_records

VICTIMS = rounds(100, 2000)
WRITER_KILLS = rounds(3, 30)

_ZYGOTE = textwrap.dedent(
    """
    import os, random, select, signal, sys, time
    from appliance.client.producer import Producer
    from ipc.ring import warm_up
    from storage.batch_builder import build_batch

    warm_up()
    build_batch([b"warm"])  # load the builder's kernels before forking
    socket_path, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)

    def victim(n, started):
        settings = {"appliance.control.socket": socket_path, "linger.ms": rng.choice([0, 1, 5]),
                    "batch.size": rng.choice([512, 4096, 65536]), "acks": rng.choice(["all", "1", "0"])}
        producer = Producer(settings)
        i = 0
        while True:
            size = rng.randrange(0, 300)
            producer.send("crash", b"victim-%d-%d-%d|" % (n, i, size) + bytes([i % 251]) * size,
                          key=None if i % 3 else b"k%d" % n)
            if i == 0:
                os.write(started, b"s")  # sending: the zygote's kill delay counts from here
            i += 1
            if i % 50 == 0:
                time.sleep(0.001)  # a few thousand records per victim: enough batches, a log quick to check
            if i % 500 == 0:
                producer.flush()

    for n in range(count):
        # a third die while starting (connect, producer id, metadata, ring attach), the rest while sending:
        # their delay counts from their first send, however long a loaded machine makes the start
        starting = rng.random() < 0.3
        delay = rng.uniform(0, 0.02) if starting else rng.uniform(0.0, 0.08)
        started, signal_started = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(started)
                victim(n, signal_started)
            finally:
                os._exit(1)
        os.close(signal_started)
        if not starting:
            select.select([started], [], [], 10)
        os.close(started)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print("done", count)
    """
)


@pytest.fixture
def appliances() -> Iterator[list[Appliance]]:
    made: list[Appliance] = []
    yield made
    for appliance in made:
        appliance.close()


def _records(serve: Appliance, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    for data in serve.batches(topic, partition):
        records += iter_records(data)
    return records


def _victim_record_is_whole(value: bytes) -> tuple[int, int]:
    head, _, body = value.partition(b"|")
    _, n, i, size = head.split(b"-")
    assert len(body) == int(size) and body == bytes([int(i) % 251]) * int(size), value[:60]
    return int(n), int(i)


@pytest.mark.slow
@pytest.mark.campaign
def test_producers_killed_mid_send_leave_a_sound_log_and_others_unaffected(
    appliances: list[Appliance], tmp_path: Path
) -> None:
    serve = Appliance(None, "topics.crash.partitions=1", "appliance.ring.bytes=1048576",
                      "listeners=PLAINTEXT://127.0.0.1:0")
    appliances.append(serve)
    serve.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    zygote = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE, str(serve.socket_path), str(VICTIMS), "1234"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    steady = Producer({"appliance.control.socket": str(serve.socket_path)}, linger_ms=2)
    handles = []
    try:
        i = 0
        while zygote.poll() is None:
            handles.append(steady.send("crash", b"steady-%d" % i))
            i += 1
            if i % 100 == 0:
                handles[-1].get(30)  # the partition keeps accepting while producers die around it
                time.sleep(0.005)
        out, err = zygote.communicate(timeout=30)
        assert zygote.returncode == 0, err.decode()[-3000:]
        assert out.split() == [b"done", str(VICTIMS).encode()]
        handles.append(steady.send("crash", b"steady-%d" % i))
        offsets = [h.get(30).offset for h in handles]
    finally:
        steady.close()
        if zygote.poll() is None:
            zygote.kill()
            zygote.wait()
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    segments = sorted(str(p) for p in (serve.data / "crash-0").glob("*.log"))
    check = serve.cli("dump-log", "--verify", *segments)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]

    records = _records(serve, "crash", 0)
    steady_values = [r.value for r in records if r.value and r.value.startswith(b"steady-")]
    assert steady_values == [b"steady-%d" % n for n in range(len(handles))], "all, once, in order"
    by_victim: dict[int, list[int]] = defaultdict(list)
    for record in records:
        if record.value and record.value.startswith(b"victim-"):
            n, i = _victim_record_is_whole(record.value)
            by_victim[n].append(i)
    for n, sent in by_victim.items():
        assert sent == list(range(len(sent))), f"victim {n}: what it published is a gap-free prefix"
    # the campaign exercised dying mid-send (under load fewer victims get a record in before their kill)
    assert len(by_victim) > VICTIMS // 10, "many victims got records in before they died"
    assert [r.offset for r in records] == list(range(len(records))), "offsets dense"

    deadline = time.monotonic() + 10  # the supervisor unlinks dead producers' rings
    while time.monotonic() < deadline and [n for n in serve.leftovers() if "-ring-crash-" in n]:
        time.sleep(0.05)
    assert [n for n in serve.leftovers() if "-ring-crash-" in n] == []


def _writer_pid(serve: Appliance, topic: str) -> int:
    client = serve.client()
    try:
        return client.metadata([topic]).topics[topic].partitions[0].writer_pid
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.campaign
def test_writer_killed_under_load_restarts_and_every_record_is_there_once(
    appliances: list[Appliance],
) -> None:
    serve = Appliance(None, "topics.load.partitions=1", "listeners=PLAINTEXT://127.0.0.1:0")
    appliances.append(serve)
    serve.start()
    kills: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        for _ in range(WRITER_KILLS):
            if stop.wait(0.4):
                return
            pid = _writer_pid(serve, "load")
            deadline = time.monotonic() + 20
            while pid == 0 and time.monotonic() < deadline:  # not started yet (writer_demand)
                time.sleep(0.02)
                pid = _writer_pid(serve, "load")
            assert pid > 0, "the producer started no writer"
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
            deadline = time.monotonic() + 20
            while _writer_pid(serve, "load") in (pid, 0) and time.monotonic() < deadline:
                time.sleep(0.02)

    thread = threading.Thread(target=killer)
    producer = Producer({"appliance.control.socket": str(serve.socket_path)}, batch_size=16384, linger_ms=1)
    handles = []
    try:
        thread.start()
        i = 0
        while thread.is_alive() or i < 20_000:
            handles.append(producer.send("load", b"load-%d" % i))
            i += 1
            if i % 2000 == 0:
                time.sleep(0.01)
        offsets = [h.get(60).offset for h in handles]
    finally:
        stop.set()
        thread.join()
        producer.close()
    assert len(kills) == WRITER_KILLS and len(set(kills)) == WRITER_KILLS, "different writers were killed"
    assert offsets == list(range(len(handles))), "acknowledged once each, in order"
    values = [r.value for r in _records(serve, "load", 0)]
    assert values == [b"load-%d" % n for n in range(len(handles))], "every record in the log exactly once"
    assert "load-0" in serve.log() or "restart" in serve.log().lower()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigkill-tree"])
def test_appliance_restarted_under_load_the_producer_reconnects_exactly_once(
    appliances: list[Appliance], how: str
) -> None:
    """The whole appliance goes away (a clean stop, or every process SIGKILLed) and comes back: the
    producer reconnects, sends again what was not acknowledged, and every record is in the log once."""
    serve = Appliance(None, "topics.restart.partitions=2", "listeners=PLAINTEXT://127.0.0.1:0")
    appliances.append(serve)
    serve.start()
    producer = Producer({"appliance.control.socket": str(serve.socket_path)}, batch_size=16384, linger_ms=1)
    handles = []
    restarted = threading.Event()

    def restart() -> None:
        time.sleep(0.5)
        if how == "sigterm":
            assert serve.stop() == 0
        else:
            serve.kill_tree()
        time.sleep(0.3)  # the producer finds nobody there for a while
        serve.start()
        restarted.set()

    thread = threading.Thread(target=restart)
    try:
        thread.start()
        i = 0
        while not restarted.is_set() or i < 30_000:
            handles.append(producer.send("restart", b"r-%d" % i, key=b"%d" % (i % 10)))
            i += 1
            if i % 1000 == 0:
                time.sleep(0.005)
        metadata = [h.get(60) for h in handles]
    finally:
        thread.join()
        producer.close()
    values = [r.value for p in range(2) for r in _records(serve, "restart", p)]
    assert sorted(values) == sorted(b"r-%d" % n for n in range(len(handles))), "each record exactly once"
    for p in range(2):  # per partition in send order, offsets as acknowledged
        logged = [(r.offset, r.value) for r in _records(serve, "restart", p)]
        acked = [(m.offset, b"r-%d" % n) for n, m in enumerate(metadata) if m.partition == p]
        assert logged == acked
