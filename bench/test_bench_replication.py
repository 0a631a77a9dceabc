"""Benchmarks of replication: follower catch-up against plain loopback sendfile, acks=all against acks=1.

Run: ``.venv/bin/python -m pytest bench/test_bench_replication.py --benchmark-enable --benchmark-only -s``.

* ``test_follower_catch_up_vs_sendfile``: the leader is a real ``appliance serve`` (its own process tree;
  the topic has replication factor 2, so its broker serves the follower as replica-state owner) whose
  partition log was written beforehand (``REPLICATION_BENCH_MB``, default 256 MB of 100-byte records in
  batches of ``REPLICATION_BENCH_RECORDS_PER_BATCH``, default 500: ~55 KB; 150 makes ~16 KB, Kafka's default
  ``batch.size``).  The follower is a :class:`replicas.fetcher.PartitionFetcher` -- the code ``appliance
  replica`` runs per partition -- in this process, over loopback TCP, into an empty log in another
  directory: Fetch with its replica id from its log end offset, the leader answers with ``sendfile`` from the
  segment files, every batch's CRC is checked, the batches are appended unchanged.  Bytes/s of log copied,
  against a plain loopback ``os.sendfile`` of the same segment files from a forked process to this one
  (``bench.limits.loopback_sendfile``: the kernel's copy, the physical limit), measured
  alternately in the same run; the figure is the median of the per-round ratios.  Once with Kafka's default
  ``replica.fetch.max.bytes`` (1 MiB), once with 8 MiB.  Target >= 0.7.  A second limit is reported beside
  it: the same sendfile with the receiver taking 1 MiB at a time (``recv_into``), computing the
  CRC-32C of every 64 KiB and writing it to a new file in another directory (``os.write``) -- the least a
  follower must do, since it checks and keeps a copy -- with its own ratio to plain sendfile and its
  receiving CPU per GB: what any follower on this machine is bounded by.  (Receiving with ``splice`` into the
  file and checking the CRCs through a mapping of it was measured no cheaper: the copy left, from the
  leader's page cache into the follower's, costs what the two copies through a cache-resident buffer
  cost.)
  Beside the rates, where the follower's time went (CPU figures hold up on a busy machine where rates do
  not): its CPU time per GB copied, and per round the share of the wall time its thread was runnable but
  not running (``/proc/self/task/<tid>/schedstat``: the machine was busy) or blocked (waiting for the
  leader).  And the CPU time per GB of the leader appliance's processes (its broker serving the fetches,
  mostly; plain ``sendfile`` costs its sender ~0.2 s/GB).  ``REPLICATION_BENCH_FETCH_AHEAD=0`` turns
  fetching ahead off (``FetcherConfig.pipeline_fetches``) to measure one Fetch at a time.
* ``test_acks_all_vs_acks_1``: ``appliance serve`` with two replicas on other directories
  (``appliance.replica.dirs``, each its own process following the broker's Unix listener), a topic of
  replication factor 3 with ``min.insync.replicas`` 2; a local ``appliance.Producer`` sends
  ``REPLICATION_BENCH_RECORDS`` records of 100 bytes (``send``, ``linger.ms`` 5, ``batch.size`` 256 KiB) with
  ``acks=1`` and then with ``acks=all``, alternately; the figure is the median ratio of the acks=all rate to
  the acks=1 rate.  Target >= 0.5 (Kafka's 2014 figure: 0.51).

Each prints one ``RESULT`` line and stores its figures in the benchmark's ``extra_info``.  On this 2-core
machine every process shares the two cores with the others (and with whatever else runs): the ratios are
what this run measured, not a property of the code alone.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from appliance.client.producer import Producer
from bench.limits import loopback_sendfile
from bench.stats import thread_schedstat
from ipc.control import ControlClient
from replicas.fetcher import FetcherConfig, PartitionFetcher
from replicas.leader_connection import LeaderConnection, leader_from_metadata
from storage.batch_builder import build_batch
from storage.errors import ApplianceError
from storage.log import Log
from storage.log_config import LogConfig
from storage.preallocate import reserve_blocks

REPO = Path(__file__).resolve().parent.parent
MB = int(os.environ.get("REPLICATION_BENCH_MB", "256"))
RECORDS = int(os.environ.get("REPLICATION_BENCH_RECORDS", "1000000"))
FETCH_AHEAD = os.environ.get("REPLICATION_BENCH_FETCH_AHEAD", "1") != "0"
RECORDS_PER_BATCH = int(os.environ.get("REPLICATION_BENCH_RECORDS_PER_BATCH", "500"))  # 500: ~55 KB batches
VALUE_BYTES = 100
TOPIC = "bench"
CATCH_UP_TARGET = 0.7
ACKS_TARGET = 0.5
ROUNDS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(root: Path, settings: str) -> subprocess.Popen[bytes]:
    config = root / "serve.toml"
    config.write_text(settings)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NOTIFY_SOCKET", None)
    with open(root / "serve.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--config", str(config)],
                                cwd=root, env=env, stdout=log, stderr=log, start_new_session=True)


def wait_ready(control_socket: str, broker_socket: str, timeout_s: float = 60.0) -> None:
    """Until the supervisor answers and its broker listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with ControlClient.connect(control_socket, timeout_s=5) as client:
                client.metadata()
            with LeaderConnection.connect(broker_socket, 0, timeout_ms=5000):
                return
        except (ApplianceError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"appliance at {control_socket} not ready in {timeout_s} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait(10)


# -- catch-up ---------------------------------------------------------------------------------------------


@dataclass
class Leader:
    port: int
    segments: list[str]
    log_bytes: int
    log_end_offset: int
    root: Path
    session_id: int  # of the appliance's processes (supervisor, broker, writers)


@pytest.fixture(scope="module")
def leader() -> Iterator[Leader]:
    root = Path(tempfile.mkdtemp(prefix="repl-bench-"))
    data = root / "data"
    log_config = LogConfig(segment_bytes=256 << 20)
    log = Log.open(str(data / f"{TOPIC}-0"), log_config, topic_partition=(TOPIC, 0))
    batch = build_batch([b"v" * VALUE_BYTES] * RECORDS_PER_BATCH)
    while log.size_bytes < MB * 1_000_000:
        log.append(bytearray(batch), leader_epoch=0)
    end, size = log.log_end_offset, log.size_bytes
    log.close()
    port = free_port()
    process = serve(root, f'"log.dirs" = ["{data}"]\n"listeners" = "PLAINTEXT://127.0.0.1:{port}"\n'
                          '"segment.bytes" = 268435456\n'
                          f'[topics.{TOPIC}]\npartitions = 1\n"replication.factor" = 2\n')
    try:
        wait_ready(str(data / ".appliance.sock"), str(data / ".broker.sock"))
        segments = sorted(str(p) for p in (data / f"{TOPIC}-0").glob("*.log"))
        yield Leader(port, segments, size, end, root, process.pid)
    finally:
        stop(process)
        shutil.rmtree(root, ignore_errors=True)


def _send(paths: list[str], port_pipe: Any) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_pipe.send(listener.getsockname()[1])
    port_pipe.close()
    sock, _ = listener.accept()
    with sock, listener:
        for path in paths:
            with open(path, "rb") as f:
                size, sent = os.fstat(f.fileno()).st_size, 0
                while sent < size:
                    sent += os.sendfile(sock.fileno(), f.fileno(), sent, size - sent)


@dataclass
class Floor:
    """The least a follower does, timed: receive, check, write (:func:`sendfile_crc_and_write`)."""

    received_bytes: int
    seconds: float
    cpu_seconds: float  # the receiving thread's


FLOOR_PIECE_BYTES = 1 << 20  # what the least follower receives, checks and writes at a time


def sendfile_crc_and_write(leader: Leader, chunk_bytes: int = FLOOR_PIECE_BYTES) -> Floor:
    """Loopback sendfile of the segments, the receiver taking ``chunk_bytes`` at a time, computing the CRC-32C
    of every 64 KiB of it (batch-sized pieces) and writing it to a new file whose blocks are reserved ahead
    as a follower's segment's are (``log.preallocate``): the least a follower must do, with no protocol and
    no per-batch bookkeeping.  1 MiB pieces whatever the Fetch size: a follower takes its answers' records in
    pieces of 512 KiB and more as they arrive, while they are still in the CPU's cache."""
    target = leader.root / "copy" / "segment.log"
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir()
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_send, args=(leader.segments, child), daemon=True)
    process.start()
    child.close()
    port = parent.recv()
    buffer = memoryview(bytearray(chunk_bytes))
    received = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        reserve_blocks(fd, 0, leader.log_bytes)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            cpu = time.thread_time()
            started = time.perf_counter()
            while True:
                got = 0
                while got < chunk_bytes and (n := sock.recv_into(buffer[got:])) > 0:
                    got += n
                if got == 0:
                    break
                for position in range(0, got, 64 * 1024):
                    crc32c.crc32c(buffer[position:min(position + 64 * 1024, got)])
                os.write(fd, buffer[:got])
                received += got
            elapsed = time.perf_counter() - started
            cpu = time.thread_time() - cpu
    finally:
        os.close(fd)
        buffer.release()
        parent.close()
        process.join(30)
    # The copy stays until the next round starts, as the follower's does: each then writes into the pages its
    # last copy freed.  (Writing pages the kernel has not handed out for a while was measured at 2-4 s/GB
    # instead of ~0.2 on this VM, the time in the copy itself -- likely host faults: its virtio balloon
    # reports free memory to the host -- which would bias whichever side got them.)
    return Floor(received, elapsed, cpu)


