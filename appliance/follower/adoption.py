"""Adopting the leader's cleaned bytes: a thread of ``appliance replica`` that makes each followed log of a
compacted topic the leader's, byte for byte, below the follower's high watermark.

Theory of operation
-------------------
Only the leader cleans a compacted log (its cleaner process, ``appliance.cleaner``).  Where it has
swapped a cleaned segment in below what the follower holds, the follower replaces its own segments of
those offsets by the leader's cleaned segment, copied as it is.  One :class:`Adopter` thread per replica
process does it, every :data:`ADOPT_INTERVAL_MS`, for every followed partition whose topic's
``cleanup.policy`` holds ``compact``:

1. **ask**: one DescribeSegments request per leader (the appliance's own API,
   ``appliance.broker.segment_requests``) for those partitions, with checksums: the leader's closed
   segments (base offset, next base offset, size, CRC-32C of the ``.log``).  The answer also refreshes
   where the fetcher rolls (``PartitionFetcher.leader_bases``);
2. **compare**: the follower's closed segments, described the same way, and ``replicas.segment_match
   .plan_adoptions``: the groups of segments that differ, each replaced by one leader segment, wholly below
   the follower's high watermark and its active segment (so only records the follower holds, and the leader
   has acknowledged, are replaced, each by the leader's cleaned version of them: every key's latest stays);
3. **copy**: Fetch (as a consumer, ``replica_id`` -1: it claims nothing to the leader's replica state)
   from the segment's base offset until its size has arrived; each Fetch answer of the leader comes from
   one segment file, sent as it is (sendfile).  The batches whose offsets lie in the segment are written to
   ``<base>.log.cleaned`` in the follower's directory, fsynced, and the file's size and CRC-32C compared
   with the leader's description: a leader swap during the copy (or any other difference) shows there, and
   the file is unlinked and the group tried again next round;
4. **swap**: holding the partition's ``replicas.log_guard.LogGuard`` lock (the fetcher holds it for each
   append, truncation and log start move), the replaced segments are checked to be still consecutive closed
   segments of the sizes described (``appliance.server.writer_admin.check_replaced``: else the swap is
   refused and the file unlinked), then ``Log.swap_cleaned`` swaps it in with the renames and recovery of a
   clean's swap (``storage.clean_swap``; docs/storage.md, "Compaction").

A copy and its swap hold ``LogGuard.cleaning``: a truncation below the high watermark or the partition's
closing waits for it, and asks it to stop between Fetches (``LogGuard.check_cut``).  A SIGKILL of the
replica anywhere leaves a ``*.cleaned`` file or an interrupted swap, which ``Log.open`` at its next start
undoes or finishes (named fault points: ``appliance.follower.adopt_faults`` and
``storage.clean_faults``); the next rounds adopt again what still differs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import crc32c

from appliance.config.server_config import Config
from appliance.follower.adopt_faults import ADOPT_FAULTS
from appliance.server.writer_admin import check_replaced
from ipc.kafka import ErrorCode, FetchPartition, FetchRequest, FetchTopic, error_name
from ipc.kafka.appliance_messages import DescribeSegmentsRequest, DescribeSegmentsTopic
from replicas.fetcher import PartitionFetcher
from replicas.leader_connection import LeaderConnection
from replicas.log_guard import LogGuard, PassStopped
from replicas.segment_match import Adoption, SegmentDigest, checksum_file, plan_adoptions
from storage.batch_header import BATCH_LENGTH_OFFSET, HEADER_SIZE, LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD
from storage.clean_swap import SwapGroup, cleaned_paths
from storage.errors import ApplianceError, ProtocolError, RequestTimeoutError, describe_os_error
from storage.log import Log

__all__ = ["ADOPT_INTERVAL_MS", "AdoptTarget", "Adopter"]

ADOPT_INTERVAL_MS: Final = 1000  # between rounds (not a setting: Kafka's followers do not adopt)
_FETCH_BYTES: Final = 8 << 20  # at most this much per Fetch of a copy
_JOIN_TIMEOUT_S: Final = 10.0
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")

_log = logging.getLogger("appliance.replica")


@dataclass(frozen=True, eq=False)
class AdoptTarget:
    """One followed partition of a compacted topic: its log, the guard it shares with its fetcher, and the
    fetcher (its leader, high watermark, credentials and where it rolls)."""

    topic: str
    partition: int
    log: Log
    guard: LogGuard
    fetcher: PartitionFetcher

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


class _Skip(Exception):
    """Internal: this partition's adoption ends for this round (logged by whoever raises it)."""


