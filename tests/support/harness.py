"""Helpers for the tests that run ``appliance serve`` as a real process tree (no tests in this module).

:class:`Appliance` starts ``python -m appliance.cli serve`` in a short temporary working directory (so the
default ``./data/.appliance.sock`` stays under the 107-byte socket path limit), listens on a NOTIFY_SOCKET
like systemd does, and cleans up whatever a failed test leaves (the process group, shared memory).
:class:`RawProducer` is the smallest idempotent producer: batches from ``storage.batch_builder`` published
into a ring attached through the control socket, acks read from the ring.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from appliance.config.server_config import Config
from appliance.server.children import ChildContext, ChildSpec
from ipc.control import Attachment, ControlClient
from ipc.ring import RingProducer
from ipc.shm import SHM_DIR, ShmNames, instance_id, list_objects, reclaim
from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.log_reader import LogReader
from support.replication_cluster import group_has_live_members

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
# The module settings a test may change before `appliance serve` starts, and the module each lives in.
_PATCHABLE = {"EXTRA_CHILDREN": "appliance.server.children", "WRITER_STALL_S": "appliance.server.supervisor"}


class Appliance:
    """One ``appliance serve`` process tree in its own working directory and process group."""

    def __init__(self, cwd: Path | None = None, *overrides: str, env: dict[str, str] | None = None,
                 patch: dict[str, object] | None = None, data: Path | None = None) -> None:  # fmt: skip
        self.owns_cwd = cwd is None
        self.cwd = Path(tempfile.mkdtemp(prefix="la-", dir="/tmp")) if cwd is None else cwd
        # an ephemeral TCP port, so appliances side by side never collide once the broker runs as a child
        listeners = [] if any(o.startswith("listeners=") for o in overrides) else ["listeners=127.0.0.1:0"]
        # data: the one log dir somewhere else than ./data (the service's own log stays in cwd)
        self.overrides = listeners + list(overrides) + ([] if data is None else [f"log.dirs={data}"])
        self.extra_env = dict(env or {})
        self.patch = dict(patch or {})  # module settings of the server (_PATCHABLE), e.g. EXTRA_CHILDREN
        self.data = self.cwd / "data" if data is None else data
        self.socket_path = self.data / ".appliance.sock"
        self.names = ShmNames(instance_id(self.data))
        self.log_path = self.cwd / f"serve-{time.monotonic_ns()}.log"
        self._notify_dir = tempfile.mkdtemp(prefix="la-n", dir="/tmp")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(os.path.join(self._notify_dir, "n"))
        self.messages: list[str] = []
        self._arrived = threading.Condition()
        self._listener = threading.Thread(target=self._listen, daemon=True)
        self._listener.start()
        self.process: subprocess.Popen[bytes] | None = None

    # -- lifetime -------------------------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> Appliance:
        env = {**os.environ, "NOTIFY_SOCKET": os.path.join(self._notify_dir, "n"), **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
        args = [sys.executable, "-m", "appliance.cli", "serve"]
        if self.patch:  # the same command, with module settings of the server changed first
            settings = "; ".join(f"import {_PATCHABLE[name]}; {_PATCHABLE[name]}.{name} = {value!r}"
                                 for name, value in self.patch.items())  # fmt: skip
            script = (
                f"import sys; {settings}; "
                "from appliance.cli import serve; sys.exit(serve.main(sys.argv[1:]))"
            )
            args = [sys.executable, "-c", script]
        for item in self.overrides:
            args += ["--override", item]
        self.log_path = self.cwd / f"serve-{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, cwd=self.cwd, env=env, stderr=log, stdout=log,
                                            start_new_session=True)  # fmt: skip
        if wait:
            self.wait_for("READY=1")
        return self

    def _listen(self) -> None:
        """Read every datagram as systemd would (a full queue would block the supervisor's sendto)."""
        while True:
            try:
                datagram = self.notify.recv(4096)
            except OSError:
                return
            with self._arrived:
                self.messages += datagram.decode().splitlines()
                self._arrived.notify_all()

    def wait_for(self, prefix: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """The first sd_notify line starting with ``prefix`` not consumed yet (others stay queued)."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                for line in self.messages:
                    if line.startswith(prefix):
                        self.messages.remove(line)
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {prefix} in {timeout_s} s: {self.messages}; log:\n{self.log()}")
                assert self.process is not None
                code = self.process.poll()
                if code is not None and prefix != "STOPPING":
                    raise AssertionError(f"serve exited with {code}:\n{self.log()}")
                self._arrived.wait(min(remaining, 0.1))

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill_tree(self) -> None:
        """SIGKILL the supervisor and every child at once (what a power cut leaves of the processes)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        deadline = time.monotonic() + 5
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Kill what is left of the tree, then remove its shared memory and directories (each step also
        when an earlier one failed: a tree that would not die still leaves nothing of its own behind)."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.kill_tree()
            elif self.process is not None and _group_alive(self.process.pid):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            try:
                reclaim(self.names.instance)
                (SHM_DIR / f"la-{self.names.instance}.lock").unlink(missing_ok=True)
            finally:
                try:
                    self.notify.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed already (close called twice)
                self.notify.close()
                self._listener.join(2)
                shutil.rmtree(self._notify_dir, ignore_errors=True)
                if self.owns_cwd:
                    shutil.rmtree(self.cwd, ignore_errors=True)

    # -- looking at it --------------------------------------------------------------------------------------

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> ControlClient:
        return ControlClient.connect(self.socket_path, timeout_s=30)

    def leftovers(self) -> list[str]:
        """Shared-memory objects and lock files of this instance still in /dev/shm."""
        segments, semaphores = list_objects(self.names.instance)
        extra = [n for n in os.listdir(SHM_DIR) if n.startswith(f"la-{self.names.instance}")]
        return sorted(set(segments + semaphores + ["/" + n for n in extra]))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    def batches(self, topic: str, partition: int) -> list[bytes]:
        with LogReader(str(self.data / f"{topic}-{partition}")) as reader:
            return list(reader.batches())

    def children(self) -> list[int]:
        """Pids of the supervisor's children (writers, extras)."""
        with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
            return [int(p) for p in f.read().split()]

    def writers(self, count: int = 0, timeout_s: float = 10.0) -> list[int]:
        """Pids of the partition writers (whatever extra children run beside them); waits until at least
        ``count`` of them carry their title (a child sets it just after the fork)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [pid for pid in self.children() if _title(pid).startswith("appliance: writer ")]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.01)


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").decode(errors="replace")
    except OSError:
        return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return group_has_live_members(pgid)


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


class RawProducer:
    """An idempotent producer on one partition: one batch per frame, sequences counted per record."""

    def __init__(self, client: ControlClient, topic: str, partition: int, *, producer_id: int | None = None,
                 max_block_ms: int = 10_000, ring_bytes: int | None = None) -> None:  # fmt: skip
        self.client = client
        self.topic = topic
        self.partition = partition
        if producer_id is None:
            producer_id, _ = client.init_producer_id()
        self.producer_id = producer_id
        self.max_block_ms = max_block_ms
        self.next_sequence = 0
        self.attachment: Attachment = client.attach(topic, partition, producer_id=producer_id,
                                                    ring_bytes=ring_bytes)
        self.ring: RingProducer = self.attachment.open(max_block_ms=max_block_ms)
        self.in_flight: dict[int, tuple[int, bytes]] = {}  # frame seq -> (batch sequence, batch bytes)
        self.acked: dict[int, int] = {}  # batch sequence -> ack result

    def batch(self, values: list[bytes], sequence: int | None = None) -> tuple[int, bytes]:
        if sequence is None:
            sequence = self.next_sequence
            self.next_sequence += len(values)
        body = build_batch(values, producer_id=self.producer_id, producer_epoch=0, base_sequence=sequence)
        return sequence, body

    def send(self, values: list[bytes]) -> int:
        sequence, body = self.batch(values)
        frame = self.ring.send(body)
        self.in_flight[frame] = (sequence, body)
        return frame

    def poll(self) -> int:
        """Move arrived acks into ``acked``; return how many arrived."""
        first, results = self.ring.poll_acks()
        for i, result in enumerate(results.tolist()):
            sequence, _ = self.in_flight.pop(first + i)
            self.acked[sequence] = result
        return len(results)

    def reattach(self) -> None:
        """A new ring (the old one is detached: its writer drains it); resend every unacked batch as it
        was, same sequences, so idempotence appends each once."""
        self.poll()
        unacked = [self.in_flight[seq] for seq in sorted(self.in_flight)]
        self.ring.close()
        self.client.detach(self.attachment)
        self.attachment = self.client.attach(self.topic, self.partition, producer_id=self.producer_id)
        self.ring = self.attachment.open(max_block_ms=self.max_block_ms)
        self.in_flight = {}
        for sequence, body in unacked:
            self.in_flight[self.ring.send(body)] = (sequence, body)

    def close(self) -> None:
        self.ring.close()


def logged_sequences(batches: list[bytes], producer_id: int) -> dict[int, list[int]]:
    """base sequence -> every base offset the log holds a batch of ``producer_id`` with it at."""
    found: dict[int, list[int]] = {}
    for data in batches:
        header = parse_header(data)
        if header.producer_id == producer_id:
            found.setdefault(header.base_sequence, []).append(header.base_offset)
    return found


def helper_child(config: Config) -> ChildSpec:
    """An extra child for the tests: produces one batch as a producer would, says it is ready, then waits."""

    def run(context: ChildContext) -> int:
        # first (threads made later inherit it): a stop that comes before the sigwait waits for it, not kills
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        with context.connect() as client:
            topic = "from-helper"
            if topic not in client.metadata().topics:
                client.create_topic(topic, 1)
            producer = RawProducer(client, topic, 0)
            producer.send([b"hello from pid %d" % os.getpid()])
            assert producer.ring.wait_acks(producer.ring.next_seq - 1, 5000)
            producer.close()
            context.ready()
            signal.sigwait([signal.SIGTERM])  # the supervisor stops us
        return 0

    return ChildSpec(name="helper", target=run, wait_ready=True)
