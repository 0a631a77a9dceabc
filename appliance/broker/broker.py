"""The broker: the Kafka protocol on TCP and on a Unix socket, one thread, one ``selectors`` loop.

Theory of operation
-------------------
``appliance serve`` (the supervisor) forks the broker as a child process (``appliance.broker.process``).
The broker owns no data: it reads partition logs read-only (``storage.log_reader``), reads offsets from the
partition state pages (``ipc.state_page``), hands produced batches to the partition writers through their
rings (``appliance.broker.produce``), and asks the supervisor about topics and producer ids
(``appliance.broker.cluster``).  So it can be killed and restarted at any moment without losing anything.

**Why one thread and selectors.**  On a 2-core machine the work that matters -- moving record bytes --
happens in the kernel (``sendfile``), so the broker's Python only decides *what* to send.  One epoll loop
over non-blocking sockets keeps that decision cheap: no thread switches, no locks, no asyncio task objects
per request.  Nothing in the loop blocks except short control-socket calls to the supervisor (producer ids,
the topic list when a request needs it now, growing a ring: docs/architecture.md lists them), which are
rare.  Creating and deleting topics can take the supervisor
seconds: those requests are held (``appliance.broker.topic_requests``) and their answers read from the loop;
so are the Produce requests whose partitions' rings are being attached (``appliance.broker.produce``).

**A turn of the loop.**  ``select`` returns ready sockets: a listener accepts new connections; a connection
is read (one ``recv``), its complete frames are handled in order while it may handle more (see
``appliance.broker.connection``: one parked request at a time per connection, back-pressure on unsent
bytes), and its queued response bytes are sent when it is writable.  Then held requests are polled: Fetch
requests waiting for records (``appliance.broker.fetch_session``), Produce requests waiting for the
partition writer's acknowledgement, and CreateTopics / DeleteTopics requests waiting for the supervisor.
JoinGroup and SyncGroup requests held by the group coordinator are answered when another member's request
releases them or when the coordinator's timer is due (``appliance.broker.group_requests``); the loop sleeps
no longer than that timer.

**Waiting for the supervisor.**  Topic changes go to the supervisor over a control connection of their own
(``appliance.broker.control_cluster``), ring attaches and detaches over the first one without waiting; the
sockets with replies owed are in the selector (``Cluster.selectables``, swapped when reopened): when one is
readable, or when the cluster's timer is due (reopening a lost connection with back-off, or replies a
blocking call read meanwhile), the loop calls ``Cluster.poll``, which finishes the changes answered and hands
the attach answers to the produce service (used in the same turn: held batches are published, in order);
then the held topic requests whose changes are all answered, or whose ``timeout_ms`` ran out, are answered.
Their connections are parked meanwhile (nothing behind such a request is handled, as Kafka mutes a
connection with a request in progress); every other connection is served.

**Waking on the writers' news.**  The offsets a held request waits for live in the partition state pages,
written by the partition writers (and, for replicated partitions, by this loop).  The supervisor hands every
writer and the broker one eventfd (``ChildContext.broker_wake_fd``); a writer adds one to it after each
round that did work (new log end offset / high watermark, acknowledgements, ring space).  While the broker
holds a Fetch or leads a replicated partition, that eventfd is in its selector: a writer's round wakes the
loop, which drains the counter and re-checks held fetches and the replication timer.  Otherwise it is left
out of the selector (the writers' additions just accumulate), so local producing costs the broker nothing.
No wake-up is lost: a writer publishes, then adds; the broker drains the counter (only while it is in the
selector) before the turn's re-checks.  So a round added before the drain is seen by the re-check, and one
added after it leaves the counter non-zero -- readable at the next ``select``, or as soon as the eventfd is
put back in the selector.
So between events the loop sleeps until the nearest of: a held fetch's ``max_wait_ms`` deadline, a held
topic request's deadline, the cluster's timer, the next ISR check (``LeaderReplication.next_timer_ms``), and
:data:`FALLBACK_TICK_MS` -- a conservative re-check so
that a wake-up missed by a bug can only delay, never stall, an answer.  Two cases still poll every
:data:`~appliance.broker.fetch_session.POLL_INTERVAL_MS`: a held Produce request (ring acks, acks=all commits
and their timeouts; short-lived), and a broker built without the eventfd (``wake_fd=-1``, a broker run outside
``appliance serve``).  With nothing held and nothing replicated it sleeps until a socket is ready.

**Replication.**  The broker is the replica-state owner of the replicated partitions it leads
(``appliance.broker.replication``): follower fetches (``replica_id >= 0``) feed the ISR and the high
watermark, and every turn runs its timer (LEO moves, ISR shrinks, acks=all waiters).  With
``appliance.cluster.secret.file`` set, replica requests are served only on connections that authenticated
with SASL/PLAIN (``replicas.cluster_auth``).

**A bad peer harms only itself.**  A malformed frame, an unknown API key, an unsupported version of an API
other than ApiVersions, a frame over ``socket.request.max.bytes``: each closes that connection with one log
line naming the peer and the reason.  An exception escaping a handler (a bug) is logged with its traceback
and also closes only that connection.  Kafka does the same.

**Listening.**  The sockets, and how accepting keeps descriptors in reserve for the partitions, are
``appliance.broker.listeners``; the broker as a process (its main, the supervisor's hook) is
``appliance.broker.process``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import time
from collections.abc import Callable
from typing import Any

from appliance.broker.cluster import Cluster
from appliance.broker.config_requests import CONFIG_HANDLERS
from appliance.broker.connection import Connection, ConnectionClosed, ResponseSlot
from appliance.broker.fetch_session import (
    POLL_INTERVAL_MS,
    FetchWaiters,
    ParkedFetch,
    committed_moved,
    read_fetch,
)
from appliance.broker.group_requests import GROUP_APIS, HELD_GROUP_APIS, WRITING_GROUP_APIS, GroupRequests
from appliance.broker.handlers import HANDLERS, BrokerContext, metadata
from appliance.broker.listeners import Listeners, Listening
from appliance.broker.offsets_topic import GroupWrite
from appliance.broker.partition_requests import PARTITION_HANDLERS
from appliance.broker.partitions import PartitionTable
from appliance.broker.produce import Produce, ProduceService
from appliance.broker.replication import LeaderReplication
from appliance.broker.segment_requests import SEGMENT_HANDLERS, unauthorized
from appliance.broker.topic_requests import TopicRequests
from appliance.config.cluster_id import legacy_cluster_id, read_cluster_id
from appliance.config.server_config import Config
from ipc.kafka import (
    ApiKey,
    EpochEndOffset,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
    ProduceRequest,
    RequestHeader,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
    UnknownApiKeyError,
    UnsupportedVersionError,
    decode_request,
    encode_response_parts,
    maybe_unsupported_version_reply,
)
from ipc.shm import ShmNames
from ipc.state_page import monotonic_ms
from replicas.cluster_auth import SaslPlainServer, read_cluster_secret
from storage.errors import ConfigError, ProtocolError

__all__ = ["FALLBACK_TICK_MS", "Broker"]

log = logging.getLogger("appliance.broker")

SHUTDOWN_DRAIN_MS = 2000  # on stop, how long held produce requests and unsent responses may still finish
FALLBACK_TICK_MS = 100  # longest sleep while a fetch is held or a replicated partition led (module docstring)
_WRITERS = "writers"  # selector data of the writers' wake-up eventfd
_CONTROL = "control"  # selector data of the cluster's socket (answers to topic changes)
_HANDLERS = {**HANDLERS, **CONFIG_HANDLERS, **PARTITION_HANDLERS,
             **SEGMENT_HANDLERS}  # every API answered without holding


class Broker:
    """The broker's sockets, connections and held requests.  Build, :meth:`bind`, :meth:`serve`."""

    def __init__(
        self,
        config: Config,
        cluster: Cluster,
        *,
        produce: ProduceService | None = None,
        wake_fd: int = -1,
    ) -> None:
        """``wake_fd``: the eventfd the partition writers add to after each round (-1: none, poll instead);
        the broker reads it but does not own it (not closed here)."""
        for listener in config.listeners:
            if listener.name != "PLAINTEXT":
                raise ConfigError(
                    f"listeners: {listener} -- only PLAINTEXT listeners are implemented; "
                    "put TLS/SASL in front (stunnel, a proxy) or use PLAINTEXT on a private network"
                )
        self.config = config
        names = ShmNames(config.instance_id)
        self.sasl = SaslPlainServer(read_cluster_secret(config.cluster_secret_file))
        self.table = PartitionTable(config.log_dirs, names, config.node_id, _log_configs(config))
        self.replication = LeaderReplication(
            self.table, config.node_id, replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            min_insync_replicas=lambda meta: meta.min_insync_replicas,
        )
        cluster_id = read_cluster_id(config.log_dirs) or legacy_cluster_id(config.instance_id)
        self.ctx = BrokerContext(config, self.table, cluster, cluster_id=cluster_id,
                                 replication=self.replication)
        self.produce: ProduceService = produce if produce is not None else Produce(self.ctx)
        self.fetches = FetchWaiters()
        self.topic_requests = TopicRequests(self.ctx)
        self.groups = GroupRequests(self.ctx, self.produce)
        self._control_watched: tuple[Any, ...] = ()  # the cluster's selectables now in the selector
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, Connection] = {}
        self._scratch = memoryview(bytearray(1 << 20))
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self.listeners = Listeners(config, self._selector, probe_fd=self._wake_r)
        self._writers_fd = wake_fd
        self._writers_watched = False  # the writers' eventfd is in the selector
        self._stopping = False

    # -- sockets ------------------------------------------------------------------------------------------

    def bind(self) -> dict[str, tuple[str, int] | str]:
        """Open every listener; return their bound addresses (a TCP port 0 becomes the port chosen)."""
        addresses = self.listeners.bind()
        for advertised in self.config.advertised_listeners:
            bound = addresses.get(advertised.name)
            port = advertised.port or (bound[1] if isinstance(bound, tuple) else 0)
            self.ctx.advertised[advertised.name] = (advertised.host, port)
        return addresses

    @property
    def addresses(self) -> dict[str, tuple[str, int] | str]:
        """Listener name -> bound address."""
        return self.listeners.addresses

    def _accept(self, listening: Listening) -> None:
        for sock, peer in self.listeners.accept(listening):
            conn = Connection(sock, peer, listening.name, self.config.socket_request_max_bytes)
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            log.debug("%s: connected via %s", peer, listening.name)

    # -- the loop -----------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until :meth:`stop`; then let held requests finish briefly and close everything."""
        self.ctx.reload_topics()
        self.groups.start()  # __consumer_offsets: created if needed, loaded
        while not self._stopping:
            self._turn(self._timeout_s())
        self._drain()
        self.close()

    def stop(self) -> None:
        """Ask :meth:`serve` to return.  Safe from a signal handler or another thread."""
        self._stopping = True
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _timeout_s(self) -> float | None:
        """How long the next ``select`` may sleep (module docstring, "Waking on the writers' news")."""
        interested = bool(self.fetches.waiting or len(self.replication))
        if self._writers_fd >= 0:
            self._watch_writers(interested)
        self._watch_control()
        if self.produce.pending or (interested and self._writers_fd < 0):
            return POLL_INTERVAL_MS / 1000.0
        now_s = time.monotonic()
        timeout_s = self._control_timeout_s(now_s)
        if interested:
            tick_s = FALLBACK_TICK_MS / 1000.0
            timeout_s = tick_s if timeout_s is None else min(timeout_s, tick_s)
            deadline_ms = self.fetches.next_deadline_ms()
            if deadline_ms is not None:
                timeout_s = min(timeout_s, deadline_ms / 1000.0 - now_s)
            timer_ms = self.replication.next_timer_ms()
            if timer_ms is not None:
                timeout_s = min(timeout_s, (timer_ms - monotonic_ms()) / 1000.0)
        resume_s = self.listeners.next_resume_s()
        if resume_s is not None:
            paused_s = resume_s - now_s
            timeout_s = paused_s if timeout_s is None else min(timeout_s, paused_s)
        group_ms = self.groups.next_deadline_ms()  # rebalance deadlines, session expiry
        if group_ms is not None:
            group_s = group_ms / 1000.0 - now_s
            timeout_s = group_s if timeout_s is None else min(timeout_s, group_s)
        ring_timer_ms = self.produce.next_timer_ms()  # idle rings to let go of (appliance.ring.idle.ms)
        if ring_timer_ms is not None:
            ring_s = ring_timer_ms / 1000.0 - now_s
            timeout_s = ring_s if timeout_s is None else min(timeout_s, ring_s)
        return None if timeout_s is None else max(0.0, timeout_s)

    def _watch_writers(self, interested: bool) -> None:
        """Put the writers' eventfd in the selector while someone waits for their news, else take it out."""
        if interested == self._writers_watched:
            return
        if interested:
            self._selector.register(self._writers_fd, selectors.EVENT_READ, _WRITERS)
        else:
            self._selector.unregister(self._writers_fd)
        self._writers_watched = interested

    def _watch_control(self) -> None:
        """Keep the cluster's sockets (answers to topic changes, to ring attaches) in the selector, swapped
        after a reconnect."""
        current = self.ctx.cluster.selectables()
        if current == self._control_watched:
            return
        for gone in self._control_watched:
            if not any(gone is now for now in current):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(gone)  # closed: found by identity
        for new in current:
            if not any(new is was for was in self._control_watched):
                self._selector.register(new, selectors.EVENT_READ, _CONTROL)
        self._control_watched = current

    def _control_timeout_s(self, now_s: float) -> float | None:
        """Until the cluster's timer or the first held topic request's deadline, whichever is first."""
        timer_s = self.ctx.cluster.next_timer_s()
        due_s = [] if timer_s is None else [timer_s]
        deadline_ms = self.topic_requests.next_deadline_ms()
        if deadline_ms is not None:
            due_s.append(deadline_ms / 1000.0)
        return max(0.0, min(due_s) - now_s) if due_s else None

    def _poll_control(self, readable: bool) -> None:
        """Read the supervisor's answers, run the cluster's timer when due; answer the topic requests done."""
        now_s = time.monotonic()
        timer_s = self.ctx.cluster.next_timer_s()
        if readable or (timer_s is not None and now_s >= timer_s):
            self.ctx.cluster.poll(now_s)
        if self.topic_requests.pending:
            for conn, header, body in self.topic_requests.poll(now_s * 1000):
                self._finish_held(conn, header, body, unpark=True)

    def _turn(self, timeout_s: float | None) -> None:
        events = self._selector.select(timeout_s)
        if not self._stopping and (events or self.fetches.waiting or self.produce.pending):
            self.ctx.refresh_if_stale()  # topics deleted elsewhere end held requests and reads
        control = False
        for key, mask in events:
            data = key.data
            if isinstance(data, Connection):
                self._on_ready(data, mask)
            elif isinstance(data, Listening):
                self._accept(data)
            elif data is _WRITERS:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._writers_fd)  # the re-checks below run every turn
            elif data is _CONTROL:
                control = True
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
        if self.listeners.paused:
            self.listeners.resume_due()
        self._poll_control(control)  # before the produce poll: a ring attached now is used this turn
        self.replication.tick()
        if self.fetches.waiting:
            self._poll_fetches()
        if self.produce.pending or self.replication.has_completed:
            for owner, header, body in self.produce.poll(time.monotonic() * 1000):
                if isinstance(owner, GroupWrite):  # the coordinator's append to __consumer_offsets
                    for answer in self.groups.appended(owner, body):
                        self._finish_held(*answer, unpark=True)
                else:
                    self._finish_held(owner, header, body)
        self.produce.tick(time.monotonic() * 1000)
        group_ms = self.groups.next_deadline_ms()
        if group_ms is not None and group_ms <= time.monotonic() * 1000:
            for slot, header, body in self.groups.tick():
                self._finish_held(slot, header, body, unpark=True)

    def _on_ready(self, conn: Connection, mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE:
                conn.send_queued()
            if mask & selectors.EVENT_READ and conn.may_read:
                conn.receive(self._scratch)
            self._handle_buffered(conn)
        except ConnectionClosed as e:
            self._close(conn, str(e), level=logging.DEBUG)
        except ProtocolError as e:
            self._close(conn, f"bad frame: {e}", level=logging.WARNING)

    def _handle_buffered(self, conn: Connection) -> None:
        """Handle the complete frames buffered for ``conn`` while it may, then fix its selector interest."""
        while conn.may_handle:
            frame = conn.reader.next_frame()
            if frame is None:
                break
            self._handle_frame(conn, frame)
        if not conn.closed:
            self._update_interest(conn)

    def _update_interest(self, conn: Connection) -> None:
        want_read = conn.may_read
        want_write = conn.has_queued
        if want_read == conn.want_read and want_write == conn.want_write:
            return
        registered = conn.want_read or conn.want_write
        conn.want_read, conn.want_write = want_read, want_write
        events = (selectors.EVENT_READ if want_read else 0) | (selectors.EVENT_WRITE if want_write else 0)
        if events and registered:
            self._selector.modify(conn.sock, events, conn)
        elif events:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.unregister(conn.sock)

    # -- requests -----------------------------------------------------------------------------------------

    def _handle_frame(self, conn: Connection, frame: bytes) -> None:
        request = _decode(conn, frame)
        if request is None:
            return
        header: RequestHeader = request.header
        body = request.body
        api_key = header.api_key
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s: %s v%d correlation id %d client %r",
                conn.peer,
                ApiKey(api_key).name,
                header.api_version,
                header.correlation_id,
                header.client_id,
            )
        try:
            if api_key == ApiKey.FETCH:
                self._start_fetch(conn, header, body)
                return
            if api_key == ApiKey.PRODUCE:
                self._start_produce(conn, header, body)
                return
            if api_key in (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS):
                self._start_topic_request(conn, header, body)
                return
            if api_key in WRITING_GROUP_APIS:
                self._start_commit(conn, header, body)
                return
            if api_key in HELD_GROUP_APIS:
                self._start_group_request(conn, header, body)
                return
            if api_key in GROUP_APIS:
                answered, released = self.groups.answer(header, body, conn.listener)
                conn.respond(encode_response_parts(header, answered))
                self._finish_group_answers(released)
                return
            if api_key == ApiKey.SASL_HANDSHAKE:
                code, mechanisms = self.sasl.handshake(header.api_version, body.mechanism)
                conn.sasl_mechanism = body.mechanism if code == ErrorCode.NONE else None
                response: Any = SaslHandshakeResponse(error_code=code, mechanisms=mechanisms)
            elif api_key == ApiKey.SASL_AUTHENTICATE:
                response = self._authenticate(conn, header, body)
                if response is None:
                    return
            elif api_key == ApiKey.METADATA:
                response = metadata(self.ctx, header, body, conn.listener)
            elif self._unauthorized_replica(conn, getattr(body, "replica_id", -1)):
                response = _cluster_authorization_failed(api_key, body)
            else:
                response = _HANDLERS[api_key](self.ctx, header, body)
        except (ConnectionClosed, ProtocolError):
            raise
        except Exception:
            log.exception(
                "%s: %s v%d request (correlation id %d) failed; closing the connection",
                conn.peer,
                ApiKey(api_key).name,
                header.api_version,
                header.correlation_id,
            )
            raise ConnectionClosed("handler failed") from None
        conn.respond(encode_response_parts(header, response))

    def _unauthorized_replica(self, conn: Connection, replica_id: int) -> bool:
        """A replica request (``replica_id >= 0``) on a connection that did not authenticate as a replica."""
        return replica_id >= 0 and self.sasl.required and conn.principal is None

    def _authenticate(self, conn: Connection, header: RequestHeader, body: Any) -> Any:
        outcome = self.sasl.authenticate(conn.sasl_mechanism is not None, body.auth_bytes)
        response = SaslAuthenticateResponse(error_code=outcome.error, error_message=outcome.message,
                                            auth_bytes=b"", session_lifetime_ms=0)
        if outcome.error == ErrorCode.NONE:
            conn.principal = outcome.principal
            log.info("%s: authenticated as %s (replication)", conn.peer, outcome.principal)
            return response
        log.warning("%s: SASL authentication refused: %s; closing the connection", conn.peer, outcome.message)
        conn.respond(encode_response_parts(header, response))
        conn.send_queued()
        raise ConnectionClosed(f"SASL authentication failed: {outcome.message}")

    def _start_fetch(self, conn: Connection, header: RequestHeader, body: FetchRequest) -> None:
        if self._unauthorized_replica(conn, body.replica_id):
            log.warning("%s: replica %d fetches without authenticating; refused "
                        "(appliance.cluster.secret.file is set)", conn.peer, body.replica_id)
            conn.respond(encode_response_parts(header, _cluster_authorization_failed(ApiKey.FETCH, body)))
            return
        hook = self.replication.link(conn) if body.replica_id >= 0 else None
        result = read_fetch(self.ctx.lookup, body, follower_hook=hook)
        if (
            (hook is not None and hook.news)  # a new high watermark for the follower: no long poll
            or result.has_error
            or body.max_wait_ms <= 0
            or result.ready_bytes >= max(body.min_bytes, 1)
            or not result.watched
        ):
            conn.respond(encode_response_parts(header, result.response))
            return
        deadline_ms = time.monotonic() * 1000 + body.max_wait_ms
        conn.parked = True  # a long poll holds the requests behind it, as in Kafka
        self.fetches.add(ParkedFetch(conn.reserve(), header, body, deadline_ms, result.watched))

    def _poll_fetches(self) -> None:
        now_ms = time.monotonic() * 1000
        for parked in self.fetches.poll(now_ms):
            self.fetches.finish(parked)
            slot = parked.owner
            assert isinstance(slot, ResponseSlot)
            if slot.connection.closed:
                continue
            follower = parked.request.replica_id >= 0
            hook = self.replication.link(slot.connection) if follower else None
            result = read_fetch(self.ctx.lookup, parked.request, follower_hook=hook, first_read=False)
            enough = result.ready_bytes >= max(parked.request.min_bytes, 1)
            if follower and committed_moved(parked.watched, result.watched):
                enough = True  # tell the follower the new high watermark now, not after its long poll
            if enough or result.has_error or parked.deadline_ms <= now_ms or not result.watched:
                self._finish_held(slot, parked.header, result.response, unpark=True)
            else:
                parked.done = False
                parked.watched = result.watched
                self.fetches.add(parked)

    def _start_produce(self, conn: Connection, header: RequestHeader, body: ProduceRequest) -> None:
        slot = conn.reserve()  # answered now, later (after the writers' acks) or never (acks=0)
        outcome = self.produce.start(slot, header, body)
        if outcome.close_reason is not None:
            log.info("%s: closing the connection: %s", conn.peer, outcome.close_reason)
            raise ConnectionClosed(outcome.close_reason)
        if outcome.response is not None:
            conn.fill(slot, encode_response_parts(header, outcome.response))
        elif not outcome.held:
            conn.fill(slot, ())

    def _start_topic_request(self, conn: Connection, header: RequestHeader, body: Any) -> None:
        """CreateTopics / DeleteTopics: answered now, or held until the supervisor answers (docstring)."""
        slot = conn.reserve()
        now_ms = time.monotonic() * 1000
        requests = self.topic_requests
        response: Any
        if header.api_key == ApiKey.CREATE_TOPICS:
            response = requests.start_create(slot, header, body, now_ms)
        else:
            response = requests.start_delete(slot, header, body, now_ms)
        if response is not None:
            conn.fill(slot, encode_response_parts(header, response))
            return
        conn.parked = True  # the requests behind it wait for its answer, as in Kafka

    def _start_group_request(self, conn: Connection, header: RequestHeader, body: Any) -> None:
        """JoinGroup / SyncGroup: answered now, or held until the other members' requests or the
        coordinator's timer answer it (``appliance.broker.group_requests``)."""
        slot = conn.reserve()
        conn.parked = True  # the requests behind it wait for its answer, as in Kafka
        answers = self.groups.start_held(slot, header, body, conn.peer)
        own = [a for a in answers if a[0] is slot]
        self._finish_group_answers([a for a in answers if a[0] is not slot])
        if own:
            conn.parked = False
            conn.fill(slot, encode_response_parts(header, own[0][2]))

    def _start_commit(self, conn: Connection, header: RequestHeader, body: Any) -> None:
        """OffsetCommit, OffsetDelete, DeleteGroups: answered now (refused) or once their records are in
        ``__consumer_offsets``; the connection is parked meanwhile, so a request behind it sees them."""
        slot = conn.reserve()
        conn.parked = True
        response = self.groups.start_write(slot, header, body)
        if response is not None:
            conn.parked = False
            conn.fill(slot, encode_response_parts(header, response))

    def _finish_group_answers(self, answers: list[tuple[Any, RequestHeader, Any]]) -> None:
        for slot, header, body in answers:
            self._finish_held(slot, header, body, unpark=True)

    def _finish_held(self, slot: Any, header: Any, response: Any, *, unpark: bool = False) -> None:
        """Answer a held request into its slot, then go on with the frames its connection buffered."""
        assert isinstance(slot, ResponseSlot)
        conn = slot.connection
        if conn.closed:
            return
        if unpark:
            conn.parked = False
        try:
            conn.fill(slot, () if response is None else encode_response_parts(header, response))
            self._handle_buffered(conn)
        except ConnectionClosed as e:
            self._close(conn, str(e), level=logging.DEBUG)
        except ProtocolError as e:
            self._close(conn, f"bad frame: {e}", level=logging.WARNING)

    # -- closing ------------------------------------------------------------------------------------------

    def _close(self, conn: Connection, reason: str, *, level: int) -> None:
        if conn.closed:
            return
        log.log(level, "%s: closing the connection: %s", conn.peer, reason)
        self._connections.pop(conn.sock.fileno(), None)
        if conn.want_read or conn.want_write:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        self.fetches.drop_owner(lambda slot: getattr(slot, "connection", None) is conn)
        conn.close()

    def _drain(self) -> None:
        """Stop listening; give held produce requests and unsent responses a moment to finish."""
        self.listeners.close()
        deadline = time.monotonic() + SHUTDOWN_DRAIN_MS / 1000.0
        while time.monotonic() < deadline and (
            self.produce.pending or any(c.has_queued for c in self._connections.values())
        ):
            self._turn(POLL_INTERVAL_MS / 1000.0)

    def close(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn, "broker stopping", level=logging.DEBUG)
        self.listeners.close()
        self.topic_requests.close()
        self.produce.close()
        self.replication.close()
        self.table.close()
        self.ctx.cluster.close()
        if self._writers_watched:
            self._watch_writers(False)  # the eventfd is the supervisor's: left open
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _decode(conn: Connection, frame: bytes) -> Any:
    """The request in ``frame``; None if it was answered already (an unsupported version of ApiVersions).

    ConnectionClosed for an unknown API key, ProtocolError for an unsupported version of another API."""
    try:
        return decode_request(frame)
    except UnknownApiKeyError as e:
        raise ConnectionClosed(f"unknown api key {e.api_key} (correlation id {e.correlation_id})") from None
    except UnsupportedVersionError as e:
        reply = maybe_unsupported_version_reply(e)
        if reply is None:
            raise ProtocolError(str(e)) from None
        conn.respond([reply])
        return None


def _cluster_authorization_failed(api_key: int, body: Any) -> Any:
    """The answer to a replica request from a connection that did not authenticate as a replica."""
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if api_key == ApiKey.DESCRIBE_SEGMENTS:
        return unauthorized(body)
    if api_key == ApiKey.FETCH:
        return FetchResponse(error_code=code, session_id=0, responses=[])
    if api_key == ApiKey.LIST_OFFSETS:
        return ListOffsetsResponse(topics=[
            ListOffsetsTopicResponse(name=t.name, partitions=[
                ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=code)
                for p in t.partitions])
            for t in body.topics])  # fmt: skip
    return OffsetForLeaderEpochResponse(topics=[
        OffsetForLeaderTopicResult(topic=t.topic, partitions=[
            EpochEndOffset(error_code=code, partition=p.partition) for p in t.partitions])
        for t in body.topics])  # fmt: skip


def _log_configs(config: Config) -> Callable[[str], Any]:
    def log_config(topic: str) -> Any:
        try:
            return config.log_config(topic)
        except ConfigError:
            from storage.log_config import LogConfig

            return LogConfig()

    return log_config