@dataclass
class CatchUp:
    copied_bytes: int
    seconds: float
    cpu_seconds: float  # this process (the fetcher's thread and anything it started)
    runnable_seconds: float  # the fetcher's thread waiting for a CPU
    blocked_seconds: float  # the fetcher's thread waiting for something else: the leader's bytes
    leader_cpu_seconds: float  # the leader appliance's processes (its broker serving the fetches, mostly)


def session_cpu_seconds(session_id: int) -> float:
    """CPU time (user + system) of the live processes of a session, from ``/proc/<pid>/stat``."""
    ticks = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        if int(fields[3]) == session_id:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def catch_up(leader: Leader, fetch_max_bytes: int) -> CatchUp:
    """Copy the whole partition into an empty follower log."""
    directory = leader.root / "follower" / f"{TOPIC}-0"
    shutil.rmtree(directory.parent, ignore_errors=True)
    with LeaderConnection.connect("127.0.0.1", leader.port) as conn:
        info = leader_from_metadata(conn, TOPIC, 0)
    assert info is not None
    log = Log.open(str(directory), LogConfig(segment_bytes=256 << 20), topic_partition=(TOPIC, 0))
    fetcher = PartitionFetcher(log, info, FetcherConfig(broker_id=1, replica_fetch_max_bytes=fetch_max_bytes,
                                                        replica_fetch_wait_max_ms=100,
                                                        pipeline_fetches=FETCH_AHEAD))
    try:
        leader_cpu = session_cpu_seconds(leader.session_id)
        on_cpu, waiting = thread_schedstat()
        cpu = time.process_time()
        started = time.perf_counter()
        while log.log_end_offset < leader.log_end_offset:
            outcome = fetcher.step()
            assert outcome.action in ("appended", "truncated", "empty"), outcome
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        on_cpu_after, waiting_after = thread_schedstat()
        leader_cpu = session_cpu_seconds(leader.session_id) - leader_cpu
        copied = log.size_bytes
    finally:
        fetcher.close()
        log.close()
    assert copied == leader.log_bytes
    runnable = (waiting_after - waiting) / 1e9
    blocked = max(0.0, elapsed - (on_cpu_after - on_cpu) / 1e9 - runnable)
    return CatchUp(copied, elapsed, cpu, runnable, blocked, leader_cpu)


