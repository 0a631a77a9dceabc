"""The control socket: how local processes ask the supervisor for topics, producer ids and rings.

Theory of operation
-------------------
The supervisor listens on a Unix stream socket (``appliance.control.socket``, default
``<first log dir>/.appliance.sock``), mode 0600 (0660 with ``appliance.shm.group``), so only the service's
user (and that group) can attach.  A message is one JSON object on one line (UTF-8, ``\\n``-terminated, at
most :data:`MAX_LINE_BYTES`); the client sends a request, the server answers with exactly one response, in
order.  A request may carry an ``"id"`` (an integer); its reply then carries the same ``"id"``, so a client
that gave up waiting for a reply recognises it when it comes late and drops it (:meth:`ControlClient.request`
numbers every request): a slow operation never desynchronises the connection.  A long operation (creating a
topic of many partitions) is answered when it is done, and the supervisor answers the connection's later
requests meanwhile: replies then come in the order operations finish, matched by ``"id"``.  Requests carry
``"op"``; responses carry ``"ok"``, and on failure a Kafka error name and code::

    -> {"op": "attach", "topic": "orders", "partition": 3, "producer_id": 17}
    <- {"ok": true, "ring": "/la-...-ring-orders-3-5", "space": "...", "doorbell": "...", ...}
    -> {"op": "attach", "topic": "nope", "partition": 0}
    <- {"ok": false, "error": "UNKNOWN_TOPIC_OR_PARTITION", "code": 3, "message": "topic 'nope' ..."}

Ops (fields; the reply's fields):

==================== ========================================== ===========================================
``metadata``         ``topics`` (list, optional: all)           ``instance_id``, ``shm_prefix``, ``node_id``,
                                                                ``topics`` (partitions, state page names,
                                                                offsets, writer pid and unique memory)
``create_topic``     ``topic``; ``partitions``,                 ``topic`` (as in ``metadata``), once every
                     ``replication_factor``, ``configs``,       partition is served; with ``"wait": false``
                     ``wait``, ``internal`` opt.                once recorded (partitions start after)
``delete_topic``     ``topic``                                  (nothing)
``alter_topic_       ``topic``; ``set`` (settings), ``delete``  ``configs``: the topic's overrides after
configs``            (names), ``replace``, ``validate_only``    (``appliance.server.topic_admin``)
``create_partitions`` ``topic``, ``count``; ``validate_only``   ``topic`` (as in ``metadata``), once the new
                                                                partitions are served
``delete_records``   ``topic``, ``partition``, ``offset``       ``low_watermark``: the new log start offset,
                                                                once the partition's writer moved it
``swap_cleaned``     ``topic``, ``partition``, ``groups``: a    (nothing), once the cleaned segments are
                     list of [``base_offset``, ``replaced``,    swapped in, in one swap, by the log's
                     ``sizes``] (the cleaner)                   owner
``init_producer_id`` (none)                                     ``producer_id``, ``producer_epoch``
``attach``           ``topic``, ``partition``, ``producer_id``, ring, semaphore and state page names, sizes
                     ``ring_bytes`` (opt.: the capacity wanted) (``ring_bytes``, ``ring_bytes_max``)
``attach_many``      ``partitions`` (a list of pairs            ``results``: one ``attach`` reply (or error
                     [topic, partition]), ``producer_id``;      reply) per partition, in order
                     ``ahead`` (opt.: those of the pairs
                     attached ahead of need)
``detach``           ``ring``                                   (nothing)
``detach_many``      ``rings`` (a list of ring names)           (nothing)
``status``           ``memory`` (bool, opt.: measure every      supervisor pid, uptime, every child (its
                     child's memory now)                        unique memory, ``uss_age_s`` old)
``replica_status``   (none)                                     ``role`` ("leader" or "replica"),
                                                                ``node_id``, ``partitions`` (replication
                                                                state; see ``appliance.cli.replica``)
``promote``          ``partitions`` (list, or "all"),           a replica only: the partitions it leads
                     ``unclean`` (bool)                         next; then it becomes ``appliance serve``
==================== ========================================== ===========================================

**Lifetime of a ring.**  ``attach`` creates a new ring for this connection and hands it to the partition's
writer, of ``appliance.ring.initial.bytes`` or the ``ring_bytes`` asked for (at most ``appliance.ring.bytes``,
the reply's ``ring_bytes_max``): a producer whose ring is too small attaches a larger one to the same
partition, drains the old one and detaches it (``ipc.ring_publisher``, "Growing").  The client keeps its
connection open for as long as it produces: when the connection closes (the producer closed, exited or was
killed), the supervisor has the writers drain what was *published* in that connection's rings, then unlinks
them.  A published frame of a dead producer is appended; an unpublished one
never is (see ``ipc/ring.py``).  ``detach`` does the same for one ring while the connection stays open (after
a :class:`~ipc.ring.RingFailedError`, before attaching a new ring); ``detach_many`` for many rings in one
round trip.  A ring ``attach_many`` attached *ahead* (a producer expects to write the partition soon, and
saves the round trip then) does not start the partition's writer: the writer is started when a frame is
published into it (``ipc.ring_setup``, ``wake_on_first_frame``), and a ring detached with nothing
published is unlinked without one.

This module is the protocol, sans-IO (:func:`encode`, :class:`LineDecoder`, the response helpers), and the
blocking client (:class:`ControlClient`) used by the Producer, the broker and the CLI; what its replies
become (topics, partitions, attachments) is ``ipc.control_types``, re-exported here.  The server side is
``ipc.control_server``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

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
from storage.errors import (
    ApplianceError,
    ConfigError,
    KafkaStorageError,
    PartitionOfflineError,
    ProtocolError,
    RequestTimeoutError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "MAX_LINE_BYTES",
    "Attachment",
    "ClusterMetadata",
    "ControlClient",
    "ControlError",
    "FollowerInfo",
    "LineDecoder",
    "PartitionInfo",
    "TopicInfo",
    "encode",
    "error_response",
    "ok_response",
    "raise_for_error",
]

MAX_LINE_BYTES: Final = 64 << 20  # a metadata reply (~300 B a partition) for 200,000 partitions fits
DEFAULT_TIMEOUT_S: Final = 30.0


# -- the protocol, sans-IO -----------------------------------------------------------------------------------


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line: compact JSON, ASCII only, ``\\n``-terminated."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


class LineDecoder:
    """Split a byte stream into messages.  :meth:`feed` returns the complete ones, keeps the rest.

    Raises :class:`ProtocolError` for a line that is not a JSON object or longer than ``max_line_bytes``;
    the stream is then unusable (close the connection).
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete line held back."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end < 0:
                break
            if end - start > self.max_line_bytes:
                raise ProtocolError(f"control message of {end - start} bytes, over {self.max_line_bytes}")
            messages.append(_decode_line(bytes(self._buffer[start:end])))
            start = end + 1
        del self._buffer[:start]
        if len(self._buffer) > self.max_line_bytes:
            raise ProtocolError(f"control message longer than {self.max_line_bytes} bytes without a newline")
        return messages


