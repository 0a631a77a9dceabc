"""Producing over TCP to a running ``appliance serve``: ``appliance.Producer({"bootstrap.servers": ...})``
(``appliance.client.tcp_route``) and ``appliance produce TOPIC --bootstrap-server`` through the real console
script.

What was produced is read back three ways: ``appliance consume --bootstrap-server``, kcat, and the segment
files themselves (record by record, and the idempotent producer's id and sequence numbers batch by batch).
A broker killed in the middle of a stream costs nothing: the producer resends what was unanswered through
new connections and every record is in the log exactly once, in order.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from support.harness import logged_sequences
from support.kafka_appliance import Appliance, start_appliance, stop_appliance

from appliance.cli import produce as produce_cli
from appliance.client.producer import Producer
from appliance.server.proctitle import get_proctitle
from ipc.kafka_client import BrokerConnectionError
from storage.batch_header import parse_header
from storage.batch_reader import Record, iter_records
from storage.errors import ConfigError, UnknownTopicOrPartitionError
from storage.log_reader import LogReader

APPLIANCE = Path(sys.executable).with_name("appliance")  # the console script of this venv
KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    running = start_appliance(
        tmp_path_factory.mktemp("remote"),
        {"lines": 2, "pinned": 3, "api": 3, "killed": 2},
        extra='"auto.create.topics.enable" = false',
    )
    try:
        yield running
    finally:
        stop_appliance(running)


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(APPLIANCE), *args], input=stdin, capture_output=True, timeout=60)


def records(appliance: Appliance, topic: str, partition: int) -> list[Record]:
    with LogReader(str(appliance.data_dir / f"{topic}-{partition}")) as reader:
        return [r for batch in reader.batches() for r in iter_records(batch)]


def batches(appliance: Appliance, topic: str, partition: int) -> list[bytes]:
    with LogReader(str(appliance.data_dir / f"{topic}-{partition}")) as reader:
        return list(reader.batches())


# -- appliance produce --bootstrap-server -----------------------------------------------------------------


def test_produce_over_tcp_then_consume_and_kcat_read_the_same_lines(appliance: Appliance) -> None:
    lines = [b"key-%d:value %d \xe2\x82\xac" % (i % 7, i) for i in range(300)]
    produced = cli("produce", "lines", "--bootstrap-server", appliance.bootstrap, "--key-separator", ":",
                   stdin=b"\n".join(lines) + b"\n")  # fmt: skip
    assert (produced.returncode, produced.stderr) == (0, b"")

    by_partition = [records(appliance, "lines", p) for p in (0, 1)]
    assert sum(len(rs) for rs in by_partition) == 300
    for rs in by_partition:  # each partition holds its keys' lines in the order they were given
        assert [r.offset for r in rs] == list(range(len(rs)))
        got = [r.key + b":" + r.value for r in rs if r.key is not None and r.value is not None]
        assert got == [line for line in lines if line in set(got)]
    keys_of = [{r.key for r in rs} for rs in by_partition]
    assert not keys_of[0] & keys_of[1], "a key's records all go to one partition"

    consumed = cli("consume", "lines", "--bootstrap-server", appliance.bootstrap, "--from-beginning",
                   "--max-messages", "300", "--print-key", "--key-separator", ":",
                   "--timeout-ms", "10000")  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.splitlines()) == sorted(lines)

    if KCAT is None:
        pytest.skip("kcat is not installed (make install provisions it)")
    for partition, rs in enumerate(by_partition):
        out = subprocess.run(
            [KCAT, "-b", appliance.bootstrap, "-C", "-t", "lines", "-p", str(partition), "-o", "beginning",
             "-e", "-q", "-f", "%o %k:%s\n"],
            capture_output=True, timeout=30,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [b"%d %s:%s" % (r.offset, r.key, r.value) for r in rs]


def test_produce_over_tcp_to_a_pinned_partition_with_acks_1(appliance: Appliance) -> None:
    produced = cli("produce", "pinned", "--bootstrap-server", appliance.bootstrap, "--partition", "2",
                   "--acks", "1", "--compression", "zstd", stdin=b"a\nb\r\nc")  # fmt: skip
    assert (produced.returncode, produced.stderr) == (0, b"")
    assert [r.value for r in records(appliance, "pinned", 2)] == [b"a", b"b", b"c"]
    assert records(appliance, "pinned", 0) == records(appliance, "pinned", 1) == []


def test_produce_cli_bad_input_over_tcp(appliance: Appliance, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Each kind of mistake once through the console script, the variations in-process (the same ``main``)."""
    b = ["--bootstrap-server", appliance.bootstrap]
    script: list[tuple[list[str], int, bytes]] = [
        (["produce", "no-such-topic", *b], 1, b"topic 'no-such-topic' does not exist"),
        (["produce", "lines", "--acks", "0", *b], 2, b"acks=0 is not supported over bootstrap.servers"),
    ]
    in_process: list[tuple[list[str], int, str]] = [
        (["bad/name", *b], 1, "not a legal topic name"),
        (["lines", "--partition", "5", *b], 1, "has partitions 0..1, not 5"),
        (["lines", *b, "--data-dir", "/tmp"], 2, "give one"),
        (["lines", "--bootstrap-server", "nonsense"], 2, "expected HOST:PORT"),
        (["lines", "--bootstrap-server", "127.0.0.1:1", "--producer-property", "max.block.ms=300"], 2,
         "127.0.0.1:1: cannot connect"),
    ]  # fmt: skip
    before = [len(records(appliance, "lines", p)) for p in (0, 1)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: cli(*case[0], stdin=b"one\ntwo\n"), script))
    for (args, status, phrase), result in zip(script, results, strict=True):
        assert result.returncode == status, (args, result.stderr)
        assert phrase in result.stderr and b"Traceback" not in result.stderr, (args, result.stderr)
    for args, status, text in in_process:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\n")))
        assert produce_cli.main(args) == status, args
        assert text in capsys.readouterr().err, args
    assert [len(records(appliance, "lines", p)) for p in (0, 1)] == before, "nothing was appended"


