"""Fetch: read record bytes up to the high watermark, and hold a request until enough of them exist.

Theory of operation
-------------------
:func:`read_fetch` answers a Fetch request from the partition logs *as they are now*, without I/O on the
socket: for each partition it asks the partition's ``LogReader`` for whole batches from ``fetch_offset``,
never past the high watermark published in the state page (a follower reads up to the log end offset), and
puts the result in the response as a :class:`~ipc.kafka.FileRegion` -- file, position, size -- that the
connection later moves with ``os.sendfile``.  No record byte passes through Python.

Errors are per partition, as Kafka reports them:

* UNKNOWN_TOPIC_OR_PARTITION -- the topic or partition does not exist;
* NOT_LEADER_OR_FOLLOWER -- it exists but this appliance does not serve it (or not yet);
* OFFSET_OUT_OF_RANGE -- ``fetch_offset`` is below the log start offset or above the log end offset
  (an offset between the high watermark and the log end offset is not an error: it is answered empty);
* FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH -- the client's ``current_leader_epoch`` (v9+) is older /
  newer than ours;
* KAFKA_STORAGE_ERROR -- the log could not be read (logged with the reason);
* none, and no records -- a clean's swap (``storage.clean_swap``) in the partition's directory was still
  unfinished after the reader's short wait (``partitions.SWAP_WAIT_S``).  Kafka's readers never see a
  swap (its segment map changes in one step), so Kafka would answer the records; the answer nearest to that
  is "nothing readable yet", which every client meets by fetching again (held as a long poll like any
  empty answer), with no metadata refresh and no error shown to the application, where the retriable
  errors (NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR) make clients refresh metadata and back off, and
  librdkafka passes the others to the application.  No byte of a half-swapped directory is ever sent;
* INVALID_REQUEST -- the partition was already named earlier in the same request.

Sizes (KIP-74): partitions are filled in request order until ``max_bytes`` is used up; each gets at most
``partition_max_bytes``; the first partition that has data always gets at least one whole batch, however
large, so a consumer can make progress; a later partition whose first batch does not fit gets nothing.

**Long poll.**  Kafka answers at once if ``max_wait_ms <= 0``, if any partition has an error, or if at least
``min_bytes`` are ready; otherwise it holds the request until ``min_bytes`` are ready or ``max_wait_ms`` has
passed.  :class:`FetchWaiters` holds such requests.  The partition writers publish the offsets in shared
memory and then add to the broker's wake-up eventfd, which the broker selects on while someone waits
(``appliance.broker.broker``, "Waking on the writers' news"); each turn of its loop then re-checks the state
pages of the partitions someone waits on (:meth:`FetchWaiters.poll`), and sleeps at most until the nearest
deadline (:meth:`FetchWaiters.next_deadline_ms`).  A broker without that eventfd polls every
:data:`POLL_INTERVAL_MS` instead.  Reading a state page is one load per partition; a held request is only
re-read when one of its partitions' watermark moved.

**Sessions (KIP-227).**  The broker keeps no fetch sessions: it answers ``session_id`` 0, which tells the
client that no session was created, so it keeps sending full requests (``session_epoch`` 0 or -1).  A
request naming a session (``session_id`` != 0) gets FETCH_SESSION_ID_NOT_FOUND, which makes the client start
over without one.

**Followers.**  A request with ``replica_id >= 0`` comes from a follower replica.  It reads up to the log end
offset instead of the high watermark.  A :class:`FollowerHook` (the broker's replication layer,
``appliance.broker.replication``) is told each partition's fetch before it is read -- the follower's log end
offset, its leader epoch -- and may answer the partition with an error instead (NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH, OFFSET_OUT_OF_RANGE...); it gives the high watermark the answer carries (the committed
one: a follower is not bounded by what consumers see) and learns which one each answer carried.  A held
follower fetch wakes when the partition's log end offset or its committed high watermark moves, so the
followers learn a new high watermark without waiting out their long poll.  Without a hook (or for a
partition the hook does not replicate) a follower is served like a consumer, up to the log end offset.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from appliance.broker.partitions import PartitionHandle
from ipc.kafka import (
    ErrorCode,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FileRegion,
    PartitionData,
)
from storage.errors import ApplianceError, OffsetOutOfRangeError, SwapInProgressError

__all__ = [
    "POLL_INTERVAL_MS",
    "FetchResult",
    "FetchWaiters",
    "FollowerHook",
    "ParkedFetch",
    "committed_moved",
    "follower_bound",
    "read_fetch",
]

log = logging.getLogger("appliance.broker")

POLL_INTERVAL_MS = 1  # state-page polling period while a fetch is held (a broker without the wake-up eventfd)
NO_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1

Lookup = Callable[[str, int], "tuple[PartitionHandle | None, ErrorCode]"]


class FollowerHook(Protocol):
    """The replication layer's view of follower fetches on one connection (see the module docstring)."""

    def fetched(self, replica_id: int, handle: PartitionHandle, fp: FetchPartition) -> ErrorCode:
        """A follower fetches ``fp`` (first read of the request only): NONE, or the error to answer."""
        ...

    def high_watermark(self, handle: PartitionHandle) -> int | None:
        """The high watermark a follower's answer carries (None: the state page's)."""
        ...

    def answered(self, replica_id: int, handle: PartitionHandle, high_watermark: int) -> None:
        """The partition was read for the follower and its answer carries ``high_watermark``."""
        ...


