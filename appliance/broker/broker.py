"""The broker process: the Kafka protocol on TCP and on a Unix socket, one thread, one ``selectors`` loop.

Theory of operation
-------------------
``appliance serve`` (the supervisor) forks the broker as a child process (:func:`child_spec`, its hook) and
the child runs :func:`run_broker`.
The broker owns no data: it reads partition logs read-only (``storage.log_reader``), reads offsets from the
partition state pages (``ipc.state_page``), hands produced batches to the partition writers through their
rings (``appliance.broker.produce``), and asks the supervisor about topics and producer ids
(``appliance.broker.cluster``).  So it can be killed and restarted at any moment without losing anything.

**Why one thread and selectors.**  On a 2-core machine the work that matters -- moving record bytes --
happens in the kernel (``sendfile``), so the broker's Python only decides *what* to send.  One epoll loop
over non-blocking sockets keeps that decision cheap: no thread switches, no locks, no asyncio task objects
per request.  Nothing in the loop blocks except control-socket calls to the supervisor (creating and deleting
topics, producer ids, metadata refreshes), which are rare and short.

**A turn of the loop.**  ``select`` returns ready sockets: a listener accepts new connections; a connection
is read (one ``recv``), its complete frames are handled in order while it may handle more (see
``appliance.broker.connection``: one parked request at a time per connection, back-pressure on unsent
bytes), and its queued response bytes are sent when it is writable.  Then held requests are polled: Fetch
requests waiting for records (``appliance.broker.fetch_session``) and Produce requests waiting for the
partition writer's acknowledgement.

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
So between events the loop sleeps until the nearest of: a held fetch's ``max_wait_ms`` deadline, the next
ISR check (``LeaderReplication.next_timer_ms``), and :data:`FALLBACK_TICK_MS` -- a conservative re-check so
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

**Out of descriptors.**  Connections must never take the descriptors the broker needs to serve them: opening
a partition (its state page, its log's segment files) and a control call each take a few.  So the broker
keeps :data:`DESCRIPTOR_RESERVE` descriptors (one in :data:`DESCRIPTOR_RESERVE_SHARE` of a small limit)
below ``RLIMIT_NOFILE`` for that: a connection accepted at a
descriptor number inside the reserve is served, but the listener pauses for :data:`ACCEPT_PAUSE_MS` (as
after an ``accept`` that failed with EMFILE), and newer clients wait in the listen backlog until
connections close.  (Without the reserve, a flood of connections left no descriptor to attach a partition's
state page, and the partition was answered NOT_LEADER_OR_FOLLOWER until connections went away.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import selectors
import signal
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

from appliance.broker.cluster import Cluster
from appliance.broker.connection import Connection, ConnectionClosed, ResponseSlot
from appliance.broker.fetch_session import (
    POLL_INTERVAL_MS,
    FetchWaiters,
    ParkedFetch,
    committed_moved,
    read_fetch,
)
from appliance.broker.handlers import HANDLERS, BrokerContext, metadata
from appliance.broker.partitions import PartitionTable
from appliance.broker.produce import Produce, ProduceService
from appliance.broker.replication import LeaderReplication
from appliance.config.server_config import Config, Listener
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

__all__ = ["Broker", "broker_child", "child_spec", "run_broker"]

log = logging.getLogger("appliance.broker")

ACCEPT_BACKLOG = 1024
ACCEPTS_PER_TURN = 64
ACCEPT_PAUSE_MS = 100  # after accept() fails (out of descriptors), before trying again
DESCRIPTOR_RESERVE = 16  # kept free for partition files, state pages and control calls (module docstring)
DESCRIPTOR_RESERVE_SHARE = 8  # ... or one in this many of RLIMIT_NOFILE, if fewer (a tiny limit)
RESERVE_LOG_INTERVAL_S = 10.0  # pauses for the reserve are logged at most this often
CONTROL_TIMEOUT_S = 5.0  # a control call blocks the loop: never longer than this
SHUTDOWN_DRAIN_MS = 2000  # on stop, how long held produce requests and unsent responses may still finish
FALLBACK_TICK_MS = 100  # longest sleep while a fetch is held or a replicated partition led (module docstring)
_WRITERS = "writers"  # selector data of the writers' wake-up eventfd


class _Listening:
    """A listening socket and the name of the listener it serves (PLAINTEXT, or UNIX)."""

    __slots__ = ("name", "path", "sock")

    def __init__(self, sock: socket.socket, name: str, path: str | None = None) -> None:
        self.sock = sock
        self.name = name
        self.path = path


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
        self.ctx = BrokerContext(config, self.table, cluster, cluster_id=f"appliance-{config.instance_id}",
                                 replication=self.replication)
        self.produce: ProduceService = produce if produce is not None else Produce(self.ctx)
        self.fetches = FetchWaiters()
        self._selector = selectors.DefaultSelector()
        self._listening: list[_Listening] = []
        self._paused: list[tuple[float, _Listening]] = []  # listeners not accepting until a time
        # Descriptors are numbered lowest free first: an accepted socket numbered at or above this leaves
        # fewer than DESCRIPTOR_RESERVE free.
        limit = _descriptor_limit()
        self._descriptor_reserve = min(DESCRIPTOR_RESERVE, limit // DESCRIPTOR_RESERVE_SHARE)
        self._descriptor_ceiling = limit - self._descriptor_reserve
        self._reserve_logged_s = -RESERVE_LOG_INTERVAL_S
        self._connections: dict[int, Connection] = {}
        self._scratch = memoryview(bytearray(1 << 20))
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._writers_fd = wake_fd
        self._writers_watched = False  # the writers' eventfd is in the selector
        self._stopping = False
        self.addresses: dict[str, tuple[str, int] | str] = {}  # listener name -> bound address

    # -- sockets ------------------------------------------------------------------------------------------

    def bind(self) -> dict[str, tuple[str, int] | str]:
        """Open every listener; return their bound addresses (a TCP port 0 becomes the port chosen)."""
        for listener in self.config.listeners:
            sock = _listen_tcp(listener)
            self._add_listening(_Listening(sock, listener.name))
            host, port = sock.getsockname()[:2]
            self.addresses[listener.name] = (host, port)
            log.info("broker listening on %s://%s:%d", listener.name, host, port)
        for advertised in self.config.advertised_listeners:
            bound = self.addresses.get(advertised.name)
            port = advertised.port or (bound[1] if isinstance(bound, tuple) else 0)
            self.ctx.advertised[advertised.name] = (advertised.host, port)
        path = self.config.unix_listener
        if path:
            sock = _listen_unix(path, self.config.shm_mode, self.config.shm_gid)
            self._add_listening(_Listening(sock, "UNIX", path))
            self.addresses["UNIX"] = path
            log.info("broker listening on unix:%s (mode %o)", path, self.config.shm_mode)
        return dict(self.addresses)

    def _add_listening(self, listening: _Listening) -> None:
        listening.sock.setblocking(False)
        self._listening.append(listening)
        self._selector.register(listening.sock, selectors.EVENT_READ, listening)

    def _accept(self, listening: _Listening) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, address = listening.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: keep serving the connections we have, retry later
                log.error("accept on %s: %s; not accepting for %d ms", listening.name, e, ACCEPT_PAUSE_MS)
                self._pause_accepting(listening)
                return
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = f"{address[0]}:{address[1]}"
            else:
                peer = f"unix:{listening.path}#{sock.fileno()}"
            conn = Connection(sock, peer, listening.name, self.config.socket_request_max_bytes)
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            log.debug("%s: connected via %s", peer, listening.name)
            if sock.fileno() >= self._descriptor_ceiling:
                self._pause_accepting(listening)
                if time.monotonic() < self._reserve_logged_s + RESERVE_LOG_INTERVAL_S:
                    return
                self._reserve_logged_s = time.monotonic()
                log.warning("accept on %s: descriptor %d is within the reserve of %d below RLIMIT_NOFILE %d "
                            "(kept for partition files); not accepting for %d ms", listening.name,
                            sock.fileno(), self._descriptor_reserve,
                            self._descriptor_ceiling + self._descriptor_reserve,
                            ACCEPT_PAUSE_MS)  # fmt: skip
                return

    def _pause_accepting(self, listening: _Listening) -> None:
        self._selector.unregister(listening.sock)
        self._paused.append((time.monotonic() + ACCEPT_PAUSE_MS / 1000.0, listening))

    # -- the loop -----------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until :meth:`stop`; then let held requests finish briefly and close everything."""
        self.ctx.reload_topics()
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
        if self.produce.pending or (interested and self._writers_fd < 0):
            return POLL_INTERVAL_MS / 1000.0
        now_s = time.monotonic()
        timeout_s: float | None = None
        if interested:
            timeout_s = FALLBACK_TICK_MS / 1000.0
            deadline_ms = self.fetches.next_deadline_ms()
            if deadline_ms is not None:
                timeout_s = min(timeout_s, deadline_ms / 1000.0 - now_s)
            timer_ms = self.replication.next_timer_ms()
            if timer_ms is not None:
                timeout_s = min(timeout_s, (timer_ms - monotonic_ms()) / 1000.0)
        if self._paused:
            paused_s = min(at for at, _ in self._paused) - now_s
            timeout_s = paused_s if timeout_s is None else min(timeout_s, paused_s)
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

    def _resume_accepting(self) -> None:
        now = time.monotonic()
        due = [e for e in self._paused if e[0] <= now]
        if not due:
            return
        spare = self._descriptors_to_spare()
        if not spare:  # still inside the reserve: another pause
            self._paused = [e for e in self._paused if e[0] > now]
            self._paused += [(now + ACCEPT_PAUSE_MS / 1000.0, listening) for _, listening in due]
            return
        for entry in due:
            self._paused.remove(entry)
            self._selector.register(entry[1].sock, selectors.EVENT_READ, entry[1])

    def _descriptors_to_spare(self) -> bool:
        """Whether the lowest free descriptor is below the reserve (a probe: ``dup`` takes the lowest)."""
        try:
            probe = os.dup(self._wake_r)
        except OSError:
            return False
        os.close(probe)
        return probe < self._descriptor_ceiling

    def _turn(self, timeout_s: float | None) -> None:
        events = self._selector.select(timeout_s)
        if not self._stopping and (events or self.fetches.waiting or self.produce.pending):
            self.ctx.refresh_if_stale()  # topics deleted elsewhere end held requests and reads
        for key, mask in events:
            data = key.data
            if isinstance(data, Connection):
                self._on_ready(data, mask)
            elif isinstance(data, _Listening):
                self._accept(data)
            elif data is _WRITERS:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._writers_fd)  # the re-checks below run every turn
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
        if self._paused:
            self._resume_accepting()
        self.replication.tick()
        if self.fetches.waiting:
            self._poll_fetches()
        if self.produce.pending or self.replication.has_completed:
            for conn, header, body in self.produce.poll(time.monotonic() * 1000):
                self._finish_held(conn, header, body)

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
        try:
            request = decode_request(frame)
        except UnknownApiKeyError as e:
            raise ConnectionClosed(
                f"unknown api key {e.api_key} (correlation id {e.correlation_id})"
            ) from None
        except UnsupportedVersionError as e:
            reply = maybe_unsupported_version_reply(e)
            if reply is None:
                raise ProtocolError(str(e)) from None
            conn.respond([reply])
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
                response = HANDLERS[api_key](self.ctx, header, body)
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
        self._paused.clear()
        for listening in self._listening:
            self._close_listening(listening)
        self._listening.clear()
        deadline = time.monotonic() + SHUTDOWN_DRAIN_MS / 1000.0
        while time.monotonic() < deadline and (
            self.produce.pending or any(c.has_queued for c in self._connections.values())
        ):
            self._turn(POLL_INTERVAL_MS / 1000.0)

    def _close_listening(self, listening: _Listening) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(listening.sock)
        listening.sock.close()
        if listening.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listening.path)

    def close(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn, "broker stopping", level=logging.DEBUG)
        for listening in self._listening:
            self._close_listening(listening)
        self._listening.clear()
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


