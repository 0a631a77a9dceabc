"""The broker's :class:`~appliance.broker.cluster.Cluster` over the supervisor's control socket.

One :class:`~appliance.control.ControlClient` connection per broker process, opened at start and kept for
the process's life.  It is also the broker's *producer session*: the rings the broker attaches for Produce
requests (``appliance.broker.produce``) belong to this connection, so if the broker dies the supervisor has
the writers drain what the broker published and unlinks the rings -- nothing published is lost, nothing
unpublished is appended.

Calls are blocking request/response round trips on a Unix socket; the broker makes them on cold paths only
(metadata refresh, topic creation and deletion, producer ids, attaching rings: the first Produce to many
partitions attaches all their rings in one ``attach_many``).  A call waits :data:`REQUEST_TIMEOUT_S`, or for
CreateTopics and DeleteTopics the request's ``timeout_ms``; a call that runs out of time answers
REQUEST_TIMED_OUT and the operation goes on in the supervisor (its late reply is dropped by request id,
``ipc.control``), so the connection stays usable.

**A lost connection comes back by itself.**  When the connection is found closed (the supervisor closed it,
or it broke), the next call reconnects, at most every :data:`RECONNECT_MIN_S` doubling up to
:data:`RECONNECT_MAX_S` while it fails.  Until it is back, calls fail with a retriable error, as Kafka
answers when its controller or a leader is unavailable: REQUEST_TIMED_OUT for topic changes,
LEADER_NOT_AVAILABLE for attaching a ring, COORDINATOR_NOT_AVAILABLE for producer ids; the broker keeps
serving fetches and metadata from its last picture.  Each new connection is a new :attr:`session`: the
rings of the old one were drained and unlinked by the supervisor, so the broker's Produce drops them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from appliance.broker.cluster import ClusterError
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import Config
from ipc.control import Attachment, ControlClient, ControlError, TopicInfo
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
    """The broker's view of a topic the supervisor described (replicas leader first, as it lists them)."""
    if info.error:
        try:
            code = ErrorCode[info.error]
        except KeyError:
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        return TopicMeta(name=info.name, partitions=0, topic_id=info.topic_id, error=int(code),
                         error_message=info.message)
    replicas = {p.partition: info.replicas for p in info.partitions} if len(info.replicas) > 1 else {}
    return TopicMeta(
        name=info.name,
        partitions=info.partition_count,
        replication_factor=info.replication_factor,
        topic_id=info.topic_id,
        max_message_bytes=info.max_message_bytes,
        directories={p.partition: p.directory for p in info.partitions},
        state_pages={p.partition: p.state_page for p in info.partitions},
        replicas=replicas,
        min_insync_replicas=info.min_insync_replicas,
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


class ControlCluster:
    """The supervisor, reached through a control connection (module docstring: timeouts, reconnecting)."""

    def __init__(self, client: ControlClient, reconnect: Callable[[], ControlClient] | None = None) -> None:
        self.client = client
        self.session = 0  # numbers the connections: a new one after each reconnect
        self._reconnect = reconnect
        self._retry_at_s = 0.0
        self._backoff_s = RECONNECT_MIN_S

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
        now = time.monotonic()
        if self._reconnect is None or now < self._retry_at_s:
            raise ClusterError(f"{what}: the control connection to the supervisor is down; the broker "
                               "reconnects by itself: retry", down)  # fmt: skip
        try:
            client = self._reconnect()
        except (ApplianceError, OSError) as e:
            self._retry_at_s = now + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, RECONNECT_MAX_S)
            raise ClusterError(f"{what}: cannot reconnect to the supervisor ({e}); retry", down) from None
        self.client = client
        self.session += 1
        self._backoff_s = RECONNECT_MIN_S
        log.warning("control connection to the supervisor re-established (session %d)", self.session)
        return client

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
    ) -> TopicMeta:
        """Create a topic, waiting up to ``timeout_ms`` (None: :data:`REQUEST_TIMEOUT_S`) until every
        partition is served; ``timeout_ms <= 0``: until it is recorded (Kafka's "do not wait")."""
        what, down = f"create topic {name!r}", ErrorCode.REQUEST_TIMED_OUT
        wait = timeout_ms is None or timeout_ms > 0
        timeout_s = timeout_ms / 1000 if timeout_ms is not None and timeout_ms > 0 else None
        try:
            info = self._connected(what, down).create_topic(
                name, partitions, replication_factor=replication_factor, configs=configs or None, wait=wait,
                timeout_s=timeout_s,
            )  # fmt: skip
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None
        return topic_meta(info)

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        what, down = f"delete topic {name!r}", ErrorCode.REQUEST_TIMED_OUT
        timeout_s = timeout_ms / 1000 if timeout_ms is not None and timeout_ms > 0 else None
        try:
            self._connected(what, down).delete_topic(name, timeout_s=timeout_s)
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

    def attach_many(self, partitions: Sequence[tuple[str, int]]) -> list[Attachment | ClusterError]:
        """A ring to each partition's writer in one round trip: per partition its Attachment or error."""
        what, down = f"attach rings to {len(partitions)} partitions", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            results = self._connected(what, down).attach_many(partitions)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None
        return [r if isinstance(r, Attachment) else _as_cluster_error(r, f"attach a ring to {t}-{p}", down)
                for (t, p), r in zip(partitions, results, strict=True)]  # fmt: skip

    def detach(self, ring: str) -> None:
        what, down = f"detach ring {ring}", ErrorCode.LEADER_NOT_AVAILABLE
        try:
            self._connected(what, down).detach(ring)
        except ApplianceError as e:
            raise _as_cluster_error(e, what, down) from None

    def close(self) -> None:
        self.client.close()


def _as_cluster_error(e: ApplianceError, what: str, down: ErrorCode) -> ClusterError:
    return e if isinstance(e, ClusterError) else _cluster_error(e, what, down)
