"""systemd integration: sd_notify messages on a real NOTIFY_SOCKET, and the unit, sysusers and tmpfiles files
checked by systemd's own tools."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from appliance.config.server_config import load_config
from appliance.server import sdnotify

REPO = pathlib.Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "systemd"
APPLIANCE_SCRIPT = pathlib.Path(sys.executable).with_name("appliance")

# systemd-analyze, systemd-sysusers and systemd-tmpfiles come with Debian's `systemd` package.
NEEDS_SYSTEMD = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing: `apt-get install systemd` (the Debian package 'systemd' has it)",
)


# -------------------------------------------------------------------------------------- sd_notify


@pytest.fixture
def notify_socket(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket listening where $NOTIFY_SOCKET points, as systemd's would."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_messages_arrive_as_systemd_expects(notify_socket: socket.socket) -> None:
    assert sdnotify.ready() is True
    assert received(notify_socket) == "READY=1"
    assert sdnotify.ready("serving 3 partitions")
    assert received(notify_socket) == "READY=1\nSTATUS=serving 3 partitions"
    assert sdnotify.status("recovering orders-2: 40%")
    assert received(notify_socket) == "STATUS=recovering orders-2: 40%"
    assert sdnotify.watchdog()
    assert received(notify_socket) == "WATCHDOG=1"
    assert sdnotify.extend_timeout(90)
    assert received(notify_socket) == "EXTEND_TIMEOUT_USEC=90000000"
    assert sdnotify.stopping()
    assert received(notify_socket) == "STOPPING=1"
    assert sdnotify.stopping("draining rings")
    assert received(notify_socket) == "STOPPING=1\nSTATUS=draining rings"


def test_a_status_cannot_inject_other_assignments(notify_socket: socket.socket) -> None:
    sdnotify.status("bad topic\nREADY=1\x00")
    assert received(notify_socket) == "STATUS=bad topic READY=1 "


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"log-appliance-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.watchdog()
        assert received(sock) == "WATCHDOG=1"


def test_without_systemd_every_call_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    calls = [sdnotify.ready("x"), sdnotify.status("x"), sdnotify.watchdog(), sdnotify.stopping()]
    assert calls == [False] * 4


def test_a_socket_that_is_gone_raises(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):
        sdnotify.ready()
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    with pytest.raises(OSError, match="neither an absolute path nor an abstract @name"):
        sdnotify.ready()


def test_a_child_process_notifies_and_forgets(notify_socket: socket.socket) -> None:
    """A separate process (as the supervisor under systemd) reaches the socket; after forget() it does not."""
    code = (
        "from appliance.server import sdnotify\n"
        "assert sdnotify.ready('up')\n"
        "sdnotify.forget()\n"
        "assert not sdnotify.stopping()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
    assert received(notify_socket) == "READY=1\nSTATUS=up"
    notify_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):
        notify_socket.recv(4096)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "{pid}"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    env = {key: value.format(pid=os.getpid()) for key, value in environ.items()}
    assert sdnotify.watchdog_interval_s(env) == expected


def test_watchdog_interval_in_a_child_with_its_pid(tmp_path: pathlib.Path) -> None:
    code = "import os\nfrom appliance.server import sdnotify\nprint(sdnotify.watchdog_interval_s())\n"
    env = {**os.environ, "WATCHDOG_USEC": "4000000"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "WATCHDOG_PID": "1"}, cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "None"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "2.0"


# -------------------------------------------------------------------------------------- the unit


def unit_setting(unit: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", unit, flags=re.MULTILINE)


def test_unit_settings_the_service_relies_on() -> None:
    unit = (SYSTEMD / "appliance.service").read_text()
    expected = {
        "Type": ["notify"], "WatchdogSec": ["30"], "Restart": ["on-failure"], "User": ["log-appliance"],
        "Group": ["log-appliance"], "StateDirectory": ["log-appliance"], "LimitNOFILE": ["1048576"],
        "ProtectSystem": ["strict"], "ReadWritePaths": ["/var/lib/log-appliance"], "PrivateTmp": ["yes"],
        "NoNewPrivileges": ["yes"], "ProtectHome": ["yes"], "KillMode": ["mixed"],
        "ExecStart": ["/usr/local/bin/appliance serve --config /etc/log-appliance/appliance.toml"],
    }
    assert {key: unit_setting(unit, key) for key in expected} == expected
    # Settings that would break POSIX shared memory shared with producers, or numba's compiled code.
    for key in ("PrivateDevices", "PrivateIPC", "MemoryDenyWriteExecute", "PrivateUsers"):
        assert unit_setting(unit, key) in ([], ["no"]), key
    # The drain budget of the default configuration fits in TimeoutStopSec.
    stop_s = int(unit_setting(unit, "TimeoutStopSec")[0])
    assert load_config().shutdown_timeout_ms / 1000 < stop_s


@NEEDS_SYSTEMD
def test_systemd_analyze_verify_passes(tmp_path: pathlib.Path) -> None:
    """verify fails on a missing executable: check a copy whose ExecStart is this venv's real `appliance`."""
    assert os.access(APPLIANCE_SCRIPT, os.X_OK), f"{APPLIANCE_SCRIPT} missing: run `make install`"
    unit = (SYSTEMD / "appliance.service").read_text()
    copy = tmp_path / "appliance.service"
    copy.write_text(unit.replace("ExecStart=/usr/local/bin/appliance ", f"ExecStart={APPLIANCE_SCRIPT} "))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                            capture_output=True, text=True, timeout=120)
    ours = [line for line in (result.stdout + result.stderr).splitlines() if "appliance.service" in line]
    assert result.returncode == 0, result.stdout + result.stderr
    assert ours == []  # no warning about our unit: unknown keys, bad values...


