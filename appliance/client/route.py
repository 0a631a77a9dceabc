"""How the producer reaches partitions: a :class:`Route` hands out one :class:`BatchChannel` per partition.

The producer's accumulator, sequencing and ack handling do not care how a batch reaches its writer.  Two
routes implement the two protocols: :class:`LocalRoute`, the supervisor's control socket
(``appliance.control``) and one shared-memory ring per partition (``ipc.ring_publisher.RingPublisher``);
and ``appliance.client.tcp_route.TcpRoute`` over TCP to a broker (``bootstrap.servers``), whose channel
publishes a built batch in a Produce request and reports the response as the ring does, ``(batch, base
offset or -error code)`` in publish order.  A channel that cannot go on raises
:class:`~ipc.ring.RingFailedError` (a ring the writer failed) or :class:`ConnectionLostError` (a connection
that broke); the producer then takes what was answered and sends the rest again through a new channel.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from appliance.client.commit_channel import CommittedChannel
from ipc.control import Attachment, ControlClient, ControlError
from ipc.ring import RingFailedError, RingNames, warm_up
from ipc.ring_publisher import RingGrowth, RingPublisher
from ipc.state_page import StatePage
from storage.errors import ApplianceError, UnknownTopicOrPartitionError
from storage.record_checks import requires_keys

if TYPE_CHECKING:
    from appliance.client.accumulator import ProducerBatch

__all__ = ["ATTACH_AHEAD", "BatchChannel", "ConnectionLostError", "LocalRoute", "Route"]

# opening a channel attaches, in the same round trip, rings to this many more partitions of the topic
ATTACH_AHEAD = 32


class ConnectionLostError(RingFailedError):
    """A channel's connection broke, a request was not answered within ``request.timeout.ms``, or the
    partition's leader moved.  Answers that arrived were taken; the outcome of the requests still
    unanswered is unknown.  Open a new channel and send them again, in order, with the same sequence
    numbers (the broker recognises those it appended)."""


class BatchChannel(Protocol):
    """What the producer needs from one partition's path to its writer (a :class:`RingPublisher`)."""

    @property
    def name(self) -> str: ...

    track_acks: bool
    max_body_bytes: int
    in_flight: deque[tuple[int, ProducerBatch]]
    last_ack_ns: int  # monotonic ns of the last ack (or of the first frame published since)

    def publish_into(self, max_bytes: int, build: Callable[[np.ndarray], int], token: ProducerBatch, *,
                     timeout_ms: int | None = None) -> int: ...

    def poll(self) -> int: ...

    def wait_acked(self, seq: int, timeout_ms: float) -> bool: ...

    def take_completed(self) -> list[tuple[ProducerBatch, int]]: ...

    def abandon_in_flight(self) -> list[ProducerBatch]: ...

    def close(self) -> None: ...


class Route(Protocol):
    """How the producer finds partitions and opens channels to them: the local appliance (the supervisor's
    control socket and rings, :class:`LocalRoute`) or a broker over TCP (``TcpRoute``)."""

    def partitions_for(self, topic: str) -> tuple[int, int]:
        """(partition count, the topic's max.message.bytes); UnknownTopicOrPartitionError if none."""
        ...

    def init_producer_id(self) -> tuple[int, int]: ...

    def requires_keys(self, topic: str) -> bool:
        """Whether the producer must refuse ``topic``'s keyless records itself (a compacted topic reached
        through a path that does not check them: the rings)."""
        ...

    def open_channel(self, topic: str, partition: int, producer_id: int, *, track_acks: bool,
                     max_in_flight: int, max_block_ms: int, acks: int = 1) -> BatchChannel: ...

    def drop_channel(self, channel: BatchChannel) -> None: ...

    def storage_detail(self, topic: str, partition: int) -> tuple[str, str]:
        """The partition's log dir and what it has free, for a KAFKA_STORAGE_ERROR (``("", "")``: unknown).
        Cold path: asked once per batch failed with that error."""
        ...

    def alive(self) -> bool: ...

    def reconnect(self, timeout_ms: int) -> None: ...

    def close(self) -> None: ...


