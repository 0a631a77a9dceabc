"""The broker's :class:`~appliance.broker.cluster.Cluster` over the supervisor's control socket.

Two connections per broker process.  The first, a blocking :class:`~ipc.control.ControlClient`, opened at
start, is also the broker's *producer session*: the rings the broker attaches for Produce requests
(``appliance.broker.produce``) belong to it, so if the broker dies the supervisor has the writers drain what
the broker published and unlinks the rings -- nothing published is lost, nothing unpublished is appended.
Attaching and detaching rings goes over it without waiting (:meth:`ControlCluster.attach_later`,
:meth:`ControlCluster.detach_later`: the client's non-blocking mode, ``ipc.control_nowait``): its socket is
in the broker's selector while a reply is owed, and :meth:`ControlCluster.poll` hands the replies that came
to their callbacks (the first Produce to many partitions attaches all their rings in one ``attach_many``).
Its other calls are blocking round trips on a Unix socket, made on cold paths only (metadata refresh,
producer ids, growing a ring), each waiting at most :data:`REQUEST_TIMEOUT_S`; one that runs out of time
answers REQUEST_TIMED_OUT and its late reply is dropped by request id (``ipc.control``), so the connection
stays usable.

The second, a :class:`~appliance.broker.control_channel.ControlChannel`, carries topic creations and
deletions (:meth:`ControlCluster.submit`), which can take the supervisor seconds: nothing waits for them;
their replies are read from the broker's loop (:meth:`ControlCluster.poll`) and finish the
:class:`~appliance.broker.cluster.TopicChange` they answer.  It is opened at the first change.

**A lost connection comes back by itself.**  A connection found closed (the supervisor closed it, or it
broke) is reopened on a timer: first :data:`RECONNECT_MIN_S` after it was found lost, doubling up to
:data:`RECONNECT_MAX_S` while attempts fail (:meth:`ControlCluster.poll` returns when it is due, so the
broker's loop wakes for it; a call made in between tries too if the back-off allows).  Until it is back,
calls fail with a retriable error, as Kafka answers when its controller or a leader is unavailable:
REQUEST_TIMED_OUT for topic changes (a change owed when its connection was lost too: it may have happened),
LEADER_NOT_AVAILABLE for attaching a ring, COORDINATOR_NOT_AVAILABLE for producer ids; the broker keeps
serving fetches and metadata from its last picture.  Each new first connection is a new :attr:`session`:
the rings of the old one were drained and unlinked by the supervisor, so the broker's Produce drops them.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.broker.cluster import ClusterError, TopicChange
from appliance.broker.control_channel import ControlChannel
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import Config
from ipc.control import (
    Attachment,
    ControlClient,
    ControlError,
    TopicInfo,
    attachment,
    raise_for_error,
    topic_info,
)
from ipc.kafka import ErrorCode
from storage.errors import ApplianceError, RequestTimeoutError

log = logging.getLogger("appliance.broker")

__all__ = ["CONNECT_TIMEOUT_S", "RECONNECT_MAX_S", "RECONNECT_MIN_S", "REQUEST_TIMEOUT_S", "ControlCluster",
           "topic_meta"]  # fmt: skip

CONNECT_TIMEOUT_S = 10.0  # the supervisor starts the broker before or while it opens the control socket
REQUEST_TIMEOUT_S = 5.0  # a call blocks the broker's loop: give up (RequestTimeoutError) after this
RECONNECT_MIN_S = 0.1  # a lost control connection: the first reconnection attempt waits this long ...
RECONNECT_MAX_S = 5.0  # ... doubling while attempts fail, up to this


def topic_meta(info: TopicInfo) -> TopicMeta:
    """The broker's view of a topic the supervisor described: each partition's replicas as it lists them
    (in the order assigned), its leader the one it names."""
    if info.error:
        try:
            code = ErrorCode[info.error]
        except KeyError:
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        return TopicMeta(name=info.name, partitions=0, topic_id=info.topic_id, error=int(code),
                         error_message=info.message)
    replicas = {p.partition: p.replicas or info.replicas for p in info.partitions}
    replicas = {p: nodes for p, nodes in replicas.items() if len(nodes) > 1}
    return TopicMeta(
        name=info.name,
        partitions=info.partition_count,
        replication_factor=info.replication_factor,
        topic_id=info.topic_id,
        max_message_bytes=info.max_message_bytes,
        directories={p.partition: p.directory for p in info.partitions},
        state_pages={p.partition: p.state_page for p in info.partitions},
        replicas=replicas,
        leaders={p.partition: p.leader for p in info.partitions if p.partition in replicas},
        min_insync_replicas=info.min_insync_replicas,
        cleanup_policy=info.cleanup_policy,
        configs=dict(info.configs),
        offline={p.partition: p.offline for p in info.partitions if p.offline},
    )


def _cluster_error(e: ApplianceError, what: str, down: ErrorCode) -> ClusterError:
    """The ClusterError for what a call raised; ``down``: the retriable code while the connection is lost."""
    if isinstance(e, ControlError) and e.error == ErrorCode.BROKER_NOT_AVAILABLE.name:
        return ClusterError(f"{what}: {e}; the broker reconnects by itself: retry", down)
    if isinstance(e, ControlError):
        try:
            code = ErrorCode[e.error]
        except KeyError:
            code = ErrorCode.UNKNOWN_SERVER_ERROR
    elif isinstance(e, RequestTimeoutError):
        code = ErrorCode.REQUEST_TIMED_OUT
    else:
        code = ErrorCode.UNKNOWN_SERVER_ERROR
    return ClusterError(f"{what}: {e}", code)


@dataclass
class _Backoff:
    """When a lost connection may be tried again (module docstring)."""

    retry_at_s: float | None = None  # None: not lost (or not known lost)
    delay_s: float = RECONNECT_MIN_S

    def lost(self, now_s: float) -> None:
        """Found lost, or an attempt failed: the next attempt waits, longer each time."""
        self.retry_at_s = now_s + self.delay_s
        self.delay_s = min(self.delay_s * 2, RECONNECT_MAX_S)

    def due(self, now_s: float) -> bool:
        return self.retry_at_s is None or now_s >= self.retry_at_s

    def back(self) -> None:
        self.retry_at_s, self.delay_s = None, RECONNECT_MIN_S


class ControlCluster:
    """The supervisor, reached through two control connections (module docstring: which carries what,
    timeouts, reconnecting)."""

    def __init__(self, client: ControlClient, reconnect: Callable[[], ControlClient] | None = None) -> None:
        self.client = client
        self.session = 0  # numbers the first connections: a new one after each reconnect
        self._reconnect = reconnect
        self._client_backoff = _Backoff()
        self.channel: ControlChannel | None = None
        self._channel_backoff = _Backoff()
        self._owed: dict[TopicChange, int] = {}  # submitted changes -> their request id on the channel

    @classmethod
    def connect(
        cls,
        config: Config,
        *,
        timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> ControlCluster:
        """Connect to ``config.control_socket``, retrying for ``timeout_s`` while nobody listens yet."""
        path = config.control_socket

        def once() -> ControlClient:
            return ControlClient.connect(path, timeout_s=request_timeout_s)

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(once(), reconnect=once)
            except ControlError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _connected(self, what: str, down: ErrorCode) -> ControlClient:
        """The connection, reconnected if it was lost and the back-off allows; else ClusterError(down)."""
        if not self.client.closed:
            return self.client
        if self._reconnect is None or not self._reconnect_client(time.monotonic()):
            raise ClusterError(f"{what}: the control connection to the supervisor is down; the broker "
                               "reconnects by itself: retry", down)  # fmt: skip
        return self.client

    def _reconnect_client(self, now_s: float) -> bool:
        """Try to open a new first connection if the back-off allows; whether it is open now."""
        backoff = self._client_backoff
        if self._reconnect is None or not backoff.due(now_s):
            return False
        try:
            client = self._reconnect()
        except (ApplianceError, OSError) as e:
            backoff.lost(now_s)
            log.warning("cannot reconnect to the supervisor (%s); trying again in %.1f s", e,
                        (backoff.retry_at_s or now_s) - now_s)  # fmt: skip
            return False
        self.client.read()  # the old connection's owed calls learn it was lost
        self.client = client
        self.session += 1
        backoff.back()
        log.warning("control connection to the supervisor re-established (session %d)", self.session)
        return True

    def _channel(self, now_s: float) -> ControlChannel | None:
        """The second connection, opened (again) if it is not and the back-off allows; None if it cannot."""
        if self.channel is not None and not self.channel.closed:
            return self.channel
        backoff = self._channel_backoff
        if not backoff.due(now_s):
            return None
        lost_before = self.channel is not None
        try:
            self.channel = ControlChannel.connect(self.client.path)
        except (ApplianceError, OSError) as e:
            backoff.lost(now_s)
            log.warning("cannot open a control connection for topic changes (%s); trying again in %.1f s", e,
                        (backoff.retry_at_s or now_s) - now_s)  # fmt: skip
            return None
        backoff.back()
        if lost_before:
            log.warning("control connection to the supervisor re-established (topic changes)")
        return self.channel

    # -- topic changes, answered later --------------------------------------------------------------------

    def submit(self, change: TopicChange) -> None:
        """Send ``change`` over the second connection; :meth:`poll` finishes it (module docstring)."""
        channel = self._channel(time.monotonic())
        what, down = f"{change.op} topic {change.name!r}", ErrorCode.REQUEST_TIMED_OUT
        if channel is None:
            change.finish(ClusterError(f"{what}: the control connection to the supervisor is down; the "
                                       "broker reconnects by itself: retry", down))  # fmt: skip
            return

        def answered(reply: dict[str, Any] | ApplianceError) -> None:
            self._owed.pop(change, None)
            if isinstance(reply, ApplianceError):
                change.finish(_as_cluster_error(reply, what, down))
                return
            change.topic = _described(reply)
            change.finish(None)

        self._owed[change] = -1
        request_id = channel.send(_change_request(change), answered)
        if not change.done:
            self._owed[change] = request_id
        self._note_lost_channel()

    def withdraw(self, change: TopicChange) -> None:
        request_id = self._owed.pop(change, None)
        if request_id is not None and self.channel is not None:
            self.channel.forget(request_id)

    def selectables(self) -> tuple[socket.socket | ControlClient, ...]:
        """The second connection's socket, and the first while a reply to a non-blocking call is owed."""
        channel = self.channel
        found: list[socket.socket | ControlClient] = []
        if channel is not None and channel.sock is not None:
            found.append(channel.sock)
        if self.client.owed and not self.client.closed:
            found.append(self.client)
        return tuple(found)

    def poll(self, now_s: float) -> None:
        """Read both connections' replies; reopen a lost connection when due (module docstring)."""
        if self.client.owed or self.client.arrived:
            self.client.read()
        if self.channel is not None:
            self.channel.read()
            self._note_lost_channel(now_s)
        if self.client.closed:
            if self._client_backoff.retry_at_s is None:
                self._client_backoff.lost(now_s)
            self._reconnect_client(now_s)
        if self.channel is not None and self.channel.closed and self._channel_backoff.due(now_s):
            self._channel(now_s)

    def next_timer_s(self) -> float | None:
        """When a lost connection is to be reopened (0: now, it was just found lost); None: none is lost."""
        due = []
        if self.client.arrived:
            due.append(0.0)  # replies a blocking call read: deliver them now
        if self.client.closed and self._reconnect is not None:
            due.append(self._client_backoff.retry_at_s or 0.0)
        if self.channel is not None and self.channel.closed:
            due.append(self._channel_backoff.retry_at_s or 0.0)
        return min(due, default=None)

    def _note_lost_channel(self, now_s: float | None = None) -> None:
        """Start the back-off when the second connection was just found lost."""
        if self.channel is not None and self.channel.closed and self._channel_backoff.retry_at_s is None:
            self._channel_backoff.lost(time.monotonic() if now_s is None else now_s)

    def topics(self) -> Mapping[str, TopicMeta]:
        down = ErrorCode.REQUEST_TIMED_OUT
        try:
            metadata = self._connected("metadata", down).metadata()
        except ApplianceError as e:
            raise _as_cluster_error(e, "metadata", down) from None
        return {name: topic_meta(info) for name, info in metadata.topics.items()}

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        replication_factor: int | None,
        configs: Mapping[str, str],
        *,
        timeout_ms: int | None = None,
        internal: bool = False,
    ) -> TopicMeta:
        """Create a topic, waiting up to ``timeout_ms`` (None: :data:`REQUEST_TIMEOUT_S`) until every
        partition is served; ``timeout_ms <= 0``: until it is recorded (Kafka's "do not wait").
        ``internal``: the appliance's own topic (``__consumer_offsets``)."""
        what, down = f"create topic {name!r}", ErrorCode.REQUEST_TIMED_OUT
        wait = timeout_ms is None or timeout_ms > 0
        timeout_s = timeout_ms / 1000 if timeout_ms is not None and timeout_ms > 0 else None
        try:
            info = self._connected(what, down).create_topic(
                name, partitions, replication_factor=replication_factor, configs=configs or None, wait=wait,
                timeout_s=timeout_s, internal=internal,
            )  # fmt: skip
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None
        return topic_meta(info)

    def alter_topic_configs(self, name: str, set_configs: Mapping[str, str], delete: Sequence[str], *,
                            replace: bool, validate_only: bool) -> None:  # fmt: skip
        what, down = f"alter the settings of topic {name!r}", ErrorCode.REQUEST_TIMED_OUT
        try:
            self._connected(what, down).alter_topic_configs(
                name, set_configs=set_configs, delete=delete, replace=replace, validate_only=validate_only)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def create_partitions(self, name: str, count: int, *, validate_only: bool, timeout_ms: int,
                          assignments: tuple[tuple[int, ...], ...] | None = None) -> None:  # fmt: skip
        what, down = f"add partitions to topic {name!r}", ErrorCode.REQUEST_TIMED_OUT
        timeout_s = min(timeout_ms / 1000, REQUEST_TIMEOUT_S) if timeout_ms > 0 else REQUEST_TIMEOUT_S
        try:
            self._connected(what, down).create_partitions(name, count, validate_only=validate_only,
                                                          assignments=assignments,
                                                          timeout_s=timeout_s)  # fmt: skip
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def delete_records(self, topic: str, partition: int, offset: int, *, timeout_ms: int) -> int:
        what, down = f"delete records of {topic}-{partition}", ErrorCode.REQUEST_TIMED_OUT
        timeout_s = min(timeout_ms / 1000, REQUEST_TIMEOUT_S) if timeout_ms > 0 else REQUEST_TIMEOUT_S
        try:
            return self._connected(what, down).delete_records(topic, partition, offset, timeout_s=timeout_s)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def init_producer_id(self) -> tuple[int, int]:
        down = ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            return self._connected("init producer id", down).init_producer_id()
        except ApplianceError as e:
            raise _as_cluster_error(e, "init producer id", down) from None

    def attach(self, topic: str, partition: int, *, ring_bytes: int | None = None) -> Attachment:
        """A ring to the partition's writer, owned by this connection (for Produce)."""
        what, down = f"attach a ring to {topic}-{partition}", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            return self._connected(what, down).attach(topic, partition, ring_bytes=ring_bytes)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def attach_many(
        self, partitions: Sequence[tuple[str, int]], *, ahead: Sequence[tuple[str, int]] = ()
    ) -> list[Attachment | ClusterError]:
        """A ring to each partition's writer in one round trip: per partition its Attachment or error."""
        what, down = f"attach rings to {len(partitions)} partitions", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            results = self._connected(what, down).attach_many(partitions, ahead=ahead)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None
        return [r if isinstance(r, Attachment) else _as_cluster_error(r, f"attach a ring to {t}-{p}", down)
                for (t, p), r in zip(partitions, results, strict=True)]  # fmt: skip

    def attach_later(self, partitions: Sequence[tuple[str, int]], *, ahead: Sequence[tuple[str, int]] = (),
                     on_reply: Callable[[list[Attachment | ClusterError]], None]) -> None:  # fmt: skip
        """:meth:`attach_many` without waiting: ``on_reply`` gets, per partition, its Attachment or error,
        from :meth:`poll` (at once if the request cannot be sent: every partition gets the error)."""
        what, down = f"attach rings to {len(partitions)} partitions", ErrorCode.LEADER_NOT_AVAILABLE
        pairs = list(partitions)

        def answered(reply: dict[str, Any] | ControlError) -> None:
            if isinstance(reply, ControlError):
                on_reply([_as_cluster_error(reply, what, down)] * len(pairs))
                return
            on_reply(_attach_results(pairs, reply, down))

        try:
            self._connected(what, down).send({"op": "attach_many", "partitions": [[t, p] for t, p in pairs],
                                              "producer_id": -1, "ahead": [[t, p] for t, p in ahead]},
                                             answered)  # fmt: skip
        except ApplianceError as e:
            on_reply([_as_cluster_error(e, what, down)] * len(pairs))

    def topics_later(self, on_reply: Callable[[Mapping[str, TopicMeta] | ApplianceError], None]) -> None:
        """:meth:`topics` without waiting: ``on_reply`` gets the topic list or the error, from :meth:`poll`
        (at once if the request cannot be sent)."""
        down = ErrorCode.REQUEST_TIMED_OUT

        def answered(reply: dict[str, Any] | ControlError) -> None:
            if isinstance(reply, ControlError):
                on_reply(_as_cluster_error(reply, "metadata", down))
                return
            try:
                infos = [topic_info(raw) for raw in reply["topics"]]
            except (KeyError, TypeError) as e:
                on_reply(ClusterError(f"metadata: unreadable reply ({e!r})", ErrorCode.UNKNOWN_SERVER_ERROR))
                return
            on_reply({info.name: topic_meta(info) for info in infos})

        try:
            self._connected("metadata", down).send({"op": "metadata"}, answered)
        except ApplianceError as e:
            on_reply(_as_cluster_error(e, "metadata", down))

    def detach_later(self, rings: Sequence[str]) -> None:
        """:meth:`detach_many` without waiting: a refusal is logged when its reply comes."""
        what, down = f"detach {len(rings)} rings", ErrorCode.LEADER_NOT_AVAILABLE
        names = list(rings)

        def answered(reply: dict[str, Any] | ControlError) -> None:
            if isinstance(reply, ControlError):
                log.warning("detach rings %s: %s", ", ".join(names), reply)

        try:
            self._connected(what, down).send({"op": "detach_many", "rings": names}, answered)
        except ApplianceError as e:
            log.warning("detach rings %s: %s", ", ".join(names), e)

    def detach(self, ring: str) -> None:
        what, down = f"detach ring {ring}", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            self._connected(what, down).detach(ring)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def detach_many(self, rings: Sequence[str]) -> None:
        what, down = f"detach {len(rings)} rings", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            self._connected(what, down).detach_many(rings)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def close(self) -> None:
        self.client.close()
        if self.channel is not None:
            self.channel.close()


