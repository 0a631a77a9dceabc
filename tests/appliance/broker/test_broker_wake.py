"""The broker sleeps while nothing happens and wakes on the writers' news (``appliance.broker.broker``,
"Waking on the writers' news"): a real ``appliance serve`` with two in-process follower replicas, real Kafka
clients.

* An idle appliance leading a replicated topic (its followers' long-poll fetches always parked at the
  leader) costs the broker almost no CPU: measured from ``/proc/<pid>/stat`` over a few seconds.
* A consumer's fetch held with a long ``max_wait_ms`` is answered with the new records as soon as they are
  produced, well before its deadline; acks=all produces complete though the followers' fetches wait long.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.stats import process_cpu_ns

kafka = pytest.importorskip("kafka")

REPO = Path(__file__).resolve().parents[3]
TOPIC = "waking"
LONG_WAIT_MS = 20_000  # the consumers' and followers' long poll: far longer than any wake-up may take
IDLE_SECONDS = 4.0
SETTLE_SECONDS = 2.0
IDLE_BROKER_CPU_SHARE = 0.02  # of one core; the broker polled at 1 ms before (~5-7 %)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class _Running:
    process: subprocess.Popen[bytes]
    bootstrap: str
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Running]:
    tmp = tmp_path_factory.mktemp("wake")
    port = _free_port()
    config = tmp / "appliance.toml"
    config.write_text("\n".join([
        f'"log.dirs" = ["{tmp / "leader"}"]',
        f'"listeners" = "PLAINTEXT://127.0.0.1:{port}"',
        f'"appliance.replica.dirs" = ["{tmp / "r1"}", "{tmp / "r2"}"]',
        '"min.insync.replicas" = 2',
        f'"replica.fetch.wait.max.ms" = {LONG_WAIT_MS}',
        f"[topics.{TOPIC}]",
        "partitions = 1",
        '"replication.factor" = 3',
    ]) + "\n")  # fmt: skip
    log_path = tmp / "appliance.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--config", str(config)],
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    running = _Running(process, f"127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + 30
        while "ready:" not in running.log_text():
            assert process.poll() is None, running.log_text()
            assert time.monotonic() < deadline, running.log_text()
            time.sleep(0.05)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, running.log_text()
    assert "Traceback" not in running.log_text(), running.log_text()


def _child_pid(parent: int, title: str) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and cmdline.startswith(title.encode()):
            return int(entry)
    raise AssertionError(f"no child {title!r} of {parent}")


def _producer(running: _Running) -> Any:
    return kafka.KafkaProducer(bootstrap_servers=running.bootstrap, acks="all", request_timeout_ms=60_000,
                               retries=100, retry_backoff_ms=100)  # fmt: skip


def test_acks_all_completes_while_the_followers_long_poll(appliance: _Running) -> None:
    producer = _producer(appliance)
    try:
        producer.send(TOPIC, b"first", partition=0).get(timeout=60)  # the followers are in sync now
        started = time.monotonic()
        for i in range(5):
            producer.send(TOPIC, b"acked-%d" % i, partition=0).get(timeout=60)
        took_s = time.monotonic() - started
    finally:
        producer.close()
    # each commit needs a follower's held fetch answered: waiting out its long poll would take 5 x 20 s
    assert took_s < LONG_WAIT_MS / 1000, took_s


@pytest.mark.slow
def test_an_idle_replicated_appliance_broker_sleeps(appliance: _Running) -> None:
    producer = _producer(appliance)
    try:
        producer.send(TOPIC, b"in sync", partition=0).get(timeout=60)
    finally:
        producer.close()
    broker = _child_pid(appliance.process.pid, "appliance: broker")
    time.sleep(SETTLE_SECONDS)  # connections close, start-up work ends, the followers park their fetches
    before = process_cpu_ns([broker]) / 1e9
    time.sleep(IDLE_SECONDS)
    used_s = process_cpu_ns([broker]) / 1e9 - before
    assert used_s < IDLE_BROKER_CPU_SHARE * IDLE_SECONDS, f"{used_s:.3f} s of CPU in {IDLE_SECONDS} s idle"


def test_a_held_consumer_fetch_is_answered_on_produce(appliance: _Running) -> None:
    tp = kafka.TopicPartition(TOPIC, 0)
    consumer = kafka.KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False,
                                   fetch_max_wait_ms=LONG_WAIT_MS, request_timeout_ms=LONG_WAIT_MS + 30_000)
    producer = _producer(appliance)
    try:
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        end = consumer.position(tp)
        assert not consumer.poll(timeout_ms=500)  # its fetch is now held at the broker
        producer.send(TOPIC, b"news", partition=0).get(timeout=60)
        produced_s = time.monotonic()
        records: list[Any] = []
        while not records and time.monotonic() - produced_s < LONG_WAIT_MS / 1000:
            for batch in consumer.poll(timeout_ms=100).values():
                records += batch
        waited_s = time.monotonic() - produced_s
    finally:
        producer.close()
        consumer.close()
    assert [(r.offset, r.value) for r in records] == [(end, b"news")]
    assert waited_s < LONG_WAIT_MS / 1000 / 2, waited_s  # answered on the news, not at the deadline