def _cluster_authorization_failed(api_key: int, body: Any) -> Any:
    """The answer to a replica request from a connection that did not authenticate as a replica."""
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
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


def _descriptor_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a very large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def _log_configs(config: Config) -> Callable[[str], Any]:
    def log_config(topic: str) -> Any:
        try:
            return config.log_config(topic)
        except ConfigError:
            from storage.log_config import LogConfig

            return LogConfig()

    return log_config


def _listen_tcp(listener: Listener) -> socket.socket:
    host = listener.host or None
    try:
        infos = socket.getaddrinfo(host, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"listeners: {listener}: cannot resolve {listener.host!r}: {e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(ACCEPT_BACKLOG)
    except OSError as e:
        sock.close()
        raise ConfigError(f"listeners: {listener}: cannot listen: {e.strerror}") from None
    sock.set_inheritable(False)
    return sock


def _listen_unix(path: str, mode: int, gid: int | None) -> socket.socket:
    """Listen on ``path`` with ``mode`` (0600: owner only).  A stale socket file is replaced; a live one
    (another broker answers there) is an error.  The socket is created under a umask that already denies
    everyone else, so there is no moment when it is more open than ``mode``."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"appliance.unix.listener: {path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens there: a leftover of a killed broker
        else:
            raise ConfigError(f"appliance.unix.listener: another broker already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ConfigError(f"appliance.unix.listener: cannot bind {path}: {e.strerror}") from None
    finally:
        os.umask(old_umask)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
    sock.listen(ACCEPT_BACKLOG)
    sock.set_inheritable(False)
    return sock


def run_broker(
    config: Config,
    cluster: Cluster | None = None,
    *,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    stop_on_sigint: bool = True,
    wake_fd: int = -1,
) -> int:
    """The broker process's main: bind, serve until SIGTERM (and SIGINT), return the exit code.

    ``cluster`` defaults to a new connection to the supervisor's control socket.  ``on_ready`` is called
    with the bound addresses once every listener is open; ``wake_fd`` is the writers' wake-up eventfd
    (:class:`Broker`).  The process title is "appliance: broker"."""
    from appliance.server.proctitle import set_proctitle

    set_proctitle("appliance: broker")
    if cluster is None:
        from appliance.broker.control_cluster import ControlCluster

        cluster = ControlCluster.connect(config)
    broker = Broker(config, cluster, wake_fd=wake_fd)
    signal.signal(signal.SIGTERM, lambda *_: broker.stop())
    if stop_on_sigint:
        signal.signal(signal.SIGINT, lambda *_: broker.stop())
    try:
        addresses = broker.bind()
    except BaseException:
        broker.close()
        raise
    if on_ready is not None:
        on_ready(dict(addresses))
    broker.serve()
    log.info("broker stopped")
    return 0


def child_spec(config: Config) -> Any:
    """The supervisor's hook (``appliance.server.children.EXTRA_CHILDREN``): the broker as a child process,
    forked after the partition writers, restarted if it dies; READY=1 waits until its listeners are bound."""
    from appliance.server.children import ChildSpec

    return ChildSpec(name="broker", target=broker_child, title="appliance: broker", wait_ready=True)


def broker_child(context: Any) -> int:
    """Body of the broker child (``context``: ``appliance.server.children.ChildContext``).  The supervisor
    has set the title, the parent-death signal and SIGINT ignored (it stops its children with SIGTERM)."""
    from appliance.broker.control_cluster import ControlCluster

    config: Config = context.config
    try:
        cluster = ControlCluster(context.connect(timeout_s=CONTROL_TIMEOUT_S))
        return run_broker(config, cluster, on_ready=lambda _: context.ready(), stop_on_sigint=False,
                          wake_fd=context.broker_wake_fd)
    except ConfigError as e:
        log.error("broker not started: %s", e)
        return 1
