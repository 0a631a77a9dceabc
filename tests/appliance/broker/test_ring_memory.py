"""Memory follows the data in flight: producer rings start small and grow with the traffic, and the shared
memory they take (``/dev/shm``, the broker's mappings) comes back once producers leave or a topic is deleted.

Against a real ``appliance serve`` with its broker, real Kafka clients (confluent-kafka) and the local
Producer.  Memory is what an operator would measure: the allocated blocks of the instance's files in
``/dev/shm`` and the ring mappings in ``/proc/PID/maps`` of the broker (those of unlinked rings included).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.kafka_appliance import Appliance, start_appliance, stop_appliance

from appliance.client.producer import Producer
from ipc.shm import SHM_DIR, instance_id
from storage.batch_reader import iter_records
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")

IDLE_MS = 1000  # appliance.ring.idle.ms here
INITIAL_BYTES = 65536  # appliance.ring.initial.bytes here
MAX_BYTES = 4 << 20  # appliance.ring.bytes here
SETTLE_S = IDLE_MS / 1000 + 1.0  # what the issue allows: ring.idle.ms plus a second


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    extra = (f'"appliance.ring.idle.ms" = {IDLE_MS}\n"appliance.ring.initial.bytes" = {INITIAL_BYTES}\n'
             f'"appliance.ring.bytes" = {MAX_BYTES}')  # fmt: skip
    running = start_appliance(tmp_path_factory.mktemp("rings"), {"steady": 4, "big": 1, "local": 2}, extra)
    try:
        yield running
    finally:
        stop_appliance(running)


def ring_prefix(appliance: Appliance) -> str:
    return f"la-{instance_id(appliance.data_dir)}-ring-"


def shm_bytes(appliance: Appliance) -> int:
    """Allocated bytes of every shared-memory file of the instance (``st_blocks * 512``)."""
    prefix = f"la-{instance_id(appliance.data_dir)}-"
    total = 0
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            try:
                total += os.stat(SHM_DIR / name).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def ring_sizes(appliance: Appliance) -> list[int]:
    """Sizes of the instance's ring files in ``/dev/shm``."""
    prefix = ring_prefix(appliance)
    sizes = []
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            try:
                sizes.append(os.stat(SHM_DIR / name).st_size)
            except FileNotFoundError:
                pass
    return sizes


def mapped_ring_bytes(pid: int, prefix: str) -> int:
    """Bytes of ring mappings in process ``pid`` (``/proc/PID/maps``; unlinked rings show "(deleted)")."""
    total = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and f"/dev/shm/{prefix}" in fields[5]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            total += end - start
    return total


def broker_pid(appliance: Appliance) -> int:
    children = Path(f"/proc/{appliance.process.pid}/task/{appliance.process.pid}/children").read_text()
    for pid in (int(p) for p in children.split()):
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"appliance: broker"):
            return pid
    raise AssertionError(f"no broker among the children of {appliance.process.pid}")


def settles(measure: Callable[[], int], level: int, within_s: float) -> int:
    """Poll ``measure`` until it is at most ``level`` or ``within_s`` passed; its last value."""
    deadline = time.monotonic() + within_s
    while True:
        value = measure()
        if value <= level or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def kafka_producer(appliance: Appliance, **extra: object) -> object:
    config = {"bootstrap.servers": appliance.bootstrap, "enable.idempotence": True, "linger.ms": 5, **extra}
    return confluent_kafka.Producer(config)


def produce_all(producer: object, topic: str, values: list[bytes], partition: int | None = None) -> None:
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for value in values:
        while True:
            try:
                if partition is None:
                    producer.produce(topic, value, on_delivery=delivered)  # type: ignore[attr-defined]
                else:
                    producer.produce(topic, value, partition=partition,  # type: ignore[attr-defined]
                                     on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)  # type: ignore[attr-defined]
    assert producer.flush(60) == 0  # type: ignore[attr-defined]
    assert failures == []


def logged_values(appliance: Appliance, topic: str, partition: int) -> list[bytes]:
    with LogReader(str(appliance.data_dir / f"{topic}-{partition}")) as reader:
        return [bytes(r.value or b"") for data in reader.batches() for r in iter_records(data)]