@NEEDS_SYSTEMD
def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: pathlib.Path) -> None:
    """The check above can fail: the shipped ExecStart path does not exist on a build machine."""
    copy = tmp_path / "appliance.service"
    copy.write_text((SYSTEMD / "appliance.service").read_text().replace(
        "ExecStart=/usr/local/bin/appliance ", f"ExecStart={tmp_path}/no-such-appliance "))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "is not executable" in result.stderr


@NEEDS_SYSTEMD
def test_security_exposure_stays_low(tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "appliance.service"
    copy.write_text((SYSTEMD / "appliance.service").read_text().replace(
        "ExecStart=/usr/local/bin/appliance ", f"ExecStart={APPLIANCE_SCRIPT} "))
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(copy)],
                            capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for appliance.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5  # systemd rates < 3 "OK"; an unhardened service scores 9.6


@NEEDS_SYSTEMD
@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles must be root to give directories to a user")
def test_sysusers_and_tmpfiles_create_the_user_and_directories(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    subprocess.run(["systemd-sysusers", f"--root={root}", str(SYSTEMD / "appliance.sysusers")],
                   check=True, capture_output=True, timeout=60)
    passwd = (root / "etc" / "passwd").read_text().splitlines()
    user = next(line.split(":") for line in passwd if line.startswith("log-appliance:"))
    assert user[5] == "/var/lib/log-appliance"
    assert user[6].endswith("nologin")
    uid, gid = int(user[2]), int(user[3])
    assert uid < 1000  # a system user

    subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create", str(SYSTEMD / "appliance.tmpfiles")],
                   check=True, capture_output=True, timeout=60)
    for path in ("var/lib/log-appliance", "var/cache/log-appliance", "run/log-appliance"):
        st = (root / path).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, 0o750), path
    assert (root / "etc/log-appliance").stat().st_mode & 0o7777 == 0o755


def test_unit_directories_match_the_example_config() -> None:
    """The example config keeps its data and sockets where the unit lets the service write."""
    unit = (SYSTEMD / "appliance.service").read_text()
    config = load_config(SYSTEMD / "appliance.toml")
    writable = ["/var/lib/" + d for d in unit_setting(unit, "StateDirectory")]
    writable += ["/run/" + d for d in unit_setting(unit, "RuntimeDirectory")]
    writable += unit_setting(unit, "ReadWritePaths")
    for path in (*config.log_dirs, config.control_socket, config.unix_listener):
        assert path is not None
        assert any(path == w or path.startswith(w + "/") for w in writable), path


@NEEDS_SYSTEMD
def test_the_documented_second_instance_unit_verifies(tmp_path: pathlib.Path) -> None:
    """docs/operations.md derives a second unit with sed: run that very command and check what it makes."""
    doc = (REPO / "docs" / "operations.md").read_text()
    pattern = r"^(sed -e .*?systemd/appliance\.service) \| sudo tee \S+$"
    match = re.search(pattern, doc, flags=re.MULTILINE | re.DOTALL)
    assert match, "the sed command is gone from docs/operations.md"
    second = subprocess.run(["bash", "-c", match.group(1)], cwd=REPO, capture_output=True, text=True,
                            check=True, timeout=60).stdout
    settings = {key: unit_setting(second, key) for key in (
        "User", "StateDirectory", "RuntimeDirectory", "CacheDirectory", "WorkingDirectory", "ReadWritePaths",
        "ExecStart", "Environment")}
    assert settings == {
        "User": ["log-appliance"], "StateDirectory": ["log-appliance-b"],
        "RuntimeDirectory": ["log-appliance-b"], "CacheDirectory": ["log-appliance-b"],
        "WorkingDirectory": ["/var/lib/log-appliance-b"], "ReadWritePaths": ["/var/lib/log-appliance-b"],
        "ExecStart": ["/usr/local/bin/appliance serve --config /etc/log-appliance/b.toml"],
        "Environment": ["NUMBA_CACHE_DIR=/var/cache/log-appliance-b/numba", "PYTHONUNBUFFERED=1"],
    }
    copy = tmp_path / "log-appliance-b.service"
    copy.write_text(second.replace("ExecStart=/usr/local/bin/appliance ", f"ExecStart={APPLIANCE_SCRIPT} "))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