@pytest.mark.parametrize("fetch_max_bytes", [1 << 20, 8 << 20], ids=["1MiB", "8MiB"])
def test_follower_catch_up_vs_sendfile(
    benchmark: BenchmarkFixture, leader: Leader, fetch_max_bytes: int,
) -> None:
    catch_up(leader, fetch_max_bytes)  # warm: page cache, connections, the broker's readers
    limits: list[float] = []
    floors: list[Floor] = []
    copies: list[float] = []
    rounds: list[CatchUp] = []

    def run() -> None:
        sent, seconds = loopback_sendfile(leader.segments)
        limits.append(sent / seconds)
        floors.append(sendfile_crc_and_write(leader))
        rounds.append(catch_up(leader, fetch_max_bytes))
        copies.append(rounds[-1].copied_bytes / rounds[-1].seconds)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    ratio = statistics.median(c / s for c, s in zip(copies, limits, strict=True))
    ratios = sorted(c / s for c, s in zip(copies, limits, strict=True))
    writes = [f.received_bytes / f.seconds for f in floors]
    write_ratio = statistics.median(c / w for c, w in zip(copies, writes, strict=True))
    floor_ratio = statistics.median(w / s for w, s in zip(writes, limits, strict=True))
    floor_s_per_gb = statistics.median(f.cpu_seconds / f.received_bytes * 1e9 for f in floors)
    copy, limit, write = statistics.median(copies), statistics.median(limits), statistics.median(writes)
    cpu_s_per_gb = statistics.median(r.cpu_seconds / r.copied_bytes * 1e9 for r in rounds)
    leader_s_per_gb = statistics.median(r.leader_cpu_seconds / r.copied_bytes * 1e9 for r in rounds)
    runnable_share = statistics.median(r.runnable_seconds / r.seconds for r in rounds)
    blocked_share = statistics.median(r.blocked_seconds / r.seconds for r in rounds)
    benchmark.extra_info.update(catch_up_bytes_per_s=copy, sendfile_bytes_per_s=limit, ratio=ratio,
                                sendfile_crc_write_bytes_per_s=write, ratio_to_sendfile_crc_write=write_ratio,
                                sendfile_crc_write_ratio_to_sendfile=floor_ratio,
                                sendfile_crc_write_cpu_s_per_gb=floor_s_per_gb,
                                follower_cpu_bound_ratio=1e9 / cpu_s_per_gb / limit,
                                target_ratio=CATCH_UP_TARGET, log_bytes=leader.log_bytes,
                                replica_fetch_max_bytes=fetch_max_bytes, fetch_ahead=FETCH_AHEAD,
                                follower_cpu_s_per_gb=cpu_s_per_gb, leader_cpu_s_per_gb=leader_s_per_gb,
                                follower_runnable_share=runnable_share,
                                follower_blocked_share=blocked_share, load_average=os.getloadavg()[0])
    print(f"\nRESULT follower catch-up ({fetch_max_bytes >> 20} MiB fetches): median of {ROUNDS} "
          f"interleaved rounds: {copy / 1e9:.2f} GB/s vs plain loopback sendfile {limit / 1e9:.2f} GB/s, "
          f"ratio {ratio:.2f} (target {CATCH_UP_TARGET}; rounds {ratios[0]:.2f}..{ratios[-1]:.2f}); "
          f"vs the least a follower does (sendfile, recv_into {FLOOR_PIECE_BYTES >> 20} MiB at a time, "
          f"CRC-32C, write to a file) {write / 1e9:.2f} GB/s, ratio {write_ratio:.2f} -- which itself "
          f"reached {floor_ratio:.2f} of plain sendfile at {floor_s_per_gb:.2f} s/GB of receiving CPU; "
          f"{leader.log_bytes / 1e6:.0f} MB per round, CRCs checked, appended to a log in another directory; "
          f"follower CPU {cpu_s_per_gb:.2f} s/GB (its CPU alone allows {1 / cpu_s_per_gb:.2f} GB/s, "
          f"{1e9 / cpu_s_per_gb / limit:.2f} of plain sendfile; the least a follower does "
          f"{1e9 / floor_s_per_gb / limit:.2f}), "
          f"leader appliance CPU {leader_s_per_gb:.2f} s/GB, "
          f"runnable-not-running {runnable_share:.0%}, waiting for the leader {blocked_share:.0%} of the "
          "time; "
          f"fetch ahead {'on' if FETCH_AHEAD else 'off'}; load average {os.getloadavg()[0]:.2f}")