def _decode_line(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"control message is not UTF-8 JSON: {exc}; line starts {line[:60]!r}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"control message is a JSON {type(message).__name__}, expected an object")
    return message


def ok_response(**fields: Any) -> dict[str, Any]:
    return {"ok": True, **fields}


def error_response(code: ErrorCode, message: str, **fields: Any) -> dict[str, Any]:
    return {"ok": False, "error": code.name, "code": int(code), "message": message, **fields}


class ControlError(ApplianceError):
    """The supervisor refused a control request; ``error`` is the Kafka error name, ``code`` its number."""

    def __init__(self, message: str, error: str = "UNKNOWN_SERVER_ERROR", code: int = -1) -> None:
        super().__init__(message)
        self.error = error
        self.code = code


class _UnknownTopic(UnknownTopicOrPartitionError, ControlError):
    pass


class _BadConfig(ConfigError, ControlError):
    pass


class _TopicExists(TopicExistsError, ControlError):
    pass


class _Offline(PartitionOfflineError, ControlError):
    pass


class _Storage(KafkaStorageError, ControlError):
    def __init__(self, message: str, error: str, code: int) -> None:
        KafkaStorageError.__init__(self, message)
        self.error = error
        self.code = code


_CONFIG_ERRORS = frozenset(
    {
        ErrorCode.INVALID_TOPIC_EXCEPTION.name,
        ErrorCode.INVALID_PARTITIONS.name,
        ErrorCode.INVALID_REPLICATION_FACTOR.name,
        ErrorCode.INVALID_CONFIG.name,
        ErrorCode.INVALID_REQUEST.name,
        ErrorCode.TOPIC_DELETION_DISABLED.name,
    }
)


def raise_for_error(response: Mapping[str, Any]) -> None:
    """Raise the exception a failed response stands for (nothing for ``"ok": true``).

    UNKNOWN_TOPIC_OR_PARTITION raises an :class:`UnknownTopicOrPartitionError`, TOPIC_ALREADY_EXISTS a
    :class:`appliance.server.metadata.TopicExistsError`, invalid requests a :class:`ConfigError`,
    KAFKA_STORAGE_ERROR a :class:`PartitionOfflineError` when the reply says ``"offline": true`` (``attach``
    to an offline partition), else a :class:`KafkaStorageError` (a file system error); all of them are also
    :class:`ControlError` carrying the error name and code. """
    if response.get("ok") is True:
        return
    name = str(response.get("error", "UNKNOWN_SERVER_ERROR"))
    code = response.get("code", -1)
    message = str(response.get("message", "the supervisor refused the request"))
    code = code if isinstance(code, int) else -1
    if name == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name:
        raise _UnknownTopic(message, name, code)
    if name == ErrorCode.TOPIC_ALREADY_EXISTS.name:
        raise _TopicExists(message, name, code)
    if name in _CONFIG_ERRORS:
        raise _BadConfig(message, name, code)
    if name == ErrorCode.KAFKA_STORAGE_ERROR.name:
        if response.get("offline") is True:
            raise _Offline(message, name, code)
        raise _Storage(message, name, code)
    raise ControlError(message, name, code)


# -- the client ----------------------------------------------------------------------------------------------


class ControlClient:
    """A connection to the supervisor's control socket; one request at a time (thread-safe).

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
                    return reply
                self.late_replies += 1
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

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
