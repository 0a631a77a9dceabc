"""``appliance consume`` through the real console script (and ``python -m appliance.cli.consume``), reading
real segment files and a real state page, and a running appliance over TCP."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.consumer_fixtures import REPO, WrittenPartition, free_port, start_appliance

from storage.batch_header import COMPRESSION_ZSTD

SCRIPT = REPO / ".venv" / "bin" / "appliance"


def _registered() -> bool:
    from appliance.cli import main as cli

    return "consume" in cli._COMMANDS


@pytest.fixture
def command() -> list[str]:
    """The console script, ``appliance consume``; until cli.py registers it, the module it will run."""
    if _registered():
        return [str(SCRIPT), "consume"]
    return [sys.executable, "-m", "appliance.cli.consume"]


@pytest.fixture
def written(tmp_path: Path) -> Iterator[WrittenPartition]:
    part = WrittenPartition(str(tmp_path))
    yield part
    part.close()


def run(command: list[str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*command, *args], capture_output=True, timeout=timeout, cwd=REPO)


def test_prints_values_keys_offsets_as_kafka_does(command: list[str], written: WrittenPartition) -> None:
    written.append([b"plain", None, b"bin\x00\xff"], [b"k0", None, b"k2"],
                   [(("a", b"1"),), (), (("b", None), ("c", b"3"))])
    written.append([b"zstd-%d" % i for i in range(3)], compression=COMPRESSION_ZSTD)
    done = run(command, "t", "--data-dir", written.data_dir, "--from-beginning", "--timeout-ms", "300",
               "--print-key", "--print-offset", "--print-partition", "--print-headers")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(b"\n") == [
        b"Partition:0\tOffset:0\ta:1\tk0\tplain",
        b"Partition:0\tOffset:1\tNO_HEADERS\tnull\tnull",
        b"Partition:0\tOffset:2\tb:null,c:3\tk2\tbin\x00\xff",
        b"Partition:0\tOffset:3\tNO_HEADERS\tnull\tzstd-0",
        b"Partition:0\tOffset:4\tNO_HEADERS\tnull\tzstd-1",
        b"Partition:0\tOffset:5\tNO_HEADERS\tnull\tzstd-2",
        b"",
    ]
    assert done.stderr.decode().strip().endswith("Processed a total of 6 messages")


@pytest.mark.slow
def test_partition_offset_max_messages_and_timestamps(command: list[str], written: WrittenPartition) -> None:
    written.append([b"v%d" % i for i in range(10)], timestamp_ms=1000)
    done = run(command, "t", "--data-dir", written.data_dir, "--partition", "0", "--offset", "4",
               "--max-messages", "3", "--print-timestamp", "--key-separator", "|")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"CreateTime:1004|v4\nCreateTime:1005|v5\nCreateTime:1006|v6\n"
    config = Path(written.data_dir).parent / "appliance.toml"
    config.write_text(f'"log.dirs" = ["{written.data_dir}"]\n')
    by_config = run(command, "t", "--config", str(config), "--from-beginning", "--max-messages", "2")
    assert (by_config.returncode, by_config.stdout) == (0, b"v0\nv1\n"), by_config.stderr
    latest = run(command, "t", "--data-dir", written.data_dir, "--timeout-ms", "200")
    assert (latest.returncode, latest.stdout) == (0, b"")  # without --from-beginning: only new records
    assert b"Processed a total of 0 messages" in latest.stderr


def test_waits_for_new_records_and_stops_on_sigterm(command: list[str], written: WrittenPartition) -> None:
    written.append([b"old"])
    process = subprocess.Popen([*command, "t", "--data-dir", written.data_dir], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=REPO)
    assert process.stdout is not None
    try:
        # Append until the command (positioned at the end once it started) prints what it sees.
        appended: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            appended.append(b"new-%d" % len(appended))
            written.append([appended[-1]])
            if select.select([process.stdout], [], [], 0.2)[0]:
                break
        first = process.stdout.readline()
        process.send_signal(signal.SIGTERM)
        # read through the same buffered reader: readline may have buffered lines after the first
        # (communicate() would read the pipe beneath it and miss them)
        rest = process.stdout.read()
        assert process.stderr is not None
        err = process.stderr.read()
        process.wait(timeout=10)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()
    assert process.returncode == 0
    lines = (first + rest).splitlines()
    assert lines and lines == appended[appended.index(lines[0]) :][: len(lines)]
    assert b"old" not in lines
    assert f"Processed a total of {len(lines)} messages".encode() in err


def test_stopped_appliance_read_offline(command: list[str], written: WrittenPartition) -> None:
    written.append([b"on disk"])
    written.page.unlink()
    refused = run(command, "t", "--data-dir", written.data_dir, "--from-beginning", "--timeout-ms", "100")
    assert refused.returncode == 1 and b"not running" in refused.stderr
    done = run(command, "t", "--data-dir", written.data_dir, "--from-beginning", "--timeout-ms", "100",
               "--offline")
    assert (done.returncode, done.stdout) == (0, b"on disk\n")
    from ipc.state_page import StatePage

    written.page = StatePage.create(written.page_name)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["t", "--offset", "3"], 2, b"--offset needs --partition"),
        (["t", "--bootstrap-server", "h:1", "--data-dir", "/x"], 2, b"give one"),
        (["t", "--partition", "0", "--offset", "soon"], 2, b"expected a non-negative offset"),
        (["t", "--consumer-property", "fetch.min.byte=1"], 1, b"did you mean 'fetch.min.bytes'"),
        (["nope", "--data-dir", "{dir}"], 1, b"topic 'nope': no partition directory"),
        (["t", "--bootstrap-server", "127.0.0.1:{port}"], 1, b"cannot connect"),
    ],
)
def test_bad_arguments_and_failures(command: list[str], tmp_path: Path, args: list[str], code: int,
                                    message: bytes) -> None:
    args = [a.replace("{dir}", str(tmp_path)).replace("{port}", str(free_port())) for a in args]
    done = run(command, *args, "--timeout-ms", "100")
    assert done.returncode == code, done.stderr
    assert message in done.stderr


@pytest.mark.slow
def test_over_tcp_from_a_running_appliance(command: list[str], tmp_path: Path) -> None:
    appliance = start_appliance(tmp_path, {"cli": 2})
    try:
        from appliance.client.producer import Producer

        with Producer({"appliance.data.dir": appliance.data_dir}) as producer:
            for i in range(20):
                producer.send("cli", b"tcp-%d" % i, key=b"k%d" % i, partition=i % 2)
            producer.flush()
        done = run(command, "cli", "--bootstrap-server", appliance.bootstrap, "--from-beginning",
                   "--max-messages", "20", "--print-key", "--print-partition", "--print-offset")
        assert done.returncode == 0, done.stderr
        lines = sorted(done.stdout.decode().splitlines())
        assert lines == sorted(f"Partition:{i % 2}\tOffset:{i // 2}\tk{i}\ttcp-{i}" for i in range(20))
    finally:
        appliance.stop()