def test_broker_lets_go_of_rings_once_a_kafka_producer_stops(appliance: Appliance) -> None:
    prefix, broker = ring_prefix(appliance), broker_pid(appliance)
    idle_shm = settles(lambda: shm_bytes(appliance), 0, 0)
    assert settles(lambda: mapped_ring_bytes(broker, prefix), 0, SETTLE_S) == 0
    producer = kafka_producer(appliance)
    produce_all(producer, "steady", [f"s{i}".encode() for i in range(2000)])
    assert mapped_ring_bytes(broker, prefix) > 0  # it holds rings while the traffic is recent
    assert shm_bytes(appliance) > idle_shm
    left = settles(lambda: mapped_ring_bytes(broker, prefix), 0, SETTLE_S)
    assert left == 0, f"the broker still maps {left} bytes of rings {SETTLE_S} s after the last produce"
    shm = settles(lambda: shm_bytes(appliance), idle_shm, 1.0)
    assert shm <= idle_shm, f"/dev/shm holds {shm} bytes, {idle_shm} when idle"
    del producer


def test_a_deleted_topics_rings_are_unmapped_and_unlinked(appliance: Appliance) -> None:
    prefix, broker = ring_prefix(appliance), broker_pid(appliance)
    assert settles(lambda: mapped_ring_bytes(broker, prefix), 0, SETTLE_S) == 0
    idle_shm = shm_bytes(appliance)
    admin = admin_module.AdminClient({"bootstrap.servers": appliance.bootstrap})
    for future in admin.create_topics([admin_module.NewTopic("doomed", 8, 1)]).values():
        future.result(60)
    producer = kafka_producer(appliance)
    produce_all(producer, "doomed", [f"d{i}".encode() for i in range(800)])
    assert mapped_ring_bytes(broker, prefix) > 0
    for future in admin.delete_topics(["doomed"]).values():
        future.result(60)
    left = settles(lambda: mapped_ring_bytes(broker, prefix), 0, SETTLE_S)
    assert left == 0, f"the broker still maps {left} bytes of rings {SETTLE_S} s after the deletion"
    shm = settles(lambda: shm_bytes(appliance), idle_shm, 1.0)
    assert shm <= idle_shm, f"/dev/shm holds {shm} bytes after the deletion, {idle_shm} before the topic"
    del producer


def test_a_closed_local_producer_leaves_no_ring_behind(appliance: Appliance) -> None:
    prefix = ring_prefix(appliance)
    socket_path = appliance.data_dir / ".appliance.sock"
    idle_shm = shm_bytes(appliance)
    producer = Producer({"appliance.control.socket": str(socket_path)})
    for i in range(500):
        producer.send("local", f"l{i}".encode(), partition=i % 2)
    producer.flush(30)
    assert mapped_ring_bytes(os.getpid(), prefix) > 0
    producer.close(30)
    assert mapped_ring_bytes(os.getpid(), prefix) == 0  # the producer unmapped its rings
    shm = settles(lambda: shm_bytes(appliance), idle_shm, SETTLE_S)
    assert shm <= idle_shm, f"/dev/shm holds {shm} bytes after the producer closed, {idle_shm} before"


def test_local_producer_ring_grows_under_random_sizes_and_keeps_every_record_once_in_order(
    appliance: Appliance,
) -> None:
    rng = random.Random(1616)
    values = [rng.randbytes(rng.choice((8, 200, 5000, 60_000, 300_000))) for _ in range(300)]
    producer = Producer({"appliance.control.socket": str(appliance.data_dir / ".appliance.sock"),
                         "linger.ms": 0})  # fmt: skip
    try:
        for value in values:
            producer.send("local", value, partition=1)
            if rng.random() < 0.05:
                producer.flush(30)
        producer.flush(30)
        largest = max(ring_sizes(appliance))
    finally:
        producer.close(30)
    assert largest > INITIAL_BYTES * 2, largest  # the ring grew (a 300 KB record alone needs it)
    logged = logged_values(appliance, "local", 1)
    assert logged[-len(values):] == values


def test_broker_ring_grows_under_a_burst_of_large_records_exactly_once_in_order(appliance: Appliance) -> None:
    prefix, broker = ring_prefix(appliance), broker_pid(appliance)
    values = [bytes([i % 251]) * 100_000 for i in range(120)]
    producer = kafka_producer(appliance, **{"linger.ms": 20, "batch.size": 900_000})
    produce_all(producer, "big", values, partition=0)
    largest = max((end for end in _ring_mappings(broker, prefix)), default=0)
    assert largest > INITIAL_BYTES * 2, largest
    assert logged_values(appliance, "big", 0) == values
    del producer


def _ring_mappings(pid: int, prefix: str) -> list[int]:
    sizes = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and f"/dev/shm/{prefix}" in fields[5]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            sizes.append(end - start)
    return sizes