def _change_request(change: TopicChange) -> dict[str, Any]:
    """The control request for a topic change (``ipc.control``'s ``create_topic`` / ``delete_topic``)."""
    if change.op == "delete":
        return {"op": "delete_topic", "topic": change.name}
    request: dict[str, Any] = {"op": "create_topic", "topic": change.name}
    if change.timeout_ms <= 0:
        request["wait"] = False  # Kafka's "do not wait": answered once recorded
    if change.partitions is not None:
        request["partitions"] = change.partitions
    if change.replication_factor is not None:
        request["replication_factor"] = change.replication_factor
    if change.configs:
        request["configs"] = dict(change.configs)
    if change.replicas is not None:
        request["replicas"] = list(change.replicas)
    if change.assignments is not None:
        request["assignments"] = [list(r) for r in change.assignments]
    if change.internal:
        request["internal"] = True
    return request


def _attach_results(pairs: list[tuple[str, int]], reply: Mapping[str, Any],
                    down: ErrorCode) -> list[Attachment | ClusterError]:  # fmt: skip
    """Per partition of an ``attach_many`` reply, its Attachment or the error refusing it."""
    results: list[Attachment | ClusterError] = []
    raw_results = reply.get("results")
    if not isinstance(raw_results, list) or len(raw_results) != len(pairs):
        error = ClusterError(f"an attach_many reply without one result per partition: {reply!r:.200}",
                             ErrorCode.UNKNOWN_SERVER_ERROR)  # fmt: skip
        return [error] * len(pairs)
    for (topic, partition), raw in zip(pairs, raw_results, strict=True):
        try:
            raise_for_error(raw)
            results.append(attachment(topic, partition, raw))
        except ControlError as e:
            results.append(_as_cluster_error(e, f"attach a ring to {topic}-{partition}", down))
        except (KeyError, TypeError, ValueError) as e:
            results.append(ClusterError(f"attach a ring to {topic}-{partition}: unreadable reply ({e!r})",
                                        ErrorCode.UNKNOWN_SERVER_ERROR))  # fmt: skip
    return results


def _described(reply: Mapping[str, Any]) -> TopicMeta | None:
    """The topic a ``create_topic`` reply describes; None if it describes none."""
    raw = reply.get("topic")
    if not isinstance(raw, Mapping):
        return None
    try:
        return topic_meta(TopicInfo.from_json(raw))
    except (KeyError, TypeError, ValueError) as e:
        log.warning("a create_topic reply that describes no topic (%s): the broker refreshes its metadata", e)
        return None


def _as_cluster_error(e: ApplianceError, what: str, down: ErrorCode) -> ClusterError:
    return e if isinstance(e, ClusterError) else _cluster_error(e, what, down)