# -- appliance.Producer(bootstrap.servers) ------------------------------------------------------------------


def test_producer_over_tcp_send_send_many_and_flush_idempotently(appliance: Appliance) -> None:
    delivered: list[tuple[object, object]] = []
    with Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 2, "batch.size": 4096}) as producer:
        assert producer.config.idempotent and producer.producer_id >= 0
        assert producer.partitions_for("api") == [0, 1, 2]
        one = producer.send("api", b"first", key=b"k", headers=[("h", b"v")], partition=0, timestamp=1234,
                            callback=lambda e, m: delivered.append((e, m)))  # fmt: skip
        singles = [producer.send("api", b"single %d" % i, partition=1) for i in range(500)]
        rows = np.frombuffer(b"".join(b"row %06d" % i for i in range(5000)), np.uint8).reshape(5000, 10)
        bulk = producer.send_many("api", rows, partition=2)
        data = b"".join(b"v%d" % i for i in range(100))
        offsets = np.cumsum([0] + [len(b"v%d" % i) for i in range(100)])
        keyed = producer.send_many("api", (data, offsets), keys=[b"k%d" % (i % 5) for i in range(100)])
        producer.flush(30)
        assert one.get(0).offset == 0 and delivered == [(None, one.get(0))]
        assert [h.get(0).offset for h in singles] == list(range(500))
        assert bulk.get(0).offsets.tolist() == list(range(5000))
        placed = keyed.get(0)
        pid = producer.producer_id

    first = records(appliance, "api", 0)[0]
    assert (first.key, first.value, first.headers, first.timestamp) == (b"k", b"first", (("h", b"v"),), 1234)
    assert [r.value for r in records(appliance, "api", 1)][:500] == [b"single %d" % i for i in range(500)]
    assert [r.value for r in records(appliance, "api", 2)][:5000] == [bytes(row) for row in rows]
    for i in range(100):  # every keyed record is where its metadata says
        at = records(appliance, "api", int(placed.partitions[i]))
        record = at[int(placed.offsets[i])]
        assert (record.key, record.value) == (b"k%d" % (i % 5), b"v%d" % i)
    for partition in range(3):  # one batch per sequence number, numbered densely from 0
        logged = batches(appliance, "api", partition)
        sequences = logged_sequences(logged, pid)
        assert all(len(at) == 1 for at in sequences.values()), "no batch appended twice"
        expected = 0
        for data_ in logged:
            header = parse_header(data_)
            assert (header.producer_id, header.base_sequence) == (pid, expected)
            expected += header.last_offset_delta + 1


def test_a_broker_killed_mid_stream_loses_and_duplicates_nothing(appliance: Appliance) -> None:
    """SIGKILL the broker while batches are in flight: the supervisor restarts it, the producer's connections
    break, it resends what was unanswered with the same sequence numbers, and every record is in the log
    once, in the order sent."""
    count = 20_000
    errors: list[BaseException] = []
    with Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 1, "batch.size": 2048,
                   "max.block.ms": 30_000}) as producer:  # fmt: skip
        pid = producer.producer_id
        handles = []
        started = threading.Event()

        def stream() -> None:
            try:
                for i in range(count):
                    handles.append(producer.send("killed", b"record %06d" % i, partition=i % 2))
                    if i == count // 4:
                        started.set()
            except BaseException as exc:
                errors.append(exc)
                started.set()

        sender = threading.Thread(target=stream)
        sender.start()
        assert started.wait(30)
        broker = next(p for p in children(appliance.process.pid) if get_proctitle(p) == "appliance: broker")
        os.kill(broker, signal.SIGKILL)
        sender.join(60)
        producer.flush(60)
        assert not errors, errors
        assert all(h.get(0).offset >= 0 for h in handles)
    assert "broker" in appliance.log_text() and "killed by signal 9" in appliance.log_text()

    for partition in (0, 1):
        got = [r.value for r in records(appliance, "killed", partition)]
        assert got == [b"record %06d" % i for i in range(partition, count, 2)]
        sequences = logged_sequences(batches(appliance, "killed", partition), pid)
        assert all(len(at) == 1 for at in sequences.values()), "a resent batch was appended once"


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_producer_over_tcp_refuses_bad_settings_and_names_clearly(appliance: Appliance) -> None:
    with pytest.raises(ConfigError, match=r"acks=0 is not supported over bootstrap\.servers"):
        Producer({"bootstrap.servers": appliance.bootstrap, "acks": 0})
    with pytest.raises(ConfigError, match="bootstrap server 'localhost': expected HOST:PORT"):
        Producer({"bootstrap.servers": "localhost"})
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match=r"127.0.0.1:1: cannot connect.*max.block.ms 300"):
        Producer({"bootstrap.servers": "127.0.0.1:1", "max.block.ms": 300})
    assert time.monotonic() - started < 5
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="'absent' does not exist"):
            producer.send("absent", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match="not a legal topic name"):
            producer.send("../x", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0\.\.2, not 3"):
            producer.send("api", b"x", partition=3)
