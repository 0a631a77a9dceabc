"""Helpers for the replication tests: nodes as real processes, a producer and a watcher over the wire.

:class:`Node` is one ``appliance serve`` or ``appliance replica`` process with its own configuration file,
data dir and log, in its own process group (optionally inside a network namespace: ``ip netns exec``).
The test talks to every node through files: its control socket (``appliance replicas status``'s
``replica_status`` op, ``promote``) and, once it leads, the broker's Unix listener -- so a test in the root
namespace reaches nodes that live in namespaces too.

:class:`AckedProducer` is an idempotent acks=all producer thread speaking Produce over those Unix listeners:
it finds the leader by Metadata (highest leader epoch), sends one batch of unique values at a time, resends
the same batch (same sequence) after an error or a lost connection, and records what was acknowledged,
every error code with its time, and the longest wait for an answer.  :class:`HighWatermarkWatcher` asks
the leader for the high watermark (ListOffsets latest, as a consumer) every few milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipc.control import ControlClient
from ipc.kafka import (
    ErrorCode,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from replicas.leader_connection import LeaderConnection
from storage.batch_builder import build_batch
from storage.batch_reader import iter_batches, iter_records
from storage.errors import ApplianceError, ProtocolError, RequestTimeoutError
from storage.log_reader import LogReader

REPO = Path(__file__).resolve().parents[2]
TOPIC = "orders"
RETRIABLE = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS,
             ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT,
             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class Node:
    """One appliance node (leader or replica) as a real process; see the module docstring."""

    def __init__(self, root: Path, node_id: int, *, host: str = "127.0.0.1", port: int | None = None,
                 settings: Mapping[str, object] | None = None,
                 topics: Mapping[str, Mapping[str, object]] | None = None, netns: str | None = None,
                 leaders: str = "") -> None:
        self.root = root
        self.node_id = node_id
        self.host = host
        self.port = port if port is not None else free_port()
        self.netns = netns
        self.leaders = leaders  # appliance.replica.leader when it runs as a replica
        self.data = root / f"d{node_id}"
        self.config_path = root / f"n{node_id}.toml"
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        lines = [
            f'"log.dirs" = {toml_value([str(self.data)])}',
            f'"node.id" = {node_id}',
            f'"listeners" = {toml_value(f"PLAINTEXT://{host}:{self.port}")}',
        ]
        lines += [f"{toml_value(k)} = {toml_value(v)}" for k, v in (settings or {}).items()]
        for name, topic in (topics or {}).items():
            lines.append(f"[topics.{toml_value(name)}]")
            lines += [f"{toml_value(k)} = {toml_value(v)}" for k, v in topic.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def control_socket(self) -> str:
        return str(self.data / ".appliance.sock")

    @property
    def broker_socket(self) -> str:
        return str(self.data / ".broker.sock")

    def directory(self, topic: str = TOPIC, partition: int = 0) -> str:
        return str(self.data / f"{topic}-{partition}")

    # -- the process ----------------------------------------------------------------------------------------

    def start(self, command: str = "serve", *overrides: str, env: Mapping[str, str] | None = None) -> Node:
        args = [sys.executable, "-m", "appliance.cli", command, "--config", str(self.config_path)]
        for item in overrides:
            args += ["--override", item]
        if self.netns is not None:
            args = ["ip", "netns", "exec", self.netns, *args]
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        environment.pop("NOTIFY_SOCKET", None)
        environment.update(env or {})
        log = self.root / f"n{self.node_id}-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(args, cwd=self.root, env=environment, stdout=out, stderr=out,
                                            start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def request(self, message: Mapping[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        with ControlClient.connect(self.control_socket, timeout_s=timeout_s) as client:
            return client.request(message)

    def status(self) -> dict[str, Any]:
        return self.request({"op": "replica_status"})

    def wait_role(self, role: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until the node answers its control socket as ``role`` ("leader" or "replica")."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"node {self.node_id} exited with {self.process.returncode}:\n"
                                     f"{self.log_text()[-4000:]}")
            try:
                status = self.status()
                if status.get("role") == role and (role != "leader" or os.path.exists(self.broker_socket)):
                    return status
                last = status.get("role")
            except (ApplianceError, OSError) as e:
                last = e
            time.sleep(0.05)
        raise AssertionError(f"node {self.node_id} is not {role} after {timeout_s} s ({last}):\n"
                             f"{self.log_text()[-4000:]}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every process of the node (its process group)."""
        os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process tree at once (a crash of the node)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)
        _wait_group_gone(self.pid)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM the node's main process; its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        _wait_group_gone(self.pid)
        return code

    def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            _wait_group_gone(self.pid)
        from ipc.shm import SHM_DIR, instance_id, reclaim

        instance = instance_id(str(self.data))
        reclaim(instance)
        (SHM_DIR / f"la-{instance}.lock").unlink(missing_ok=True)

    def log_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs if p.exists())

    # -- what is on its disk --------------------------------------------------------------------------------

    def batches(self, topic: str = TOPIC, partition: int = 0, *, upto: int | None = None) -> list[bytes]:
        """The partition's whole batches (below offset ``upto``, if given) as bytes."""
        return log_batches(self.directory(topic, partition), upto=upto)

    def values(self, topic: str = TOPIC, partition: int = 0) -> list[bytes]:
        out = []
        for batch in self.batches(topic, partition):
            for position, _ in iter_batches(batch):
                out += [bytes(r.value) for r in iter_records(batch, position) if r.value is not None]
        return out