# -- acks=all vs acks=1 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicated() -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="acks-bench-"))
    process = serve(root, f'"log.dirs" = ["{root / "leader"}"]\n"listeners" = "PLAINTEXT://127.0.0.1:0"\n'
                          f'"appliance.replica.dirs" = ["{root / "r1"}", "{root / "r2"}"]\n'
                          '"min.insync.replicas" = 2\n'
                          f'[topics.{TOPIC}]\npartitions = 1\n"replication.factor" = 3\n')
    control = str(root / "leader" / ".appliance.sock")
    try:
        wait_ready(control, str(root / "leader" / ".broker.sock"))
        yield control
    finally:
        stop(process)
        shutil.rmtree(root, ignore_errors=True)


def produce(control_socket: str, acks: str, records: int) -> float:
    """Records/s of one producer sending ``records`` with ``acks``, flushed."""
    value = b"x" * VALUE_BYTES
    with Producer({"appliance.control.socket": control_socket, "acks": acks, "linger.ms": 5,
                   "batch.size": 256 * 1024}) as producer:
        producer.send(TOPIC, value).get(30)
        started = time.perf_counter()
        for _ in range(records):
            producer.send(TOPIC, value)
        producer.flush(120)
        return records / (time.perf_counter() - started)


def test_acks_all_vs_acks_1(benchmark: BenchmarkFixture, replicated: str) -> None:
    produce(replicated, "all", RECORDS // 10)  # warm: kernels, rings, followers
    ones: list[float] = []
    alls: list[float] = []

    def run() -> None:
        ones.append(produce(replicated, "1", RECORDS))
        alls.append(produce(replicated, "all", RECORDS))

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    ratios = sorted(a / o for a, o in zip(alls, ones, strict=True))
    ratio = statistics.median(ratios)
    one, all_ = statistics.median(ones), statistics.median(alls)
    benchmark.extra_info.update(acks_1_records_per_s=one, acks_all_records_per_s=all_, ratio=ratio,
                                target_ratio=ACKS_TARGET, records=RECORDS)
    print(f"\nRESULT acks=all (2 followers, min.insync.replicas 2) vs acks=1: median of {ROUNDS} interleaved "
          f"pairs: {all_ / 1e6:.2f} M vs {one / 1e6:.2f} M records/s of {VALUE_BYTES} B, ratio {ratio:.2f} "
          f"(target {ACKS_TARGET}; pairs {ratios[0]:.2f}..{ratios[-1]:.2f})")
