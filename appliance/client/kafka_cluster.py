"""A client's view of the brokers behind ``bootstrap.servers``: who they are, who leads what, connections.

Theory of operation
-------------------
Every Kafka-protocol client here starts the same way: connect to the first bootstrap server that answers,
ask Metadata, and from then on talk to each partition's *leader* at the address Metadata advertised for it.
:class:`KafkaCluster` is that piece, once, for the topics admin (``appliance.client.admin``) and the
producer's TCP route (``appliance.client.tcp_route``):

* :meth:`KafkaCluster.any_connection` -- a live connection for requests any broker answers (Metadata,
  CreateTopics, InitProducerId): the bootstrap connection, reconnected through the bootstrap list in order
  when it broke;
* :meth:`KafkaCluster.metadata` -- a Metadata request whose answer also refreshes :attr:`brokers` (node id
  -> advertised address) and :attr:`leaders` ((topic, partition) -> node id, -1 while a partition has none);
* :meth:`KafkaCluster.connection_to` -- one shared connection per broker (requests and answers in order:
  the admin pipelines its describe requests on it); :meth:`KafkaCluster.open_connection` -- a new one the
  caller owns (the producer gives each partition its own, so that a partition's answers come in the order
  of its requests and a broken connection costs only its own partition a resend).

A broker's address is what it advertises; an empty host means "the host you reached me at".  Connection
errors are :class:`~ipc.kafka_client.BrokerConnectionError` naming every server tried.  Not
thread-safe: the caller serialises.
"""

from __future__ import annotations

from collections.abc import Sequence

from ipc.kafka import MetadataRequest, MetadataRequestTopic, MetadataResponse
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.errors import ApplianceError

__all__ = ["DEFAULT_BOOTSTRAP_SERVER", "KafkaCluster"]

DEFAULT_BOOTSTRAP_SERVER = "127.0.0.1:9092"


class KafkaCluster:
    """The brokers behind ``bootstrap_servers`` (``"host:port,host:port"``); see the module docstring."""

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVER,
        *,
        client_id: str = "log-appliance",
        connect_timeout_ms: int = 10_000,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.bootstrap = parse_bootstrap_servers(bootstrap_servers)  # ValueError for a bad entry
        self.client_id = client_id
        self.connect_timeout_ms = connect_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.brokers: dict[int, tuple[str, int]] = {}  # node id -> advertised (host, port)
        self.leaders: dict[tuple[str, int], int] = {}  # (topic, partition) -> leader node id (-1: none)
        self.partition_counts: dict[str, int] = {}
        self._any: KafkaConnection | None = None
        self._shared: dict[tuple[str, int], KafkaConnection] = {}

    @classmethod
    def reached(cls, bootstrap_servers: str, *, client_id: str, connect_timeout_ms: int,
                request_timeout_ms: int) -> KafkaCluster:
        """The cluster, with its bootstrap connection made now: fails at once if no bootstrap server
        answers (what an admin client wants before its first request)."""
        cluster = cls(bootstrap_servers, client_id=client_id, connect_timeout_ms=connect_timeout_ms,
                      request_timeout_ms=request_timeout_ms)
        cluster.any_connection()
        return cluster

    # -- connections -----------------------------------------------------------------------------------------

    def connect(self, host: str, port: int) -> KafkaConnection:
        """A new connection (versions negotiated) that the caller owns."""
        return KafkaConnection(
            host,
            port,
            client_id=self.client_id,
            connect_timeout_ms=self.connect_timeout_ms,
            request_timeout_ms=self.request_timeout_ms,
        )

    def any_connection(self) -> KafkaConnection:
        """The bootstrap connection, (re)connected to the first bootstrap server that answers."""
        if self._any is not None and not self._any.closed:
            return self._any
        failures = []
        for host, port in self.bootstrap:
            try:
                self._any = self.connect(host, port)
                return self._any
            except ApplianceError as exc:  # refused, timed out, or not speaking Kafka's protocol
                failures.append(str(exc))
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(failures))

    def bootstrap_alive(self) -> bool:
        """False if the bootstrap connection is closed, or its broker closed it (a broker never speaks
        unasked: a readable idle socket is at its end)."""
        conn = self._any
        if conn is None or conn.closed:
            return False
        if conn.in_flight:
            return True
        try:
            return not conn.wait_readable(0)
        except (OSError, ValueError, ApplianceError):
            return False

    def address_of(self, node_id: int) -> tuple[str, int]:
        """The advertised address of a broker Metadata named (ApplianceError for one it did not)."""
        address = self.brokers.get(node_id)
        if address is None:
            raise ApplianceError(
                f"broker node {node_id} is not among those the cluster at {self.bootstrap_servers} "
                f"advertises ({sorted(self.brokers)})"
            )
        return address

    def connection_to(self, node_id: int) -> KafkaConnection:
        """The shared connection to broker ``node_id`` (made on first use, again after it broke)."""
        address = self.address_of(node_id)
        conn = self._shared.get(address)
        if conn is None or conn.closed:
            conn = self._shared[address] = self.connect(*address)
        return conn

    def open_connection(self, node_id: int) -> KafkaConnection:
        """A new connection to broker ``node_id`` that the caller owns (and closes)."""
        return self.connect(*self.address_of(node_id))

    # -- metadata --------------------------------------------------------------------------------------------

    def metadata(self, topics: Sequence[str] | None, *, auto_create: bool = False) -> MetadataResponse:
        """Metadata for ``topics`` (None: every topic); refreshes :attr:`brokers`, :attr:`leaders` and
        :attr:`partition_counts` from the answer.  Topic errors are left in the answer for the caller."""
        conn = self.any_connection()
        request = MetadataRequest(
            topics=None if topics is None else [MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=auto_create,
        )
        response: MetadataResponse = conn.request(request)
        self.brokers = {b.node_id: (b.host or conn.host, b.port) for b in response.brokers}
        for topic in response.topics:
            if topic.error_code != 0 or not topic.partitions:
                continue
            self.partition_counts[topic.name] = len(topic.partitions)
            for part in topic.partitions:
                self.leaders[(topic.name, part.partition_index)] = part.leader_id
        return response

    # -- lifetime --------------------------------------------------------------------------------------------

    def close(self) -> None:
        for conn in [self._any, *self._shared.values()]:
            if conn is not None:
                conn.close()
        self._any = None
        self._shared.clear()

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap_servers!r}, {len(self.brokers)} brokers known)"
