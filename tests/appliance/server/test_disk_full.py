"""A full disk is a state, not a crash: ``appliance serve`` (supervisor, writers, broker) on a small tmpfs and
on a small loop-mounted ext4, filled by idempotent acks=all producers (ours, local and over TCP).

What a user must see, in one run per file system: producers get KafkaStorageError (not a timeout); local and
TCP consumers keep reading everything acknowledged; metadata answers and a topic can be deleted while full;
deleting it frees the space and writes resume within seconds with no restart; no process died (no SIGBUS,
no restart in the supervisor's log); every acknowledged record is in the log exactly once and no refused
one is.  Mounting needs root and the kernel's tmpfs / loop devices: without them the test skips, saying so.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.consumer_fixtures import free_port
from support.harness import Appliance

from appliance.client.admin import KafkaAdmin
from appliance.client.consumer import Consumer
from appliance.client.producer import Producer
from storage.batch_reader import iter_records
from storage.errors import KafkaStorageError

pytestmark = pytest.mark.slow

_VALUE_BYTES = 32 * 1024  # the filler's records: a 20 MiB file system fills in a few hundred


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def _mounted(kind: str) -> Iterator[Path]:
    """A fresh ``kind`` file system ("tmpfs": 20 MiB; "ext4": a 40 MiB image, no root reserve) mounted
    in a temporary directory, unmounted and removed afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    base = Path(tempfile.mkdtemp(prefix="la-df-", dir="/tmp"))
    mount_point = base / "m"
    mount_point.mkdir()
    mounted = False
    try:
        if kind == "tmpfs":
            done = _run("mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount_point))
        else:
            image = base / "disk.img"
            with open(image, "wb") as f:
                f.truncate(40 * 1024 * 1024)
            made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
            if made.returncode != 0:
                pytest.skip(f"cannot make an ext4 image: {made.stderr.strip() or made.returncode}")
            done = _run("mount", "-o", "loop", str(image), str(mount_point))
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {kind} here: {done.stderr.strip() or done.returncode}")
        mounted = True
        yield mount_point
    finally:
        if mounted:
            _run("umount", str(mount_point))
        shutil.rmtree(base, ignore_errors=True)


def _values(serve: Appliance, topic: str) -> list[bytes]:
    """Every record value of ``topic``-0 in the log, in order."""
    return [record.value or b"" for batch in serve.batches(topic, 0) for record in iter_records(batch)]


def _fill(producer: Producer, topic: str, acked: list[bytes], value_bytes: int) -> KafkaStorageError:
    """Send records of ``value_bytes`` to ``topic`` until one is refused; the acknowledged ones go to
    ``acked``."""
    for i in range(5000):
        value = (b"%s-%d-%08d-" % (topic.encode(), value_bytes, i)).ljust(value_bytes, b".")
        try:
            producer.send(topic, value).get(timeout=30)
        except KafkaStorageError as exc:
            return exc
        acked.append(value)
    raise AssertionError("the file system never filled")


def _send(producer: Producer, value: bytes) -> KafkaStorageError | None:
    try:
        producer.send("data", value).get(timeout=30)
    except KafkaStorageError as exc:
        return exc
    return None


_BALLAST_BYTES = 4 * 1024 * 1024  # a file a person deletes to make room (the ext4 case)


@pytest.mark.parametrize(("kind", "reserve"), [("tmpfs", 2 * 1024 * 1024), ("ext4", 0)])
def test_a_full_log_dir_refuses_writes_keeps_serving_and_resumes(kind: str, reserve: int) -> None:
    """tmpfs: the log dir keeps a 2 MiB reserve (``log.dir.min.free.bytes``), so writes stop before the file
    system is full and the topic metadata still has room: the topic is deleted while full, which frees the
    space.  ext4: no reserve, the appends themselves meet ENOSPC (index allocation included); a person then
    deletes a file of their own, writes resume, and the topic is deleted after."""
    with _mounted(kind) as mount_point:
        port = free_port()
        ballast = mount_point / "ballast"
        if reserve == 0:
            ballast.write_bytes(bytes(_BALLAST_BYTES))
        serve = Appliance(
            None, f"listeners=PLAINTEXT://127.0.0.1:{port}", "auto.create.topics.enable=false",
            "topics.junk.partitions=1", "topics.data.partitions=1", f"log.dir.min.free.bytes={reserve}",
            "segment.bytes=1048576",
            patch={"EXTRA_CHILDREN": ("appliance.broker.process:child_spec",)}, data=mount_point / "data",
        )
        try:
            serve.start()
            try:
                _check_full_then_resumed(serve, f"127.0.0.1:{port}", ballast if reserve == 0 else None)
            except BaseException:
                print(serve.log())  # shown with the failure
                raise
            assert serve.stop() == 0, serve.log()
            log = serve.log()
            assert "SIGBUS" not in log and "restarting" not in log and "Traceback" not in log, log
            # no child died: every one ended with status 0 (a deleted topic's writer, then the stop)
            assert not re.search(r"stopped: (exited with status [1-9]|was killed)", log), log
        finally:
            serve.close()


def _check_full_then_resumed(serve: Appliance, bootstrap: str, ballast: Path | None) -> None:
    local = {"appliance.control.socket": str(serve.socket_path), "acks": "all", "linger.ms": 1,
             "delivery.timeout.ms": 1500, "retry.backoff.ms": 50}
    admin = _admin(bootstrap)
    with Producer(local) as producer, Producer({**local, "appliance.control.socket": "",
                                                "bootstrap.servers": bootstrap}) as remote:
        data = [b"before-%d" % i for i in range(100)]
        for value in data:
            producer.send("data", value)
        producer.flush(30)
        junk: list[bytes] = []
        error = _fill(producer, "junk", junk, _VALUE_BYTES)
        # the named error: partition, log dir, cause (its free bytes), what to do
        assert error.partition == "junk-0" and "KAFKA_STORAGE_ERROR" in str(error), error
        assert error.directory == str(serve.data) and "bytes free" in error.cause, error
        assert "free space" in str(error).lower()
        for size in (4096, 256, 16):  # what a file system's last partly used blocks still take
            _fill(producer, "data", data, size)
        # refused with the storage error, not a timeout (as small as the last record refused)
        assert _send(producer, b"refused-local-16") is not None
        assert _send(remote, b"refused-remote16") is not None
        # while full: reads (local files and the broker), metadata; the space comes back
        assert _read_local(serve, "junk", len(junk)) == junk
        assert _read_remote(bootstrap, "data", len(data)) == data
        assert {"junk", "data"} <= set(admin.list_topics())
        if ballast is None:
            admin.delete_topic("junk")
        else:
            ballast.unlink()
        data.append(_resume(producer))
        if ballast is not None:
            admin.delete_topic("junk")
        more = [b"after-%d" % i for i in range(100)]
        for value in more:
            producer.send("data", value)
        producer.flush(30)
        remote.send("data", b"after-remote").get(timeout=30)
        data += [*more, b"after-remote"]
    admin.close()
    assert "junk" not in admin_topics(bootstrap)
    in_log = _values(serve, "data")
    assert sorted(in_log) == sorted(data), "an acknowledged record missing or twice, or a refused one in"


def _resume(producer: Producer) -> bytes:
    """Writes resume within seconds of the space coming back: the first record that goes in."""
    deadline = time.monotonic() + 10
    attempt = 0
    while True:
        value = b"resumed-%d" % attempt
        if _send(producer, value) is None:
            return value
        assert time.monotonic() < deadline, "writes did not resume within 10 s of the space coming back"
        attempt += 1
        time.sleep(0.2)


def _admin(bootstrap: str) -> KafkaAdmin:
    return KafkaAdmin(bootstrap)


def admin_topics(bootstrap: str) -> list[str]:
    with contextlib.closing(_admin(bootstrap)) as admin:
        return admin.list_topics()


def _read_local(serve: Appliance, topic: str, count: int) -> list[bytes]:
    with Consumer({"log.dirs": str(serve.data), "auto.offset.reset": "earliest"}) as consumer:
        return _read(consumer, topic, count)


def _read_remote(bootstrap: str, topic: str, count: int) -> list[bytes]:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        return _read(consumer, topic, count)


def _read(consumer: Consumer, topic: str, count: int) -> list[bytes]:
    consumer.assign([(topic, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(values) < count and time.monotonic() < deadline:
        values += [record.value or b"" for record in consumer.poll(timeout_ms=200, max_records=10_000)]
    return values