def follower_bound(handle: PartitionHandle) -> tuple[int, int]:
    """What a held follower fetch waits on: the log end offset and the committed high watermark."""
    page = handle.page
    return page.log_end_offset, page.committed_high_watermark


def committed_moved(before: list[tuple[PartitionHandle, object]],
                    after: list[tuple[PartitionHandle, object]]) -> bool:
    """Did the committed high watermark of a partition a held follower fetch reads move between two reads
    (``watched`` lists of :func:`follower_bound` values)?  Then it is answered at once."""
    then = {id(handle): bound for handle, bound in before}
    for handle, bound in after:
        old = then.get(id(handle))
        if isinstance(old, tuple) and isinstance(bound, tuple) and old[1] != bound[1]:
            return True
    return False


@dataclass(slots=True)
class FetchResult:
    """A Fetch response ready to encode, and what a waiter needs to decide whether to send it."""

    response: FetchResponse
    ready_bytes: int  # record bytes in the response
    has_error: bool  # some partition (or the request) has an error: answer at once
    # (partition, the bound read against: the HW, or for followers follower_bound) -- for waiting
    watched: list[tuple[PartitionHandle, object]]


def _error_partition(index: int, code: ErrorCode) -> PartitionData:
    return PartitionData(
        partition_index=index,
        error_code=code,
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        records=b"",
    )


def _empty_partition(index: int, high_watermark: int, log_start_offset: int) -> PartitionData:
    return PartitionData(
        partition_index=index,
        error_code=ErrorCode.NONE,
        high_watermark=high_watermark,
        last_stable_offset=high_watermark,
        log_start_offset=log_start_offset,
        records=b"",
    )


def read_fetch(
    lookup: Lookup,
    request: FetchRequest,
    *,
    follower_hook: FollowerHook | None = None,
    first_read: bool = True,
) -> FetchResult:
    """Answer ``request`` from the logs as they are now.  ``lookup(topic, partition)`` gives a partition's
    handle or the error code to answer (``PartitionTable.lookup``).  ``first_read`` False: a held request
    read again (the follower hook is not told of the fetch twice).  See the module docstring."""
    if request.session_id != NO_SESSION_ID:
        code = ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        return FetchResult(FetchResponse(error_code=code, session_id=NO_SESSION_ID), 0, True, [])
    if request.session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH):
        code = ErrorCode.INVALID_FETCH_SESSION_EPOCH
        return FetchResult(FetchResponse(error_code=code, session_id=NO_SESSION_ID), 0, True, [])
    follower = request.replica_id >= 0
    remaining_bytes = request.max_bytes if request.max_bytes > 0 else 0
    at_least_one = True  # KIP-74: the first partition with data gets a whole batch whatever its size
    ready_bytes = 0
    has_error = False
    watched: list[tuple[PartitionHandle, object]] = []
    topics_out = []
    seen: set[tuple[str, int]] = set()
    for topic in request.topics:
        partitions_out = []
        for fp in topic.partitions:
            if (topic.topic, fp.partition) in seen:
                # Asked twice: answered once.  (A second read of the same log could close the descriptor
                # of the first one's region, if retention deleted its segment in between.)
                partitions_out.append(_error_partition(fp.partition, ErrorCode.INVALID_REQUEST))
                has_error = True
                continue
            seen.add((topic.topic, fp.partition))
            handle, code = lookup(topic.topic, fp.partition)
            if handle is None:
                partitions_out.append(_error_partition(fp.partition, code))
                has_error = True
                continue
            follower_high_watermark = None
            if follower and follower_hook is not None:
                if first_read:
                    code = follower_hook.fetched(request.replica_id, handle, fp)
                    if code != ErrorCode.NONE:
                        partitions_out.append(_error_partition(fp.partition, code))
                        has_error = True
                        continue
                follower_high_watermark = follower_hook.high_watermark(handle)
            bound = follower_bound(handle) if follower else None
            data, size = _read_partition(
                handle,
                fp.partition,
                fp.fetch_offset,
                fp.current_leader_epoch,
                min(fp.partition_max_bytes, remaining_bytes),
                at_least_one,
                follower,
                follower_high_watermark,
            )
            partitions_out.append(data)
            if data.error_code != ErrorCode.NONE:
                has_error = True
                continue
            if follower and follower_hook is not None:
                follower_hook.answered(request.replica_id, handle, data.high_watermark)
            watched.append((handle, bound if bound is not None else data.high_watermark))
            if size:
                at_least_one = False
                ready_bytes += size
                remaining_bytes = max(0, remaining_bytes - size)
        topics_out.append(FetchableTopicResponse(topic=topic.topic, partitions=partitions_out))
    response = FetchResponse(error_code=ErrorCode.NONE, session_id=NO_SESSION_ID, responses=topics_out)
    return FetchResult(response, ready_bytes, has_error, watched)