class LocalRoute:
    """The local appliance: the supervisor's control socket, one ring per partition.

    Opening the first channel of a topic attaches, in one ``attach_many`` round trip, the ring of its
    partition and of up to :data:`ATTACH_AHEAD` following partitions; the next channels take those
    attachments, so a first send to many partitions pays one round trip per :data:`ATTACH_AHEAD`
    partitions, not one each.  Rings attached ahead and never used are let go when the route closes.
    """

    def __init__(self, control_socket: str, *, timeout_ms: int) -> None:
        self.path = control_socket
        self.timeout_s = max(timeout_ms, 1) / 1000
        self.client = ControlClient.connect(control_socket, timeout_s=self.timeout_s)
        self._counts: dict[str, int] = {}  # topic -> partition count, as partitions_for found it
        self._compacted: dict[str, bool] = {}  # topic -> its cleanup.policy holds compact
        self._ahead: dict[tuple[str, int, int], Attachment] = {}  # (topic, partition, producer id)
        warm_up()  # the rings' numba kernels, loaded now so that the first frame does not pay for them

    def partitions_for(self, topic: str) -> tuple[int, int]:
        try:
            info = self.client.metadata([topic]).topics[topic]
        except UnknownTopicOrPartitionError:
            # attach creates the topic when the appliance's auto.create.topics.enable allows it
            attachment = self.client.attach(topic, 0)
            self.client.detach(attachment)
            info = self.client.metadata([topic]).topics[topic]
        if info.error:  # listed, but the supervisor cannot describe it now
            raise ApplianceError(f"topic {topic!r}: {info.error}: {info.message}")
        self._counts[topic] = info.partition_count
        self._compacted[topic] = requires_keys(info.cleanup_policy)
        return info.partition_count, info.max_message_bytes

    def requires_keys(self, topic: str) -> bool:
        """A compacted topic's records need keys; the writers append what the rings hold, so the producer
        checks (``storage.record_checks``), as the broker does for Produce requests."""
        if topic not in self._compacted:
            self.partitions_for(topic)
        return self._compacted[topic]

    def init_producer_id(self) -> tuple[int, int]:
        return self.client.init_producer_id()

    def storage_detail(self, topic: str, partition: int) -> tuple[str, str]:
        """The log dir of ``topic``-``partition`` (the supervisor's metadata) and its free bytes, measured
        here: the appliance is on this host."""
        try:
            info = self.client.metadata([topic]).topics[topic]
            (found,) = [p for p in info.partitions if p.partition == partition]
            directory = os.path.dirname(os.path.normpath(found.directory))
            st = os.statvfs(directory)
        except (ApplianceError, OSError, KeyError, ValueError):
            return "", ""
        return directory, f"{st.f_bavail * st.f_frsize} bytes free"

    def open_channel(self, topic: str, partition: int, producer_id: int, *, track_acks: bool,
                     max_in_flight: int, max_block_ms: int, acks: int = 1) -> BatchChannel:
        """A ring to the partition's writer; with ``acks=-1`` (all) wrapped so that a batch completes once
        the partition's high watermark passes it (``appliance.client.commit_channel``)."""
        attachment = self._attach(topic, partition, producer_id)
        try:
            publisher: RingPublisher[ProducerBatch] = RingPublisher.attach(
                attachment.names,
                topic=topic,
                partition=partition,
                max_block_ms=max_block_ms,
                track_acks=track_acks,
                max_in_flight=max_in_flight,
                growth=self._growth(topic, partition, producer_id, attachment),
            )
            if acks != -1:
                return publisher
            try:
                page = StatePage.attach(attachment.state_page)
            except BaseException:
                publisher.close()
                raise
            return CommittedChannel(publisher, page, lambda batch: batch.record_count)
        except BaseException:
            self.client.detach(attachment.ring)
            raise

    def _growth(self, topic: str, partition: int, producer_id: int, attachment: Attachment) -> RingGrowth:
        """How the partition's ring grows: a larger ring attached through this route's (current) control
        connection, the old one detached through it (``ipc.ring_publisher``, "Growing")."""

        def attach(capacity_bytes: int) -> RingNames:
            client = self.client
            return client.attach(topic, partition, producer_id=producer_id, ring_bytes=capacity_bytes).names

        def release(ring: str) -> None:
            if not self.client.closed:
                self.client.detach(ring)

        return RingGrowth(attach, release, attachment.ring_bytes_max or attachment.ring_bytes)

    def _attach(self, topic: str, partition: int, producer_id: int) -> Attachment:
        """The partition's ring: attached ahead earlier, or now with up to :data:`ATTACH_AHEAD` more."""
        found = self._ahead.pop((topic, partition, producer_id), None)
        if found is not None:
            return found
        count = self._counts.get(topic, 0)
        wanted = [(topic, partition)] + [
            (topic, p) for p in ((partition + i) % count for i in range(1, min(count, ATTACH_AHEAD + 1)))
            if p != partition and (topic, p, producer_id) not in self._ahead
        ]  # fmt: skip
        if len(wanted) == 1:
            return self.client.attach(topic, partition, producer_id=producer_id)
        results = self.client.attach_many(wanted, producer_id=producer_id, ahead=wanted[1:])
        for (_, p), result in zip(wanted[1:], results[1:], strict=True):
            if isinstance(result, Attachment):
                self._ahead[(topic, p, producer_id)] = result
        if isinstance(results[0], ControlError):
            raise results[0]
        return results[0]

    def drop_channel(self, channel: BatchChannel) -> None:
        channel.close()
        if not self.client.closed:
            self.client.detach(channel.name)

    def alive(self) -> bool:
        """False once the supervisor closed the control connection (it stopped or crashed)."""
        fd = self.client.fileno()
        if fd < 0:
            return False
        readable, _, _ = select.select([fd], [], [], 0)
        return not readable  # the supervisor never speaks unasked: readable means EOF

    def reconnect(self, timeout_ms: int) -> None:
        """The supervisor went away: wait (up to ``timeout_ms``) for one to listen on the socket again."""
        self.client.close()
        self._ahead.clear()  # rings of the old connection: the supervisor let them go
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                self.client = ControlClient.connect(self.path, timeout_s=self.timeout_s)
                return
            except ControlError as exc:
                if time.monotonic() >= deadline:
                    raise ControlError(
                        f"the appliance at {self.path} went away and did not come back within {timeout_ms} "
                        f"ms: {exc}", exc.error, exc.code,
                    ) from None
                time.sleep(0.05)

    def close(self) -> None:
        self._ahead.clear()  # unused rings: the supervisor lets go of a closed connection's rings
        self.client.close()
