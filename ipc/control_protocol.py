"""The control socket's protocol, sans-IO: message lines, the response helpers and the errors they stand for.

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
                     ``replicas`` (the topic's nodes),          once recorded (partitions start after)
                     ``assignments`` (each partition's
                     replicas), ``wait``, ``internal`` opt.
``delete_topic``     ``topic``                                  (nothing)
``alter_topic_       ``topic``; ``set`` (settings), ``delete``  ``configs``: the topic's overrides after
configs``            (names), ``replace``, ``validate_only``    (``appliance.server.topic_admin``)
``create_partitions`` ``topic``, ``count``; ``validate_only``,  ``topic`` (as in ``metadata``), once the new
                     ``assignments`` (each new partition's      partitions are served
                     replicas) opt.
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

This module is the protocol, sans-IO (:func:`encode`, :class:`LineDecoder`, the response helpers and
:func:`raise_for_error`).  What a reply describes is ``ipc.control_types``; the blocking client
(:class:`~ipc.control.ControlClient`), used by the Producer, the broker and the CLI, is ``ipc.control``, its
non-blocking mode ``ipc.control_nowait``; the server side is ``ipc.control_server``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ipc.kafka.errors import ErrorCode
from storage.errors import (
    ApplianceError,
    ConfigError,
    KafkaStorageError,
    PartitionOfflineError,
    ProtocolError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = ["MAX_LINE_BYTES", "ControlError", "LineDecoder", "encode", "error_response", "ok_response",
           "raise_for_error"]  # fmt: skip

MAX_LINE_BYTES: Final = 64 << 20  # a metadata reply (~300 B a partition) for 200,000 partitions fits


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
