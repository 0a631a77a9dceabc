"""The appliance a benchmark runs against: one the bench starts (``appliance serve`` in a fresh temporary
directory, stopped and removed afterwards) or one already running that the user points at (``--data-dir``).

``Appliance.open(None)`` starts a private one; ``Appliance.open(DIR)`` attaches to the appliance whose data
dir (first log dir) is ``DIR`` when its control socket answers, and otherwise starts one there (and stops it
again at the end, leaving the data).  A started appliance's broker listens on an ephemeral loopback port
(read from its log), so ``--transport tcp`` works without a configured address.

The appliance runs in its own session (process group): :meth:`Appliance.kill` SIGKILLs the whole tree, as a
crash would, for recovery benchmarks.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ipc.control import ControlClient, ControlError, TopicInfo
from storage.errors import ApplianceError, ConfigError, TopicExistsError, UnknownTopicOrPartitionError

__all__ = ["Appliance", "ApplianceStartError", "free_bytes", "topic_name"]

_REPO = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(rb"broker listening on PLAINTEXT://([0-9.]+):(\d+)")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
BROKER_WAIT_S = 20.0  # after the control socket answers; local runs go on without a broker


class ApplianceStartError(ApplianceError):
    """``appliance serve`` did not become ready; the message carries the tail of its log."""


def topic_name(prefix: str = "perf") -> str:
    """A fresh topic name: ``perf-<8 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Free bytes on the file system holding ``path`` (or its nearest existing parent)."""
    where = Path(path).resolve()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free


class Appliance:
    """A running appliance: its data dir, control socket and (when known) broker address."""

    def __init__(self, data_dir: Path, *, process: subprocess.Popen[bytes] | None = None,
                 root: Path | None = None, log_path: Path | None = None,
                 bootstrap: str | None = None, overrides: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        self.socket_path = str(data_dir / ".appliance.sock")
        self.process = process  # None: attached to a running appliance, not ours to stop
        self.root = root  # a temporary directory we created (removed at close)
        self.log_path = log_path
        self.bootstrap = bootstrap
        self.overrides = tuple(overrides)
        self.broker_problem = ""  # why bootstrap is None for an appliance we started
        self._log_file: Any = None

    # -- lifetime -------------------------------------------------------------------------------------------

    @property
    def owned(self) -> bool:
        return self.process is not None

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str] | None, *, overrides: Sequence[str] = ()) -> Appliance:
        """Attach to the appliance running in ``data_dir``, or start one (in a fresh temporary directory when
        ``data_dir`` is None).  ``overrides``: ``KEY=VALUE`` settings for a started one."""
        if data_dir is not None:
            path = Path(data_dir).resolve()
            try:
                ControlClient.connect(path / ".appliance.sock", timeout_s=5).close()
            except (ControlError, OSError):
                pass
            else:
                return cls(path)
            return cls.start(path, overrides=overrides)
        return cls.start(None, overrides=overrides)

    @classmethod
    def start(cls, data_dir: Path | None, *, overrides: Sequence[str] = ()) -> Appliance:
        """Start ``appliance serve`` (data in ``data_dir``, or in a new temporary directory) and wait until
        its control socket and broker answer."""
        root = None
        if data_dir is None:
            root = Path(tempfile.mkdtemp(prefix="la-perf-"))
            data_dir = root / "data"
            log_path = root / "serve.log"
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            log_path = Path(tempfile.mkstemp(prefix="la-perf-serve-", suffix=".log")[1])
        app = cls(data_dir, root=root, log_path=log_path, overrides=overrides)
        app._spawn()
        return app

    def _spawn(self) -> None:
        """Start ``appliance serve``; it gets SIGTERM (a clean stop) if the bench process dies first."""
        assert self.log_path is not None
        args = [sys.executable, "-m", "appliance.cli", "serve", "--override", f"log.dirs={self.data_dir}",
                "--override", "listeners=PLAINTEXT://127.0.0.1:0"]
        for item in self.overrides:
            args += ["--override", item]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO),
                                                                        os.environ.get("PYTHONPATH")]))}
        self._log_file = open(self.log_path, "ab")
        log_start = self._log_file.tell()
        self.process = subprocess.Popen(args, cwd=str(self.data_dir.parent), env=env, stdout=self._log_file,
                                        stderr=self._log_file, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=_stop_with_the_bench)
        self.wait_ready(log_start)

    def wait_ready(self, log_start: int = 0, timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait until the control socket answers and the broker has logged its port; seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        assert self.process is not None and self.log_path is not None
        control_ok = False
        control_ok_at: float | None = None
        while True:
            if self.process.poll() is not None:
                raise ApplianceStartError(f"appliance serve exited with {self.process.returncode}:\n"
                                          f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ApplianceStartError(
                    f"appliance serve not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
            if not control_ok:
                try:
                    ControlClient.connect(self.socket_path, timeout_s=5).close()
                    control_ok = True
                except (ControlError, OSError):
                    pass
            if control_ok:
                with open(self.log_path, "rb") as f:
                    f.seek(log_start)
                    found = _LISTENING.findall(f.read())
                if found:
                    host, port = found[-1]
                    self.bootstrap = f"{host.decode()}:{int(port)}"
                    return time.monotonic() - started
                if control_ok_at is None:
                    control_ok_at = time.monotonic()
                elif time.monotonic() - control_ok_at > BROKER_WAIT_S:
                    self.bootstrap = None  # the local paths work without it; TCP runs say it is missing
                    self.broker_problem = (f"the broker did not start within {BROKER_WAIT_S:.0f} s: "
                                           f"{self.log_tail(600)}")
                    return time.monotonic() - started
            time.sleep(0.01)

    def log_tail(self, max_bytes: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[-max_bytes:].decode(errors="replace")

    def restart(self) -> float:
        """Start our ``appliance serve`` again on the same data dir (after :meth:`stop` or :meth:`kill`);
        seconds from the start to ready (recovery included)."""
        if self.log_path is None:
            raise ApplianceError("restart: this appliance was not started by the benchmark")
        if self._log_file is not None:
            self._log_file.close()
        started = time.monotonic()
        self._spawn()
        return time.monotonic() - started

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> float:
        """SIGTERM our appliance and wait for it (clean stop: rings drained, logs closed); seconds taken."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._wait_group_gone()
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL our appliance's whole process tree (a crash: the next start recovers the logs)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._wait_group_gone()

    def _wait_group_gone(self, timeout_s: float = 30.0) -> None:
        """Wait until no process of our appliance's group is left (writers exit after the supervisor)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the appliance if we started it; remove the temporary directory if we created it."""
        try:
            if self.owned:
                self.stop()
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
            elif self.owned and self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Appliance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def require_bootstrap(self, given: str | None = None) -> str:
        """The broker address for a TCP run: ``given`` (--bootstrap-server), else our broker's; ConfigError
        saying why there is none."""
        if given:
            return given
        if self.bootstrap:
            return self.bootstrap
        if self.broker_problem:
            raise ConfigError(f"no broker to go over TCP to: {self.broker_problem}")
        raise ConfigError("--transport tcp: give --bootstrap-server (the address of this appliance's broker)")

    # -- topics and processes -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def client(self) -> Iterator[ControlClient]:
        with ControlClient.connect(self.socket_path) as client:
            yield client

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, Any] | None = None) -> TopicInfo:
        """Create ``name`` with ``partitions`` partitions; an existing topic with that count is kept (and
        returned), one with another count is an error."""
        with self.client() as client:
            try:
                return client.create_topic(name, partitions, configs=configs)
            except TopicExistsError:
                info = client.metadata([name]).topics[name]
                if info.partition_count != partitions:
                    raise ApplianceError(
                        f"topic {name!r} exists with {info.partition_count} partitions, not {partitions}: "
                        "name another topic (--topic) or give its partition count") from None
                return info

    def delete_topic(self, name: str) -> None:
        with self.client() as client, contextlib.suppress(UnknownTopicOrPartitionError):
            client.delete_topic(name)

    def topic(self, name: str) -> TopicInfo:
        with self.client() as client:
            return client.metadata([name]).topics[name]

    def end_offsets(self, name: str) -> list[int]:
        return [p.log_end_offset for p in self.topic(name).partitions]

    def writer_pids(self, name: str) -> list[int]:
        return [p.writer_pid for p in self.topic(name).partitions]

    def log_bytes(self, name: str) -> int:
        """Bytes of the topic's segment files (``*.log``) on disk."""
        total = 0
        for part in self.topic(name).partitions:
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(part.directory):
                    if entry.name.endswith(".log"):
                        total += entry.stat().st_size
        return total

    def memory(self) -> dict[str, Any]:
        """Unique memory (USS) of the supervisor and its children, by role, in bytes."""
        with self.client() as client:
            status = client.status(memory=True)
        by_role: dict[str, int] = {}
        counts: dict[str, int] = {}
        for child in status.get("children", []):
            role = str(child.get("role", "child"))
            by_role[role] = by_role.get(role, 0) + int(child.get("uss_bytes", 0))
            counts[role] = counts.get(role, 0) + 1
        supervisor = int(status.get("uss_bytes", 0))
        writers = by_role.get("writer", 0)
        return {
            "supervisor_uss_bytes": supervisor,
            "writers_uss_bytes": writers,
            "writers": counts.get("writer", 0),
            "supervisor_and_writers_uss_bytes": supervisor + writers,
            "by_role_uss_bytes": by_role,
        }


_PR_SET_PDEATHSIG = 1


def _stop_with_the_bench() -> None:
    """In the forked child before ``exec``: SIGTERM when the bench process that started it dies (a bench
    killed by a timeout would otherwise leave its appliance running)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
