"""The writer's end of its command channel: the socketpair the supervisor talks to a writer over.

JSON lines (``ipc.control.encode``) each way::

    supervisor -> writer   {"op": "attach", "ring": ..., "space": ..., "doorbell": ...}   serve this ring
                           {"op": "detach", "ring": ...}    drain what is published, then let it go
                           {"op": "stop", "timeout_ms": N}  drain every ring, close the log, exit 0
                           ("idle": true: the partition has no producer; logged at debug level)
                           {"op": "run_timers"}             retention and producer-id expiry now
                           {"op": "reload_config", "log_config": {...}, "retention_enabled": B}
                                                            the topic's settings changed: reopen the log
                                                            with them (between rounds; nothing is lost)
                           {"op": "delete_records", "id": N, "offset": O}   DeleteRecords: move the
                                                            log start offset to O (at most the high
                                                            watermark), publish it
                           {"op": "swap_cleaned", "id": N, "groups": [[B, [replaced...], [sizes...]],
                            ...]}                           swap the segments the cleaner wrote aside in
    writer -> supervisor   {"op": "detached", "ring": ...}  the ring may be unlinked now
                           {"op": "timers_done"}            after run_timers
                           {"op": "records_deleted", "id": N, "ok": B, "low_watermark": L, ...}
                           {"op": "cleaned_swapped", "id": N, "ok": B, ...}
                           {"op": "next_due", "in_ms": N}   at a stop: when the log next needs a writer
                                                            with no producer (null: not without one;
                                                            ``appliance.server.writer_timers``)

After writing a command the supervisor rings the partition's doorbell, so a sleeping writer reacts at once;
the writer reads its commands between drain rounds (:meth:`WriterChannel.receive` never blocks).  A channel
that reaches EOF means the supervisor died: the writer stops as if told to.
"""

from __future__ import annotations

import logging
import select
import socket
from typing import Any

from ipc.control import LineDecoder, encode
from storage.errors import ProtocolError

__all__ = ["WriterChannel"]

_log = logging.getLogger("appliance.writer")


class WriterChannel:
    """One writer's socket to the supervisor (``None``: a writer run without one, as in tests)."""

    def __init__(self, name: str, sock: socket.socket | None) -> None:
        self.name = name
        self._sock = sock
        self._decoder = LineDecoder()
        self._poll = select.poll()
        if sock is not None:
            self._poll.register(sock, select.POLLIN)

    @property
    def open(self) -> bool:
        return self._sock is not None

    def readable(self) -> bool:
        """A command (or the EOF) is waiting."""
        return self._sock is not None and bool(self._poll.poll(0))

    def receive(self) -> list[dict[str, Any]] | None:
        """Every command waiting now ([] when none); None once the supervisor's end has closed (the channel
        is closed with it, and later calls answer [])."""
        sock = self._sock
        commands: list[dict[str, Any]] = []
        while sock is not None:
            try:
                data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                _log.warning("writer %s: the supervisor's channel closed; stopping", self.name)
                self._poll.unregister(sock)
                self._sock = None
                return None
            try:
                commands.extend(self._decoder.feed(data))
            except ProtocolError as exc:  # the supervisor is ours: a bug, not an attack
                raise ProtocolError(f"writer {self.name}: bad command from the supervisor: {exc}") from None
        return commands

    def send(self, message: dict[str, Any]) -> None:
        """Tell the supervisor ``message``; a supervisor gone is logged, not raised (the writer stops)."""
        if self._sock is None:
            return
        try:
            self._sock.sendall(encode(message))
        except OSError as exc:
            _log.warning("writer %s: cannot tell the supervisor %s: %s", self.name, message, exc)