def log_batches(directory: str | Path, *, upto: int | None = None) -> list[bytes]:
    """The whole batches of the partition log in ``directory`` (below offset ``upto``) as bytes."""
    with LogReader(str(directory)) as reader:
        return list(reader.batches(max_offset=upto))


def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if not group_has_live_members(pgid):
            return
        time.sleep(0.02)


def group_has_live_members(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (members of a dead parent may be
    zombies for a moment)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


# -- talking to whoever leads ----------------------------------------------------------------------------


class LeaderFinder:
    """Connections to the nodes' Unix listeners; the one leading a partition in the highest epoch."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.connections: dict[int, LeaderConnection] = {}

    def leader(self, topic: str = TOPIC, partition: int = 0) -> tuple[Node, LeaderConnection, int] | None:
        best: tuple[int, Node, LeaderConnection] | None = None
        for node in self.nodes:
            conn = self._connection(node)
            if conn is None:
                continue
            try:
                answer = conn.request(MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                                      allow_auto_topic_creation=False), timeout_ms=2000)
            except (OSError, ProtocolError, RequestTimeoutError):
                self.drop(node)
                continue
            for t in answer.topics:
                for p in t.partitions:
                    if p.partition_index == partition and p.error_code == 0 and p.leader_id == node.node_id:
                        if best is None or p.leader_epoch > best[0]:
                            best = (p.leader_epoch, node, conn)
        return None if best is None else (best[1], best[2], best[0])

    def _connection(self, node: Node) -> LeaderConnection | None:
        conn = self.connections.get(node.node_id)
        if conn is not None and not conn.closed:
            return conn
        if not os.path.exists(node.broker_socket):
            return None
        try:
            conn = LeaderConnection.connect(node.broker_socket, 0, client_id="test-client", timeout_ms=3000)
        except (OSError, ProtocolError, RequestTimeoutError):
            return None
        self.connections[node.node_id] = conn
        return conn

    def drop(self, node: Node) -> None:
        conn = self.connections.pop(node.node_id, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        self.connections.clear()


@dataclass
class AckedProducer:
    """An idempotent acks=all producer thread on one partition (see the module docstring)."""

    nodes: list[Node]
    topic: str = TOPIC
    partition: int = 0
    batch_records: int = 20
    timeout_ms: int = 5000
    pause_s: float = 0.0
    acked: list[bytes] = field(default_factory=list)
    errors: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, error code)
    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, answered, code)
    producer_id: int = -1
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="acked-producer", daemon=True)
        self._finder = LeaderFinder(self.nodes)
        self._sequence = 0
        self._next_value = 0

    def start(self) -> AckedProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._finder.close()
        if self.failure is not None:
            raise self.failure

    def wait_acked(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.acked)} records acknowledged, expected {count} within "
                                     f"{timeout_s} s; errors {self.errors[-5:]}")
            if self.failure is not None:
                raise self.failure
            time.sleep(0.02)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # surfaced by stop()/wait_acked()
            self.failure = e

    def _loop(self) -> None:
        values: list[bytes] = []
        while not self._stop.is_set():
            if not values:
                values = [b"v%09d" % (self._next_value + i) for i in range(self.batch_records)]
                self._next_value += self.batch_records
            found = self._finder.leader(self.topic, self.partition)
            if found is None:
                time.sleep(0.05)
                continue
            node, conn, _ = found
            if self.producer_id < 0:
                answer = conn.request(InitProducerIdRequest(transactional_id=None,
                                                            transaction_timeout_ms=60000))
                if answer.error_code != 0:
                    time.sleep(0.05)
                    continue
                self.producer_id = answer.producer_id
            batch = build_batch(values, producer_id=self.producer_id, producer_epoch=0,
                                base_sequence=self._sequence)
            request = ProduceRequest(acks=-1, timeout_ms=self.timeout_ms, topic_data=[TopicProduceData(
                name=self.topic, partition_data=[PartitionProduceData(index=self.partition, records=batch)])])
            sent = time.monotonic()
            try:
                response = conn.request(request, timeout_ms=self.timeout_ms + 5000)
            except (OSError, ProtocolError, RequestTimeoutError):
                self._finder.drop(node)
                time.sleep(0.05)
                continue
            code = response.responses[0].partition_responses[0].error_code
            now = time.monotonic()
            self.answers.append((sent, now, code))
            if code == ErrorCode.NONE:
                self.acked += values
                self._sequence += len(values)
                values = []
                if self.pause_s:
                    time.sleep(self.pause_s)
                continue
            self.errors.append((now, code))
            if code not in RETRIABLE and code != ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                raise AssertionError(f"produce answered {ErrorCode(code).name}")
            time.sleep(0.05)


@dataclass
class HighWatermarkWatcher:
    """Reads the partition's high watermark as a consumer does, from whoever leads, every few ms."""

    nodes: list[Node]
    topic: str = TOPIC
    partition: int = 0
    seen: list[tuple[int, int, int]] = field(default_factory=list)  # (leader node, epoch, high watermark)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hw-watcher", daemon=True)
        self._finder = LeaderFinder(self.nodes)

    def start(self) -> HighWatermarkWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._finder.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self._finder.leader(self.topic, self.partition)
            if found is not None:
                node, conn, epoch = found
                try:
                    answer = conn.request(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
                        ListOffsetsTopic(name=self.topic, partitions=[
                            ListOffsetsPartition(partition_index=self.partition, timestamp=-1)])]),
                        timeout_ms=2000)
                    p = answer.topics[0].partitions[0]
                    if p.error_code == 0:
                        self.seen.append((node.node_id, epoch, int(p.offset)))
                except (OSError, ProtocolError, RequestTimeoutError):
                    self._finder.drop(node)
            time.sleep(0.005)

    def backwards(self) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
        """Consecutive observations where the high watermark went down."""
        return [(a, b) for a, b in zip(self.seen, self.seen[1:], strict=False) if b[2] < a[2]]


