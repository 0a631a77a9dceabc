"""A real ``appliance serve`` with its broker on a free loopback port, for tests that use Kafka clients."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


KCAT = shutil.which("kcat")


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Appliance:
    process: subprocess.Popen[bytes]
    bootstrap: str
    data_dir: Path
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_appliance(tmp: Path, topics: dict[str, int], extra: str = "") -> Appliance:
    data_dir = tmp / "data"
    port = free_port()
    config = tmp / "appliance.toml"
    lines = [f'"log.dirs" = ["{data_dir}"]', f'"listeners" = "PLAINTEXT://127.0.0.1:{port}"', extra]
    for name, partitions in topics.items():
        lines += [f"[topics.{name}]", f"partitions = {partitions}"]
    config.write_text("\n".join(lines) + "\n")
    log_path = tmp / "appliance.log"
    from appliance.server import children

    if "appliance.broker.process:child_spec" in children.EXTRA_CHILDREN:
        command = [sys.executable, "-m", "appliance.cli", "serve", "--config", str(config)]
    else:
        command = [sys.executable, "-c", _SERVE, str(config)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    running = Appliance(process, f"127.0.0.1:{port}", data_dir, log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"appliance exited with {process.returncode}:\n{running.log_text()}")
        if "ready:" in running.log_text():
            return running
        time.sleep(0.05)
    stop_appliance(running)
    raise AssertionError(f"appliance not ready in 30 s:\n{running.log_text()}")


def served_appliance(tmp: Path, topics: dict[str, int], extra: str = "") -> Iterator[Appliance]:
    """A module fixture's body: :func:`start_appliance`, yield it, stop it, and fail on a traceback in its
    log (``yield from served_appliance(...)``)."""
    running = start_appliance(tmp, topics, extra)
    try:
        yield running
    finally:
        stop_appliance(running)
    assert "Traceback" not in running.log_text(), running.log_text()


def stop_appliance(appliance: Appliance) -> None:
    if appliance.process.poll() is None:
        appliance.process.send_signal(signal.SIGTERM)
        try:
            appliance.process.wait(30)
        except subprocess.TimeoutExpired:
            appliance.process.kill()
            appliance.process.wait()
    assert appliance.process.returncode == 0, appliance.log_text()
    assert "did not stop" not in appliance.log_text(), appliance.log_text()
