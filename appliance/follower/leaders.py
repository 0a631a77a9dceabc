"""Where a replica's leader is: the Metadata of the candidate addresses, the highest leader epoch wins.

Theory of operation
-------------------
A replica is configured with one or more leader addresses (``appliance.replica.leader``: ``HOST:PORT`` for
TCP, a path for the leader's Unix listener).  Only a leader answers the Kafka protocol -- replicas do not
listen -- and each appliance's Metadata names itself as the only broker and the leader of every partition
it serves, with that partition's leader epoch, replicas and ISR.

:meth:`LeaderDirectory.refresh` asks every candidate address (one cached connection each, authenticated
with the cluster secret when there is one) for the Metadata of every topic, and keeps a
:class:`ClusterView`: per partition, the answer with the highest leader epoch among the brokers that lead
it.  So after a promotion the replicas find the new leader by themselves (its epoch is higher), and an old
leader that comes back without being told to follow (it then runs with a lower epoch) is ignored.  The
address used to reach a leader is the one it answered on (its advertised address may be a name this
host cannot resolve).

**One cluster.**  Every answer carries the leader's cluster id (``appliance.config.cluster_id``).  A
directory built without one (a replica on an empty directory) takes the first id a leader reports and
hands it to ``on_cluster_id`` to be stored; from then on, an address answering with another id is not a
leader to this replica: it is listed among the unreachable ones with an INCONSISTENT_CLUSTER_ID reason
(logged once), as Kafka refuses a broker whose ``meta.properties`` names another cluster.

The view is refreshed by the replica process every :data:`REFRESH_INTERVAL_MS` and, rate-limited to
:data:`MIN_REFRESH_INTERVAL_MS`, whenever a fetcher asks for its leader again after an error
(:meth:`LeaderDirectory.leader_for` is the fetchers' *leader source*).  It also gives the replica its
topics (those with a partition whose replicas include its ``node.id``: :class:`TopicView` keeps each
partition's replicas) and the last ISR its leader reported: what
``appliance replicas promote`` decides on.

**Topic settings.**  With a Metadata answer listing a topic it has no settings of, and at least every
:data:`CONFIGS_INTERVAL_MS`, the directory asks the same leader DescribeConfigs for the topics it listed
and keeps, per topic, the settings set on the topic itself (``config_source``
TOPIC_CONFIG: CreateTopics configs, AlterConfigs): :attr:`TopicView.configs`.  The replica records them in
its own ``topics.json`` (its cleaner reads ``cleanup.policy`` and the compaction settings there); a leader
that does not answer DescribeConfigs leaves them None (unknown: the replica keeps what it has).

Thread-safe: fetcher threads and the replica's main loop call it; one lock serialises the exchanges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ipc.kafka import (
    ConfigSource,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    ErrorCode,
    MetadataRequest,
    ResourceType,
)
from replicas.leader_connection import LeaderConnection, LeaderInfo
from storage.errors import ProtocolError, RequestTimeoutError

__all__ = [
    "MIN_REFRESH_INTERVAL_MS",
    "REFRESH_INTERVAL_MS",
    "ClusterView",
    "LeaderDirectory",
    "PartitionView",
    "TopicView",
    "parse_address",
]

REFRESH_INTERVAL_MS: Final = 500  # the replica's periodic refresh (new topics, the ISR, a new leader)
MIN_REFRESH_INTERVAL_MS: Final = 100  # a fetcher asking again after an error refreshes at most this often
CONFIGS_INTERVAL_MS: Final = 5000  # topic settings asked again this often (a new topic's at once)
CONNECT_TIMEOUT_MS: Final = 1000  # per candidate address: a dead host must not hold the refresh long
RETRY_DEAD_ADDRESS_MS: Final = 1000  # a candidate that failed is not asked again sooner
METADATA_TIMEOUT_MS: Final = 5000  # a Metadata answer (a cut network must not hold the fetchers' lookups)

_log = logging.getLogger("appliance.replica")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); a path (``/run/..``, or ``unix:PATH``) -> (path, 0): a Unix socket."""
    if text.startswith("unix:"):
        return text[5:], 0
    if text.startswith("/"):
        return text, 0
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    leader: LeaderInfo  # host/port: the address it answered on
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    partitions: int
    replicas: tuple[int, ...]  # every node holding some partition, in order of first mention
    configs: tuple[tuple[str, str], ...] | None = None  # the topic's own settings, sorted; None: unknown
    # each partition's replicas as the leader lists them (in the order assigned); (): ``replicas`` for all
    assignments: tuple[tuple[int, ...], ...] = ()

    def partition_replicas(self, partition: int) -> tuple[int, ...]:
        return self.assignments[partition] if self.assignments else self.replicas


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the leaders said at ``at_ms`` (the directory's clock)."""

    at_ms: int
    topics: dict[str, TopicView] = field(default_factory=dict)
    partitions: dict[tuple[str, int], PartitionView] = field(default_factory=dict)
    answered: tuple[str, ...] = ()  # the candidate addresses that answered


def _topic_view(name: str, assigned: dict[int, tuple[int, ...]],
                configs: tuple[tuple[str, str], ...] | None) -> TopicView:  # fmt: skip
    """A topic from its partitions' replica lists (``assigned``: partition -> replicas)."""
    ordered = [assigned.get(index, ()) for index in range(len(assigned))]
    nodes = tuple(dict.fromkeys(node for replicas in ordered for node in replicas))
    same = all(replicas == ordered[0] for replicas in ordered)
    return TopicView(name, len(ordered), ordered[0] if same and ordered else nodes, configs,
                     () if same else tuple(ordered))


class LeaderDirectory:
    """The candidate leaders of one replica and the latest :class:`ClusterView`.  See the module doc."""

    def __init__(self, addresses: Sequence[str], *, node_id: int, sasl_plain: tuple[str, str] | None,
                 timeout_ms: int = 5000, clock_ms: Callable[[], int] | None = None,
                 cluster_id: str | None = None,
                 on_cluster_id: Callable[[str], None] | None = None) -> None:  # fmt: skip
        """``cluster_id``: the replica's stored cluster id (None: take the leader's; ``on_cluster_id``
        stores it)."""
        if not addresses:
            raise ValueError("a replica needs at least one leader address")
        self.cluster_id = cluster_id
        self._on_cluster_id = on_cluster_id
        self.addresses = tuple(addresses)
        self.node_id = node_id
        self.sasl_plain = sasl_plain
        self.timeout_ms = timeout_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._connections: dict[str, LeaderConnection] = {}
        self._dead_until: dict[str, int] = {}
        self._last_error: dict[str, str] = {}
        self._view: ClusterView | None = None
        self._refreshed_ms = -(10**12)
        self._silent_since_ms: int | None = None
        self._closed = False
        self._configs: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {}  # by address, by topic
        self._configs_ms: dict[str, int] = {}  # by address: when they were last asked

    @property
    def view(self) -> ClusterView | None:
        return self._view

    def errors(self) -> dict[str, str]:
        """Why each unreachable candidate failed (last time asked)."""
        return dict(self._last_error)

    @property
    def silent_since_ms(self) -> int | None:
        """When the first refresh that nobody answered began (after the last answered one); None while the
        leaders answer.  With :attr:`view`'s ``at_ms`` it bounds how stale the last ISR seen can be."""
        return self._silent_since_ms

    # -- asking ---------------------------------------------------------------------------------------------

    def refresh(self) -> ClusterView | None:
        """Ask every candidate now; the new view (None if nobody answered: the old view is kept)."""
        with self._lock:
            return self._refresh_locked()

    def leader_for(self, topic: str, partition: int) -> LeaderInfo | None:
        """A fetcher's leader source: the partition's leader in the freshest view (refreshed if it is older
        than :data:`MIN_REFRESH_INTERVAL_MS`)."""
        with self._lock:
            if self._clock_ms() - self._refreshed_ms >= MIN_REFRESH_INTERVAL_MS:
                self._refresh_locked()
            view = self._view
        if view is None:
            return None
        found = view.partitions.get((topic, partition))
        return None if found is None else found.leader

    def _refresh_locked(self) -> ClusterView | None:
        if self._closed:
            return None
        now = self._clock_ms()
        self._refreshed_ms = now
        best: dict[tuple[str, int], PartitionView] = {}
        topics: dict[str, tuple[int, TopicView]] = {}
        answered = []
        for address in self.addresses:
            if self._dead_until.get(address, 0) > now:
                continue
            answer = self._metadata(address)
            if answer is None or not self._same_cluster(address, answer.cluster_id):
                continue
            answered.append(address)
            configs = self._known_configs(address, [t.name for t in answer.topics
                                                    if t.error_code == ErrorCode.NONE], now)
            brokers = {b.node_id for b in answer.brokers}
            host, port = parse_address(address)
            for t in answer.topics:
                if t.error_code != ErrorCode.NONE:
                    continue
                top_epoch = -1
                assigned = {p.partition_index: tuple(p.replica_nodes) for p in t.partitions}
                for p in t.partitions:
                    if p.error_code != ErrorCode.NONE or p.leader_id not in brokers:
                        continue
                    if p.leader_id == self.node_id:
                        continue  # ourselves (a stale view of a node that was promoted): not a leader to us
                    info = LeaderInfo(host, port, p.leader_id, p.leader_epoch)
                    key = (t.name, p.partition_index)
                    known = best.get(key)
                    if known is None or p.leader_epoch > known.leader.leader_epoch:
                        best[key] = PartitionView(t.name, p.partition_index, info, tuple(p.replica_nodes),
                                                  tuple(p.isr_nodes))
                    top_epoch = max(top_epoch, p.leader_epoch)
                if top_epoch < 0:
                    continue
                previous = topics.get(t.name)
                if previous is None or top_epoch > previous[0]:
                    topics[t.name] = (top_epoch, _topic_view(t.name, assigned, configs.get(t.name)))
        if not answered:
            if self._silent_since_ms is None:
                self._silent_since_ms = now
            return None
        view = ClusterView(now, {name: tv for name, (_, tv) in topics.items()}, best, tuple(answered))
        self._view = view
        self._silent_since_ms = None
        return view

    def _same_cluster(self, address: str, cluster_id: str | None) -> bool:
        """Whether ``address`` answered as a leader of this replica's cluster (module docstring)."""
        if not cluster_id or cluster_id == self.cluster_id:
            return True
        if self.cluster_id is None:
            self.cluster_id = cluster_id
            _log.info("replica %d: joining cluster %s (the id its leader %s reports)", self.node_id,
                      cluster_id, address)  # fmt: skip
            if self._on_cluster_id is not None:
                self._on_cluster_id(cluster_id)
            return True
        why = (f"INCONSISTENT_CLUSTER_ID: {address} reports cluster id {cluster_id!r} but this node belongs "
               f"to cluster {self.cluster_id!r} (its meta/meta.properties); it does not follow a leader of "
               "another cluster: point appliance.replica.leader at this cluster's leader, or start this "
               "node on an empty directory to join that cluster")
        if self._last_error.get(address) != why:
            _log.error("replica %d: %s", self.node_id, why)
        self._last_error[address] = why
        return False

    def _metadata(self, address: str) -> Any:
        conn = self._connections.get(address)
        try:
            if conn is None or conn.closed:
                host, port = parse_address(address)
                conn = LeaderConnection.connect(host, port, client_id=f"appliance-replica-{self.node_id}",
                                                timeout_ms=min(self.timeout_ms, CONNECT_TIMEOUT_MS),
                                                sasl_plain=self.sasl_plain)
                conn.timeout_ms = min(self.timeout_ms, METADATA_TIMEOUT_MS)
                self._connections[address] = conn
            answer = conn.request(MetadataRequest(topics=None, allow_auto_topic_creation=False))
        except (OSError, ProtocolError, RequestTimeoutError) as error:
            why = f"{type(error).__name__}: {error}"
            if self._last_error.get(address) != why:
                _log.info("leader candidate %s does not answer: %s", address, why)
            self._last_error[address] = why
            self._dead_until[address] = self._clock_ms() + RETRY_DEAD_ADDRESS_MS
            dropped = self._connections.pop(address, None)
            if dropped is not None:
                dropped.close()
            return None
        if address in self._last_error:
            _log.info("leader candidate %s answers again", address)
            del self._last_error[address]
        self._dead_until.pop(address, None)
        return answer

    def _known_configs(self, address: str, names: list[str],
                       now: int) -> dict[str, tuple[tuple[str, str], ...]]:
        """The settings of the topics ``names`` as ``address`` last reported them, asked again when
        :data:`CONFIGS_INTERVAL_MS` has passed or a topic is new to it."""
        known = self._configs.get(address, {})
        if now - self._configs_ms.get(address, -(10**12)) >= CONFIGS_INTERVAL_MS or any(
                name not in known for name in names):
            known = self._topic_configs(address, names)
            self._configs[address] = known
            self._configs_ms[address] = now
        return known

    def _topic_configs(self, address: str, names: list[str]) -> dict[str, tuple[tuple[str, str], ...]]:
        """The settings set on each of the topics ``names`` (DescribeConfigs on the connection Metadata just
        used); a topic whose answer failed, or every topic if the exchange failed, is left out."""
        conn = self._connections.get(address)
        if conn is None or not names:
            return {}
        request = DescribeConfigsRequest(
            resources=[DescribeConfigsResource(ResourceType.TOPIC, name, None) for name in names],
            include_synonyms=False, include_documentation=False)
        try:
            answer = conn.request(request)
        except (OSError, ProtocolError, RequestTimeoutError) as error:
            _log.debug("leader candidate %s: DescribeConfigs failed: %s", address, error)
            return {}
        out: dict[str, tuple[tuple[str, str], ...]] = {}
        for result in answer.results:
            if result.error_code == ErrorCode.NONE:
                out[result.resource_name] = tuple(sorted(
                    (c.name, c.value) for c in result.configs
                    if c.config_source == ConfigSource.TOPIC_CONFIG and c.value is not None))
        return out

    def close(self) -> None:
        """Close every connection; wake a thread blocked in an exchange."""
        self._closed = True
        for conn in list(self._connections.values()):
            conn.shutdown()
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