# -- waiting on the leader's view ------------------------------------------------------------------------


def followers(leader: Node, topic: str = TOPIC, partition: int = 0) -> dict[int, dict[str, Any]]:
    """The leader's view of each follower of a partition (``replica_status``)."""
    for t in leader.status()["topics"]:
        if t["name"] == topic:
            for p in t["partitions"]:
                if p["partition"] == partition:
                    return {f["replica_id"]: {**f, "partition": p} for f in p["followers"]}
    raise AssertionError(f"{topic}-{partition} not in node {leader.node_id}'s status")


def wait_until(what: str, condition: Any, timeout_s: float = 30.0, interval_s: float = 0.02) -> float:
    """Poll ``condition()`` until true; the seconds it took.  AssertionError naming ``what`` otherwise."""
    started = time.monotonic()
    last: object = None
    while time.monotonic() - started < timeout_s:
        try:
            if condition():
                return time.monotonic() - started
        except (ApplianceError, OSError, KeyError) as e:
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last error: {last})")


def in_sync(leader: Node, replica_ids: set[int], topic: str = TOPIC, partition: int = 0) -> bool:
    """Every replica in ``replica_ids`` is in the ISR and at the leader's log end offset."""
    view = followers(leader, topic, partition)
    end = next(iter(view.values()))["partition"]["log_end_offset"] if view else -1
    return all(view[r]["in_isr"] and view[r]["log_end_offset"] == end for r in replica_ids)


@contextlib.contextmanager
def closing_all(nodes: list[Node]) -> Iterator[list[Node]]:
    try:
        yield nodes
    finally:
        for node in nodes:
            node.close()

