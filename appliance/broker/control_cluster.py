"""The broker's :class:`~appliance.broker.cluster.Cluster` over the supervisor's control socket.

One :class:`~appliance.control.ControlClient` connection per broker process, opened at start and kept for
the process's life.  It is also the broker's *producer session*: the rings the broker attaches for Produce
requests (``appliance.broker.produce``) belong to this connection, so if the broker dies the supervisor has
the writers drain what the broker published and unlinks the rings -- nothing published is lost, nothing
unpublished is appended.

Calls are blocking request/response round trips on a Unix socket (~100 us); the broker makes them on cold
paths only (metadata refresh, topic creation and deletion, producer ids, attaching a ring).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from appliance.broker.cluster import ClusterError
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import Config
from ipc.control import Attachment, ControlClient, ControlError, TopicInfo
from ipc.kafka import ErrorCode
from storage.errors import ApplianceError, RequestTimeoutError

__all__ = ["CONNECT_TIMEOUT_S", "REQUEST_TIMEOUT_S", "ControlCluster", "topic_meta"]

CONNECT_TIMEOUT_S = 10.0  # the supervisor starts the broker before or while it opens the control socket
REQUEST_TIMEOUT_S = 5.0  # a call blocks the broker's loop: give up (RequestTimeoutError) after this


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


def _cluster_error(e: ApplianceError, what: str) -> ClusterError:
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
    """The supervisor, reached through a control connection (the broker's for its whole life)."""

    def __init__(self, client: ControlClient) -> None:
        self.client = client

    @classmethod
    def connect(
        cls,
        config: Config,
        *,
        timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> ControlCluster:
        """Connect to ``config.control_socket``, retrying for ``timeout_s`` while nobody listens yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(ControlClient.connect(config.control_socket, timeout_s=request_timeout_s))
            except ControlError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def topics(self) -> Mapping[str, TopicMeta]:
        try:
            metadata = self.client.metadata()
        except ApplianceError as e:
            raise _cluster_error(e, "metadata") from None
        return {name: topic_meta(info) for name, info in metadata.topics.items()}

    def create_topic(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, str]
    ) -> TopicMeta:
        try:
            info = self.client.create_topic(
                name, partitions, replication_factor=replication_factor, configs=configs or None
            )
        except ApplianceError as e:
            raise _cluster_error(e, f"create topic {name!r}") from None
        return topic_meta(info)

    def delete_topic(self, name: str) -> None:
        try:
            self.client.delete_topic(name)
        except ApplianceError as e:
            raise _cluster_error(e, f"delete topic {name!r}") from None

    def init_producer_id(self) -> tuple[int, int]:
        try:
            return self.client.init_producer_id()
        except ApplianceError as e:
            raise _cluster_error(e, "init producer id") from None

    def attach(self, topic: str, partition: int) -> Attachment:
        """A ring to the partition's writer, owned by this connection (for Produce)."""
        try:
            return self.client.attach(topic, partition)
        except ApplianceError as e:
            raise _cluster_error(e, f"attach a ring to {topic}-{partition}") from None

    def detach(self, ring: str) -> None:
        try:
            self.client.detach(ring)
        except ApplianceError as e:
            raise _cluster_error(e, f"detach ring {ring}") from None

    def close(self) -> None:
        self.client.close()
