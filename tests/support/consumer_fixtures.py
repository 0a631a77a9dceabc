"""Helpers shared by the consumer tests (no tests here): a real partition log and state page, written directly
with storage (Log + batch_builder) the way a partition writer does, so the consumer is tested on its own; and
a running ``appliance serve`` (supervisor, writers, broker) for the end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.batch_header import COMPRESSION_NONE
from storage.log import Log
from storage.log_config import LogConfig

Headers = tuple[tuple[str, bytes | None], ...]


class Rec(NamedTuple):
    """The oracle's view of a record."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass
class WrittenPartition:
    """A partition log in ``data_dir`` plus its state page, and the list of what was appended."""

    data_dir: str
    topic: str = "t"
    partition: int = 0
    config: LogConfig = field(default_factory=LogConfig)
    records: list[Rec] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names = ShmNames.for_data_dir(self.data_dir)
        self.page_name = self.names.state_page(self.topic, self.partition)
        unlink_shared_memory(self.page_name)
        self.page = StatePage.create(self.page_name)
        self.directory = os.path.join(self.data_dir, f"{self.topic}-{self.partition}")
        self.log = Log.open(self.directory, self.config, topic_partition=(self.topic, self.partition))

    def append(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Headers] | None = None,
        *,
        timestamp_ms: int = 1_700_000_000_000,
        compression: int = COMPRESSION_NONE,
        publish: bool = True,
    ) -> int:
        """Append one batch; publish LEO and HW (= LEO) unless told not to.  Returns its base offset."""
        timestamps = [timestamp_ms + i for i in range(len(values))]
        batch = build_batch(list(values), None if keys is None else list(keys),
                            None if headers is None else [list(h) for h in headers], timestamps,
                            compression=compression)
        info = self.log.append(batch, leader_epoch=0)
        for i, value in enumerate(values):
            self.records.append(Rec(info.first_offset + i, timestamps[i], None if keys is None else keys[i],
                                    value, tuple(headers[i]) if headers is not None else ()))
        if publish:
            self.publish()
        return info.first_offset

    def publish(self, high_watermark: int | None = None) -> None:
        self.page.log_end_offset = self.log.log_end_offset
        self.page.high_watermark = self.log.log_end_offset if high_watermark is None else high_watermark

    def close(self) -> None:
        self.log.close()
        self.page.close()
        self.page.unlink()


def as_recs(records: Sequence[object]) -> list[Rec]:
    """ConsumerRecords -> oracle records."""
    return [Rec(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------- a running appliance

REPO = Path(__file__).resolve().parents[2]

# `appliance serve` with the broker as its child, whether or not the supervisor lists it yet.
_SERVE = textwrap.dedent("""
    import sys
    from appliance.broker.process import child_spec
    from appliance.cli.serve import setup_logging
    from appliance.config.server_config import load_config
    from appliance.server.supervisor import Supervisor

    config = load_config(sys.argv[1])
    setup_logging(config.log_level)
    sys.exit(Supervisor(config, extra_children=[child_spec(config)]).run())
""")


@dataclass
class RunningAppliance:
    process: subprocess.Popen[bytes]
    bootstrap: str
    data_dir: str
    config_path: str
    log_path: str

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert self.process.returncode == 0, self.log_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_appliance(tmp: Path, topics: dict[str, int], *, faults: Sequence[str] = ()) -> RunningAppliance:
    """``appliance serve`` (supervisor, partition writers, broker) on a free loopback port, with ``faults``
    armed (``appliance.test.faults``); returns when the broker answers Metadata for every topic."""
    from appliance.server import children
    from ipc.kafka import MetadataRequest
    from ipc.kafka_client import BrokerConnectionError, KafkaConnection

    data_dir, port = tmp / "data", free_port()
    config = tmp / "appliance.toml"
    lines = [f'"log.dirs" = ["{data_dir}"]', f'"listeners" = "PLAINTEXT://127.0.0.1:{port}"']
    if faults:
        lines.append(f'"appliance.test.faults" = {json.dumps(list(faults))}')
    for name, partitions in topics.items():
        lines += [f"[topics.{name}]", f"partitions = {partitions}"]
    config.write_text("\n".join(lines) + "\n")
    if "appliance.broker.process:child_spec" in children.EXTRA_CHILDREN:
        command = [str(REPO / ".venv" / "bin" / "appliance"), "serve", "--config", str(config)]
    else:
        command = [sys.executable, "-c", _SERVE, str(config)]
    log_path = tmp / "appliance.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    running = RunningAppliance(process, f"127.0.0.1:{port}", str(data_dir), str(config), str(log_path))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"appliance exited with {process.returncode}:\n{running.log_text()}")
        try:
            with KafkaConnection("127.0.0.1", port, connect_timeout_ms=500) as conn:
                answer = conn.request(MetadataRequest(topics=None))
            if {t.name for t in answer.topics} >= set(topics):
                return running
        except BrokerConnectionError:
            pass
        time.sleep(0.05)
    running.stop()
    raise AssertionError(f"appliance not ready in 30 s:\n{running.log_text()}")


def poll_until(consumers: Sequence[Any], done: Callable[[], bool], seen: list[Any] | None = None,
               timeout_s: float = 30) -> list[Any]:
    """Poll each of a few confluent-kafka consumers in turn until ``done()``, keeping the good messages in
    ``seen`` (returned); fails the test after ``timeout_s``."""
    seen = [] if seen is None else seen
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        for c in consumers:
            message = c.poll(0.1)
            if message is not None and message.error() is None:
                seen.append(message)
    assert done(), f"gave up after {timeout_s} s with {len(seen)} records"
    return seen