class Adopter:
    """The adoption thread of one replica process (see the module docstring).  ``targets`` lists the
    followed partitions of compacted topics now (called from the thread)."""

    def __init__(self, config: Config, node_id: int, targets: Callable[[], Sequence[AdoptTarget]]) -> None:
        self.config = config
        self.who = f"replica {node_id}"
        self.node_id = node_id
        self._targets = targets
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connections: dict[tuple[str, int], LeaderConnection] = {}
        self._reported: set[tuple[str, int, int]] = set()  # unadoptable ranges already logged
        self.adopted = 0  # segments swapped in

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="adoption", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread: a copy in progress ends at its next Fetch (nothing of it swapped in)."""
        self._stop.set()
        for conn in list(self._connections.values()):
            conn.shutdown()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                _log.error("%s: the adoption thread did not stop in %.0f s", self.who, _JOIN_TIMEOUT_S)
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except Exception:  # a bug must not end the adoptions of every other log
                _log.exception("%s: an adoption round failed", self.who)
            self._stop.wait(ADOPT_INTERVAL_MS / 1000)

    # -- one round -------------------------------------------------------------------------------------------

    def round(self) -> int:
        """Ask each leader about the partitions it leads here and adopt what differs; segments adopted."""
        by_leader: dict[tuple[str, int], list[AdoptTarget]] = {}
        for target in self._targets():
            leader = target.fetcher.leader
            if leader is not None and not target.guard.closed:
                by_leader.setdefault((leader.host, leader.port), []).append(target)
        adopted = 0
        for address, targets in by_leader.items():
            try:
                adopted += self._round_with(address, targets)
            except (OSError, ProtocolError, RequestTimeoutError) as e:
                self._drop(address)
                if not self._stop.is_set():
                    _log.info("%s: adoption from %s: %s; again next round", self.who, _where(address), e)
        self.adopted += adopted
        return adopted

    def _round_with(self, address: tuple[str, int], targets: list[AdoptTarget]) -> int:
        conn = self._connection(address, targets[0])
        answer = conn.request(DescribeSegmentsRequest(
            replica_id=self.node_id, checksums=True,
            topics=[DescribeSegmentsTopic(name=t.topic, partitions=[t.partition]) for t in targets]),
            version=0)
        if answer.error_code != ErrorCode.NONE:
            _log.warning("%s: DescribeSegments to %s: %s: %s", self.who, _where(address),
                         error_name(answer.error_code), answer.error_message)
            return 0
        described = {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}
        adopted = 0
        for target in targets:
            found = described.get((target.topic, target.partition))
            if found is None or found.error_code != ErrorCode.NONE:
                continue  # retried next round (a swap in progress at the leader, a leader change)
            theirs = [SegmentDigest(s.base_offset, s.next_offset, s.size_bytes, s.checksum)
                      for s in found.segments]
            target.fetcher.leader_bases.update(theirs, found.active_base_offset)
            try:
                adopted += self._adopt_partition(conn, target, theirs)
            except _Skip:
                continue
        return adopted

    def _adopt_partition(self, conn: LeaderConnection, target: AdoptTarget,
                         theirs: list[SegmentDigest]) -> int:
        ours, limit = self._our_segments(target)
        plan = plan_adoptions(theirs, ours, limit)
        for start, end in plan.unadoptable:
            if (target.name, start, end) not in self._reported:
                self._reported.add((target.name, start, end))
                _log.warning("%s: %s: offsets %d-%d differ from the leader's, whose segments there begin "
                             "elsewhere than this replica's: left as they are (same records; remove this "
                             "replica's copy of the partition to copy it afresh)", self.who, target.name,
                             start, end - 1)
        adopted = 0
        for adoption in plan.adoptions:
            if self._stop.is_set():
                break
            with target.guard.cleaning():
                if not self._copy(conn, target, adoption.segment):
                    break
                if ADOPT_FAULTS.armed:
                    ADOPT_FAULTS.check("adopt.copied", target.log.directory)
                sizes = [s.size_bytes for s in ours if s.base_offset in adoption.replaced]
                if not self._swap(target, adoption, sizes):
                    break
            adopted += 1
        return adopted

    def _our_segments(self, target: AdoptTarget) -> tuple[list[SegmentDigest], int]:
        """The follower's closed segments described as the leader's are, and the offset below which a
        group may be adopted (its high watermark and its active segment)."""
        with target.guard.lock:
            if target.guard.closed:
                raise _Skip
            segments = target.log.segments
            high_watermark = target.fetcher.high_watermark
        ours = []
        try:
            for segment, after in itertools.pairwise(segments):
                size, crc = checksum_file(segment.path)
                ours.append(SegmentDigest(segment.base_offset, after.base_offset, size, crc))
        except FileNotFoundError:
            raise _Skip from None  # replaced or deleted meanwhile (retention, a truncation): next round
        return ours, min(high_watermark, segments[-1].base_offset)

    # -- copy and swap ---------------------------------------------------------------------------------------

    def _copy(self, conn: LeaderConnection, target: AdoptTarget, segment: SegmentDigest) -> bool:
        """Copy the leader's ``segment`` into ``<base>.log.cleaned``; True if it is the leader's, byte for
        byte (else the file is unlinked)."""
        path = cleaned_paths(target.log.directory, segment.base_offset)[0]
        try:
            written, crc = self._fetch_into(conn, target, segment, path)
        except PassStopped:
            _unlink(path)
            return False
        except BaseException:
            _unlink(path)
            raise
        if (written, crc) != (segment.size_bytes, segment.checksum):
            _unlink(path)
            _log.info("%s: %s: the copy of the leader's segment %d is not what it described (%d bytes, CRC "
                      "%d; described %d bytes, CRC %d): it changed meanwhile; again next round", self.who,
                      target.name, segment.base_offset, written, crc, segment.size_bytes, segment.checksum)
            return False
        return True

    def _fetch_into(self, conn: LeaderConnection, target: AdoptTarget, segment: SegmentDigest,
                    path: str) -> tuple[int, int]:
        """Fetch the batches of ``segment`` into a new file at ``path``; (bytes written, their CRC-32C)."""
        written, crc, offset = 0, 0, segment.base_offset
        with open(path, "wb") as out:
            while written < segment.size_bytes:
                target.guard.check_cut()
                if self._stop.is_set():
                    raise PassStopped("the replica is stopping")
                records = self._fetch(conn, target, offset, segment.size_bytes - written)
                whole, offset = _batches_below(records, segment.next_offset)
                if not whole:
                    break  # the leader holds no more of it: its segment changed (a swap); the check says so
                out.write(whole)
                crc = crc32c.crc32c(whole, crc)
                if written == 0 and ADOPT_FAULTS.armed:
                    out.flush()
                    ADOPT_FAULTS.check("adopt.fetched", path)
                written += len(whole)
            out.flush()
            os.fsync(out.fileno())
        return written, crc

    def _fetch(self, conn: LeaderConnection, target: AdoptTarget, offset: int, remaining: int) -> memoryview:
        max_bytes = max(1, min(remaining, _FETCH_BYTES))
        answer = conn.request(FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FetchTopic(topic=target.topic, partitions=[FetchPartition(
                partition=target.partition, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                partition_max_bytes=max_bytes)])]))  # fmt: skip
        data = answer.responses[0].partitions[0] if answer.responses else None
        code = answer.error_code if data is None else data.error_code
        if data is None or code != ErrorCode.NONE:
            _log.info("%s: %s: Fetch at %d for an adoption answered %s; again next round", self.who,
                      target.name, offset, error_name(code))
            raise PassStopped(error_name(code))
        return memoryview(data.records or b"")

    def _swap(self, target: AdoptTarget, adoption: Adoption, sizes: list[int]) -> bool:
        """Swap the copied segment in for ``adoption.replaced`` holding the guard's lock; False (the file
        unlinked) if the log changed meanwhile or is closing."""
        log = target.log
        base = adoption.segment.base_offset
        path = cleaned_paths(log.directory, base)[0]
        with target.guard.lock:
            refused = "the partition is closing" if target.guard.closed else None
            if refused is None:
                segments = log.segments
                size_of = {s.base_offset: s.size_bytes for s in segments}
                refused = check_replaced(log.directory, [s.base_offset for s in segments], target.name, base,
                                         adoption.replaced, sizes, lambda b: size_of[b])
            if refused is None:
                try:
                    log.swap_cleaned([SwapGroup(base, tuple(adoption.replaced))])
                except (OSError, ApplianceError) as e:  # finished or undone on the spot by the log
                    refused = f"swapping in the leader's segment {base}: {_describe(e)}"
        if refused is not None:
            _unlink(path)
            _log.info("%s: %s: the leader's segment %d is not adopted: %s; again next round", self.who,
                      target.name, base, refused)
            return False
        _log.info("%s: %s: adopted the leader's segment %d-%d (%d bytes) for segments %s", self.who,
                  target.name, base, adoption.segment.next_offset - 1, adoption.segment.size_bytes,
                  list(adoption.replaced))
        return True

    # -- connections -----------------------------------------------------------------------------------------

    def _connection(self, address: tuple[str, int], target: AdoptTarget) -> LeaderConnection:
        conn = self._connections.get(address)
        if conn is None or conn.closed:
            conn = LeaderConnection.connect(address[0], address[1], client_id="appliance-replica-adoption",
                                            timeout_ms=self.config.replica_socket_timeout_ms,
                                            sasl_plain=target.fetcher.config.sasl_plain)
            self._connections[address] = conn
        return conn

    def _drop(self, address: tuple[str, int]) -> None:
        conn = self._connections.pop(address, None)
        if conn is not None:
            conn.close()


def _batches_below(records: memoryview, end_offset: int) -> tuple[bytes, int]:
    """The whole batches at the start of ``records`` whose base offsets are below ``end_offset``, and the
    offset after the last of them (where the next Fetch starts)."""
    position, next_offset = 0, -1
    size = len(records)
    while position + HEADER_SIZE <= size:
        base = _INT64.unpack_from(records, position)[0]
        total = _INT32.unpack_from(records, position + BATCH_LENGTH_OFFSET)[0] + LOG_OVERHEAD
        if base >= end_offset or total < HEADER_SIZE or position + total > size:
            break
        next_offset = base + _INT32.unpack_from(records, position + LAST_OFFSET_DELTA_OFFSET)[0] + 1
        position += total
    return bytes(records[:position]), next_offset


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _describe(error: BaseException) -> str:
    return describe_os_error(error) if isinstance(error, OSError) else str(error)


def _where(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}" if address[1] else address[0]