def _read_partition(
    handle: PartitionHandle,
    index: int,
    fetch_offset: int,
    client_epoch: int,
    max_bytes: int,
    at_least_one: bool,
    follower: bool,
    follower_high_watermark: int | None = None,
) -> tuple[PartitionData, int]:
    page = handle.page
    high_watermark = page.high_watermark if follower_high_watermark is None else follower_high_watermark
    log_end_offset = page.log_end_offset
    try:
        code = handle.check_epoch(client_epoch)
        if code != ErrorCode.NONE:
            return _error_partition(index, code), 0
        log_start_offset = handle.log_start_offset
        data = PartitionData(
            partition_index=index,
            error_code=ErrorCode.NONE,
            high_watermark=high_watermark,
            last_stable_offset=high_watermark,  # no transactions: the last stable offset is the HW
            log_start_offset=log_start_offset,
            records=b"",
        )
        if fetch_offset < log_start_offset or fetch_offset > log_end_offset:
            data.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return data, 0
        bound = log_end_offset if follower else high_watermark
        if fetch_offset >= bound or (max_bytes <= 0 and not at_least_one):
            return data, 0
        piece = handle.reader.read(fetch_offset, max(max_bytes, 1), max_offset=bound)
    except OffsetOutOfRangeError:
        return _error_partition(index, ErrorCode.OFFSET_OUT_OF_RANGE), 0
    except SwapInProgressError as e:
        log.info("fetch %s at offset %d: answered empty, a clean is swapping segments: %s",
                 handle.name, fetch_offset, e)
        return _empty_partition(index, high_watermark, page.log_start_offset), 0
    except (ApplianceError, OSError) as e:
        log.error("fetch %s at offset %d: cannot read the log: %s", handle.name, fetch_offset, e)
        return _error_partition(index, ErrorCode.KAFKA_STORAGE_ERROR), 0
    size = piece.size_bytes
    if size == 0 or (size > max_bytes and not at_least_one):
        return data, 0
    data.records = FileRegion(piece.fd, piece.position, size)
    return data, size


# -- held requests ---------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class ParkedFetch:
    """A Fetch request held until ``min_bytes`` are ready or ``deadline_ms`` passes."""

    owner: object  # where to answer (the broker's response slot; opaque here)
    header: object  # the request header (opaque here)
    request: FetchRequest
    deadline_ms: float  # time.monotonic() * 1000
    watched: list[tuple[PartitionHandle, object]]
    done: bool = False


class FetchWaiters:
    """Held Fetch requests: a deadline heap, and per watched partition the requests waiting on it.

    :meth:`poll` costs one state-page load per watched partition, however many requests wait on it."""

    def __init__(self) -> None:
        self._by_deadline: list[tuple[float, int, ParkedFetch]] = []
        self._count = itertools.count()
        # (partition, follower?) -> [the bound last seen (None: check its waiters), the requests waiting]
        self._watch: dict[tuple[PartitionHandle, bool], list] = {}
        self.waiting = 0

    def add(self, parked: ParkedFetch) -> None:
        heapq.heappush(self._by_deadline, (parked.deadline_ms, next(self._count), parked))
        follower = parked.request.replica_id >= 0
        for handle, bound in parked.watched:
            entry = self._watch.setdefault((handle, follower), [bound, set()])
            if entry[0] != bound:
                entry[0] = None
            entry[1].add(parked)
        self.waiting += 1

    def next_deadline_ms(self) -> float | None:
        heap = self._by_deadline
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def poll(self, now_ms: float) -> list[ParkedFetch]:
        """Held requests whose deadline passed or one of whose partitions moved since they read it.

        The caller re-reads each and either answers it (then :meth:`finish`) or, if still short of
        ``min_bytes``, finishes it and adds it again with its new bounds."""
        due: dict[int, ParkedFetch] = {}
        for (handle, follower), entry in self._watch.items():
            if handle.closed:  # the topic was deleted or re-created: the re-read reports it
                now = None
            else:
                now = follower_bound(handle) if follower else handle.page.high_watermark
            if now is None or now != entry[0]:
                entry[0] = now
                for parked in entry[1]:
                    if not parked.done:
                        due[id(parked)] = parked
        heap = self._by_deadline
        while heap and (heap[0][2].done or heap[0][0] <= now_ms):
            parked = heapq.heappop(heap)[2]
            if not parked.done:
                due[id(parked)] = parked
        return list(due.values())

    def finish(self, parked: ParkedFetch) -> None:
        if parked.done:
            return
        parked.done = True
        self.waiting -= 1
        follower = parked.request.replica_id >= 0
        for handle, _ in parked.watched:
            key = (handle, follower)
            entry = self._watch.get(key)
            if entry is not None:
                entry[1].discard(parked)
                if not entry[1]:
                    del self._watch[key]

    def drop_owner(self, is_theirs: Callable[[object], bool]) -> None:
        """Forget the requests whose owner ``is_theirs`` (those of a closed connection)."""
        for _, _, parked in list(self._by_deadline):
            if not parked.done and is_theirs(parked.owner):
                self.finish(parked)

    def __len__(self) -> int:
        return self.waiting
