"""The control socket's blocking client: how local processes ask the supervisor for topics, producer ids and
rings.

The protocol (message lines, request ids, the ops and the lifetime of a ring) is ``ipc.control_protocol``;
the reply types are ``ipc.control_types``.  Both are re-exported here, so ``from ipc.control import ...``
names everything a client needs.  :class:`ControlClient` sends one request and waits for its reply; its
non-blocking mode (:meth:`ControlClient.send`, :meth:`ControlClient.read`, ``ipc.control_nowait``) sends
requests without waiting and hands their replies, matched by ``"id"``, to callbacks when the socket is
readable -- the broker attaches rings that way, so that its loop never waits for the supervisor.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ipc.control_nowait import OwedReplies, Reply
from ipc.control_protocol import (
    MAX_LINE_BYTES,
    ControlError,
    LineDecoder,
    encode,
    error_response,
    ok_response,
    raise_for_error,
)
from ipc.control_types import (
    Attachment,
    ClusterMetadata,
    FollowerInfo,
    PartitionInfo,
    TopicInfo,
    attachment,
    topic_info,
)
from ipc.kafka.errors import ErrorCode
from storage.errors import ProtocolError, RequestTimeoutError

__all__ = [
    "MAX_LINE_BYTES",
    "Attachment",
    "ClusterMetadata",
    "ControlClient",
    "ControlError",
    "FollowerInfo",
    "LineDecoder",
    "PartitionInfo",
    "Reply",
    "TopicInfo",
    "attachment",
    "encode",
    "error_response",
    "ok_response",
    "raise_for_error",
    "topic_info",
]


DEFAULT_TIMEOUT_S: Final = 30.0


# -- the client ----------------------------------------------------------------------------------------------


class ControlClient:
    """A connection to the supervisor's control socket; one blocking request at a time (thread-safe), and
    any number of non-blocking ones (:meth:`send`, :meth:`read`: ``ipc.control_nowait``).

    Keep it open while you produce: closing it (or exiting) detaches every ring attached through it.
    """

    def __init__(self, sock: socket.socket, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = sock
        self._decoder = LineDecoder()
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._last_id = 0
        self.late_replies = 0  # replies that came after their request timed out, dropped
        self._nowait = OwedReplies()  # non-blocking requests sent, replies waiting for delivery

    @classmethod
    def connect(cls, path: str | os.PathLike[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ControlClient:
        """Connect to the control socket at ``path``.  ApplianceError (a ControlError) if no appliance
        answers there; PermissionError if the socket is not ours (see ``appliance.shm.group``)."""
        where = os.fspath(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout_s)
        try:
            sock.connect(where)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise ControlError(
                f"no appliance is listening on the control socket {where} ({exc.strerror}): start "
                "`appliance serve`, or point to its appliance.control.socket",
                ErrorCode.BROKER_NOT_AVAILABLE.name,
                int(ErrorCode.BROKER_NOT_AVAILABLE),
            ) from None
        except PermissionError:
            sock.close()
            raise PermissionError(
                f"control socket {where}: permission denied; run as the appliance's user or a member of "
                "appliance.shm.group"
            ) from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, where, timeout_s)

    # -- the ops -------------------------------------------------------------------------------------------

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterMetadata:
        """Topics (all, or those named; unknown names raise UnknownTopicOrPartitionError) and offsets."""
        request: dict[str, Any] = {"op": "metadata"}
        if topics is not None:
            request["topics"] = list(topics)
        reply = self.request(request)
        infos = (topic_info(raw) for raw in reply["topics"])
        return ClusterMetadata(
            instance_id=str(reply["instance_id"]),
            shm_prefix=str(reply["shm_prefix"]),
            node_id=int(reply["node_id"]),
            topics={info.name: info for info in infos},
        )

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        *,
        replication_factor: int | None = None,
        configs: Mapping[str, Any] | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
        internal: bool = False,
    ) -> TopicInfo:
        """Create a topic (defaults: num.partitions, default.replication.factor).  TopicExistsError if it
        exists; ConfigError for a bad name, count or setting.  Returns once every partition is served
        (``wait=False``: once the topic is recorded; its partitions start after).  RequestTimeoutError
        after ``timeout_s``: the creation goes on (or rolls back) in the supervisor.  ``internal``: one of
        the appliance's own topics (``__consumer_offsets``), whose name may begin with ``__``."""
        request: dict[str, Any] = {"op": "create_topic", "topic": name}
        if internal:
            request["internal"] = True
        if not wait:
            request["wait"] = False
        if partitions is not None:
            request["partitions"] = partitions
        if replication_factor is not None:
            request["replication_factor"] = replication_factor
        if configs:
            request["configs"] = dict(configs)
        return TopicInfo.from_json(self.request(request, timeout_s=timeout_s)["topic"])

    def delete_topic(self, name: str, *, timeout_s: float | None = None) -> None:
        """Delete a topic: its writers stop, its rings are detached, its logs removed."""
        self.request({"op": "delete_topic", "topic": name}, timeout_s=timeout_s)

    def alter_topic_configs(self, name: str, *, set_configs: Mapping[str, Any] | None = None,
                            delete: Sequence[str] = (), replace: bool = False,
                            validate_only: bool = False) -> dict[str, Any]:  # fmt: skip
        """Change a topic's settings (``replace``: the whole override set becomes ``set_configs``);
        ConfigError (INVALID_CONFIG) naming a bad key or value, nothing changed.  Returns the topic's
        overrides afterwards (or as they would be, ``validate_only``)."""
        request: dict[str, Any] = {"op": "alter_topic_configs", "topic": name, "set": dict(set_configs or {}),
                                   "delete": list(delete), "replace": replace, "validate_only": validate_only}
        return dict(self.request(request)["configs"])

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False,
                          assignments: Sequence[Sequence[int]] | None = None,
                          timeout_s: float | None = None) -> TopicInfo:  # fmt: skip
        """Grow a topic to ``count`` partitions; returns once they are served.  ConfigError
        (INVALID_PARTITIONS) unless ``count`` is larger than the current count.  ``assignments``: each new
        partition's replicas (INVALID_REPLICA_ASSIGNMENT unless one per new partition, naming this node)."""
        request: dict[str, Any] = {"op": "create_partitions", "topic": name, "count": count,
                                   "validate_only": validate_only}
        if assignments is not None:
            request["assignments"] = [list(nodes) for nodes in assignments]
        return TopicInfo.from_json(self.request(request, timeout_s=timeout_s)["topic"])

    def delete_records(self, name: str, partition: int, offset: int, *,
                       timeout_s: float | None = None) -> int:  # fmt: skip
        """Move the partition's log start offset to ``offset`` (at most its high watermark); returns the
        log start offset after it."""
        request = {"op": "delete_records", "topic": name, "partition": partition, "offset": offset}
        return int(self.request(request, timeout_s=timeout_s)["low_watermark"])

    def swap_cleaned(self, name: str, partition: int, groups: list[list[Any]], *,
                     timeout_s: float | None = None) -> None:
        """Have the partition's log owner swap, in one swap, each group's segment the cleaner wrote aside
        (``groups``: ``[base_offset, replaced, sizes]``, ``<base>.log.cleaned`` in for the closed segments
        ``replaced`` of ``sizes`` bytes; the cleaner process: ``appliance.server.clean_handoff``)."""
        self.request({"op": "swap_cleaned", "topic": name, "partition": partition, "groups": groups},
                     timeout_s=timeout_s)

    def init_producer_id(self) -> tuple[int, int]:
        """A new idempotent producer id and its epoch (0): unique for the life of this data dir."""
        reply = self.request({"op": "init_producer_id"})
        return int(reply["producer_id"]), int(reply["producer_epoch"])

    def attach(self, topic: str, partition: int, *, producer_id: int = -1,
               ring_bytes: int | None = None) -> Attachment:
        """A new ring to ``topic``-``partition``, served by its writer from now on.

        An unknown topic is created first when ``auto.create.topics.enable`` (default) allows it.
        ``producer_id`` is informational (logs, status).  ``ring_bytes``: the capacity wanted (default
        ``appliance.ring.initial.bytes``; at most ``appliance.ring.bytes``).
        """
        request: dict[str, Any] = {"op": "attach", "topic": topic, "partition": partition,
                                   "producer_id": producer_id}
        if ring_bytes is not None:
            request["ring_bytes"] = ring_bytes
        return attachment(topic, partition, self.request(request))

    def attach_many(
        self, partitions: Sequence[tuple[str, int]], *, producer_id: int = -1,
        ahead: Sequence[tuple[str, int]] = (),
    ) -> list[Attachment | ControlError]:
        """A new ring to each of ``partitions`` in one round trip: per partition, in order, its
        :class:`Attachment` or the error :meth:`attach` would have raised for it.  Those also in ``ahead``
        are attached ahead of need: their writers start at the first frame published (module docstring)."""
        reply = self.request({"op": "attach_many", "partitions": [[t, p] for t, p in partitions],
                              "producer_id": producer_id,
                              "ahead": [[t, p] for t, p in ahead]})  # fmt: skip
        results: list[Attachment | ControlError] = []
        for (topic, partition), raw in zip(partitions, reply["results"], strict=True):
            try:
                raise_for_error(raw)
                results.append(attachment(topic, partition, raw))
            except ControlError as exc:
                results.append(exc)
        return results

    def detach(self, ring: str | Attachment) -> None:
        """Have the writer drain what was published in ``ring``, then unlink it.  Returns at once."""
        name = ring.ring if isinstance(ring, Attachment) else ring
        self.request({"op": "detach", "ring": name})

    def detach_many(self, rings: Sequence[str]) -> None:
        """:meth:`detach` for each of ``rings``, in one round trip.  Returns at once."""
        self.request({"op": "detach_many", "rings": list(rings)})

    def status(self, *, memory: bool = False) -> dict[str, Any]:
        """The supervisor's view: pid, uptime, and every child (role, pid, restarts, unique memory as last
        measured, ``uss_age_s`` ago; ``memory=True``: measured now, milliseconds per child)."""
        return self.request({"op": "status", "memory": True} if memory else {"op": "status"})

    # -- the non-blocking mode (ipc.control_nowait) --------------------------------------------------------

    def send(self, message: Mapping[str, Any], on_reply: Reply) -> int:
        """Send one request without waiting for its reply; :meth:`read` hands the reply (or the
        ControlError it stands for) to ``on_reply`` later.  Returns the request's id.  A request is one
        short line: the write is a blocking ``sendall`` bounded by the client's timeout.  ControlError
        (BROKER_NOT_AVAILABLE) if the connection is closed or breaks now (``on_reply`` is then not called)."""
        with self._lock:
            sock = self._sock
            if sock is None:
                raise ControlError(f"control connection to {self.path} is closed",
                                   ErrorCode.BROKER_NOT_AVAILABLE.name, int(ErrorCode.BROKER_NOT_AVAILABLE))
            self._last_id += 1
            request_id = self._last_id
            try:
                sock.settimeout(max(self.timeout_s, 0.001))
                sock.sendall(encode({**message, "id": request_id}))
            except OSError as exc:  # a timeout too: the supervisor is not reading its socket
                self._close_locked()
                raise ControlError(f"control connection to {self.path} broke sending {message.get('op')!r}: "
                                   f"{exc or type(exc).__name__}", ErrorCode.BROKER_NOT_AVAILABLE.name,
                                   int(ErrorCode.BROKER_NOT_AVAILABLE)) from None  # fmt: skip
            self._nowait.owe(request_id, on_reply)
        return request_id

    def forget(self, request_id: int) -> None:
        """Stop waiting for a non-blocking request's reply: it is dropped when it comes."""
        with self._lock:
            self._nowait.forget(request_id)

    @property
    def owed(self) -> int:
        """Non-blocking requests sent and not answered yet."""
        return len(self._nowait)

    @property
    def arrived(self) -> int:
        """Replies to non-blocking requests already read, waiting for :meth:`read` to deliver them."""
        return self._nowait.arrived

    def read(self) -> int:
        """Take what arrived on the socket without blocking and hand each non-blocking request's reply to its
        callback (also those a blocking call read meanwhile); returns how many were delivered.  A lost
        connection closes the client and answers every request owed with ControlError
        (BROKER_NOT_AVAILABLE)."""
        with self._lock:
            sock = self._sock
            if sock is not None:
                sock.settimeout(0.0)  # a socket with a timeout waits for data even with MSG_DONTWAIT
            while sock is not None:
                try:
                    data = sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    self._close_locked()
                    break
                if not data:
                    self._close_locked()
                    break
                try:
                    replies = self._decoder.feed(data)
                except ProtocolError:
                    self._close_locked()
                    break
                for reply in replies:
                    self._sort_one(reply)  # no blocking call is waiting now
        return self._nowait.deliver()

    # -- plumbing ------------------------------------------------------------------------------------------

    def request(self, message: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request, return its successful reply; raise what a failed reply stands for.

        The request is numbered (``"id"``) and only the reply with that number answers it.
        RequestTimeoutError if it does not come in ``timeout_s`` (default: the client's): the connection
        stays usable, the operation may still complete in the supervisor, and its reply, when it comes, is
        dropped.  ControlError if the supervisor went away (then the connection is closed).
        """
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            sock = self._sock
            if sock is None:
                raise ControlError(
                    f"control connection to {self.path} is closed",
                    ErrorCode.BROKER_NOT_AVAILABLE.name,
                    int(ErrorCode.BROKER_NOT_AVAILABLE),
                )
            self._last_id += 1
            request_id = self._last_id
            try:
                sock.settimeout(max(wait_s, 0.001))
                sock.sendall(encode({**message, "id": request_id}))
                reply = self._receive_locked(sock, request_id, time.monotonic() + wait_s)
            except TimeoutError:
                raise RequestTimeoutError(
                    f"control request {message.get('op')!r} to {self.path}: no reply in {wait_s:g} s; the "
                    "operation may still complete (check before retrying)"
                ) from None
            except (BrokenPipeError, ConnectionResetError) as exc:
                self._close_locked()
                raise ControlError(
                    f"control connection to {self.path} broke: {exc}",
                    ErrorCode.BROKER_NOT_AVAILABLE.name,
                    int(ErrorCode.BROKER_NOT_AVAILABLE),
                ) from None
            except ProtocolError:
                self._close_locked()
                raise
        raise_for_error(reply)
        return reply

    def _receive_locked(self, sock: socket.socket, request_id: int, deadline_s: float) -> dict[str, Any]:
        """The reply numbered ``request_id``; replies to earlier requests that timed out are dropped.
        TimeoutError past ``deadline_s``."""
        while True:
            while self._pending:
                reply = self._pending.pop(0)
                if reply.get("id", request_id) == request_id:
                    self._sort_pending()
                    return reply
                self._sort_one(reply)
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                raise TimeoutError
            sock.settimeout(left_s)
            data = sock.recv(1 << 16)
            if not data:
                self._close_locked()
                raise ControlError(
                    f"the appliance closed the control connection {self.path} (stopping?)",
                    ErrorCode.BROKER_NOT_AVAILABLE.name,
                    int(ErrorCode.BROKER_NOT_AVAILABLE),
                )
            self._pending += self._decoder.feed(data)

    def _sort_pending(self) -> None:
        """The replies read after a blocking call's own: each is a non-blocking request's (queued for
        :meth:`read`) or a late one; none can be a later blocking call's, which is not sent yet."""
        pending, self._pending = self._pending, []
        for reply in pending:
            self._sort_one(reply)

    def _sort_one(self, reply: dict[str, Any]) -> None:
        """Queue a non-blocking request's reply for :meth:`read`; count any other as late (dropped)."""
        if not self._nowait.take(reply):
            self.late_replies += 1

    def fileno(self) -> int:
        """The socket's descriptor (readable with EOF when the supervisor stops)."""
        if self._sock is None:
            return -1
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """Close the connection: the supervisor detaches every ring attached through it."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            code = ErrorCode.BROKER_NOT_AVAILABLE
            self._nowait.fail_all(ControlError(
                f"control connection to {self.path} closed before the supervisor answered; the operation "
                "may have completed", code.name, int(code)))  # fmt: skip

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
