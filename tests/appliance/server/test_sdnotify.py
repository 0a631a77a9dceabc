"""sd_notify never blocks the supervisor: a receiver that stops reading costs dropped messages, not a hang."""

from __future__ import annotations

import pathlib
import socket
import threading

import pytest

from appliance.server import sdnotify


def test_a_receiver_that_does_not_read_drops_messages_instead_of_blocking(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        answers: list[bool] = []

        def ping() -> None:  # far more than the receiver's queue holds (net.unix.max_dgram_qlen, 512)
            for _ in range(2000):
                answers.append(sdnotify.watchdog())

        pinger = threading.Thread(target=ping, daemon=True)
        pinger.start()
        pinger.join(20)
        assert not pinger.is_alive(), f"notify blocked after {len(answers)} messages"
        assert answers[0] is True and False in answers
        receiver.setblocking(False)
        delivered = 0
        while True:
            try:
                assert receiver.recv(64) == b"WATCHDOG=1"
            except BlockingIOError:
                break
            delivered += 1
        assert delivered == answers.count(True)  # what was dropped never arrives; what was sent does
        receiver.setblocking(True)
        assert sdnotify.status("reading again") is True  # room again: sent
        assert receiver.recv(64) == b"STATUS=reading again"
