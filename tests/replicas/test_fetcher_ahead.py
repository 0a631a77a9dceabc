"""Fetching ahead: below the high watermark a follower sends its next Fetch before appending the answer it
has; the leader never acts on a fetch offset the follower does not hold yet; a failed answer discards the
Fetch sent behind it.

The leader is the test leader over loopback TCP (``tiny_leader.TinyLeader``), recording every follower
Fetch it receives: the fetch offset, its high watermark then, and whether the follower was in the ISR
after it.  The follower's ``on_log_end_offset`` callback records what the follower really held; it first
waits (briefly) for the leader to have received a Fetch at the new log end, so a Fetch sent *before* that
append is seen to arrive before the follower held what it asks past.  ``LeaderConnection``'s two halves
(``send_fetch``/``receive_fetch``) are also run against scripted peers: answers in order, malformed answers.
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fetcher import SMALL, TOPIC, append_batches, batches_from, dirs, fast, segment_files, step_until
from test_leader_connection import Close, api_versions, connect, scripted_leader
from tiny_leader import TinyLeader

from ipc.kafka import (
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionData,
    Request,
    encode_response,
)
from replicas.answer_copier import next_offset_after as _next_offset_after
from replicas.answer_copier import whole_batches as _whole_batches
from replicas.fetcher import FetchPhase, PartitionFetcher
from storage.batch_builder import build_batch
from storage.batch_reader import iter_batches
from storage.errors import BrokerConnectionError, CorruptRecordError, ProtocolError, RequestTimeoutError
from storage.log import Log

__all__ = ["dirs"]  # the fixture, imported for these tests


class Claim(NamedTuple):
    fetch_offset: int
    held: int  # the follower's log end offset as last reported when the Fetch arrived
    high_watermark: int  # the leader's, when the Fetch arrived
    in_isr_after: bool


class ClaimsLeader(TinyLeader):
    """The test leader, recording each follower Fetch next to what the follower held then."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.claims: list[Claim] = []
        self.held = 0
        self.events = threading.Condition()

    def follower_appended(self, log_end_offset: int, wait_s: float) -> None:
        """The follower's on_log_end_offset: wait up to ``wait_s`` for a Fetch at this offset, then record
        the follower as holding it."""
        with self.events:
            self.events.wait_for(lambda: any(c.fetch_offset >= log_end_offset for c in self.claims), wait_s)
            self.held = log_end_offset

    def _fetch_partition(self, replica_id: int, topic: str, fp: Any, readers: Any, deadline_ms: int) -> Any:
        entry = self.partitions[(topic, fp.partition)]
        with self.lock:
            high_watermark = entry.state.high_watermark
        answer = super()._fetch_partition(replica_id, topic, fp, readers, deadline_ms)
        with self.events:
            in_isr = replica_id in entry.state.isr
            self.claims.append(Claim(fp.fetch_offset, self.held, high_watermark, in_isr))
            self.events.notify_all()
        return answer


def catch_up(leader_dir: Path, follower_dir: Path, *, isr: list[int], pipeline: bool,
             wait_s: float) -> tuple[ClaimsLeader, int]:
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 30, epoch=0, seed=5)
        end = leader_log.log_end_offset
    with ClaimsLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=isr)
        leader.tick()  # the high watermark follows the log end (an ISR of one) from the start
        fetcher = PartitionFetcher(
            follower_log, leader.info(), fast(replica_fetch_max_bytes=2048, pipeline_fetches=pipeline),
            on_log_end_offset=lambda offset: leader.follower_appended(offset, wait_s))
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        assert fetcher.step().action == "empty"  # a Fetch at the log end: the leader learns it holds all
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)
    assert batches_from(follower_dir) == batches_from(leader_dir)
    return leader, end


def test_catching_up_below_the_high_watermark_fetches_ahead_and_claims_only_below_it(
    dirs: tuple[Path, Path],
) -> None:
    leader, end = catch_up(*dirs, isr=[0], pipeline=True, wait_s=1.0)
    ahead = [c for c in leader.claims if c.fetch_offset > c.held]
    assert len(ahead) >= 3  # every answer but the last (at the high watermark) had the next Fetch sent ahead
    for claim in ahead:  # a claim not yet true moves nothing: below the HW, and not into the ISR
        assert claim.fetch_offset < claim.high_watermark == end
        assert not claim.in_isr_after
    assert leader.claims[-1].in_isr_after  # the follower joins once it holds the high watermark


@pytest.mark.parametrize(("isr", "pipeline"), [([0, 1], True), ([0], False)],
                         ids=["at-the-high-watermark", "pipeline_fetches-off"])
def test_otherwise_every_fetch_offset_is_held(dirs: tuple[Path, Path], isr: list[int],
                                              pipeline: bool) -> None:
    leader, _ = catch_up(*dirs, isr=isr, pipeline=pipeline, wait_s=0.15)
    assert len(leader.claims) >= 4
    assert all(c.fetch_offset <= c.held for c in leader.claims)


def test_an_answer_that_fails_discards_the_fetch_sent_behind_it(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 60, epoch=0, seed=6)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=[0])
        leader.tick()  # the high watermark follows the log end (an ISR of one) from the start
        fetcher = PartitionFetcher(follower_log, leader.info(), fast(replica_fetch_max_bytes=2048))
        step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
        assert fetcher.step().action == "appended"  # and the next Fetch went out ahead of the append
        leader.corrupt_next_fetch = True  # an answer while another Fetch is in flight behind it
        outcomes = step_until(fetcher, lambda: "stored CRC" in fetcher.last_error)
        assert outcomes[-1].action == "backoff"
        held = follower_log.log_end_offset
        assert 0 < held < end
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        fetcher.close()
    assert len(leader._connections) == 2  # the connection holding the unused answer was dropped
    assert segment_files(follower_dir) == segment_files(leader_dir)


# --- LeaderConnection: two Fetches in flight, malformed answers ------------------------------------------

BATCH_LIST = [bytes(build_batch([b"v%d" % i] * 3, base_offset=3 * i)) for i in range(4)]  # 3 records each
BATCHES = b"".join(BATCH_LIST)


def fetch_request(offset: int) -> FetchRequest:
    partition = FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
    return FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                        topics=[FetchTopic(TOPIC, [partition])])


def fetch_answer(request: Request, records: bytes = BATCHES, high_watermark: int = 12) -> bytes:
    data = PartitionData(partition_index=0, error_code=0, high_watermark=high_watermark,
                         last_stable_offset=high_watermark, log_start_offset=0, records=records)
    return encode_response(request.header, FetchResponse(responses=[FetchableTopicResponse(TOPIC, [data])]))


def test_fetches_in_flight_are_answered_in_order_and_the_next_may_go_out_before_the_tail() -> None:
    offsets: list[int] = []

    def answer(request: Request) -> bytes:
        offset = request.body.topics[0].partitions[0].fetch_offset
        offsets.append(offset)
        return fetch_answer(request, b"".join(BATCH_LIST[offset // 3:]))

    with scripted_leader(api_versions, answer, answer, answer) as address, connect(address) as conn:
        first = conn.send_fetch(fetch_request(0))
        second = conn.send_fetch(fetch_request(3))  # two in flight
        pieces: list[tuple[bytes, bool]] = []

        def keep(view: memoryview, final: bool) -> int:
            pieces.append((bytes(view), final))
            return len(view)

        sent_behind: list[Any] = []
        answer_0, streamed = conn.receive_fetch(
            first, keep, on_complete=lambda a, rest: sent_behind.append(conn.send_fetch(fetch_request(6))))
        assert streamed and bytes(answer_0.responses[0].partitions[0].records) == BATCHES
        assert answer_0.responses[0].partitions[0].high_watermark == 12
        assert b"".join(p for p, _ in pieces) == BATCHES and pieces[-1][1]
        assert conn.in_flight == 2
        answer_1, _ = conn.receive_fetch(second, keep)
        assert bytes(answer_1.responses[0].partitions[0].records) == b"".join(BATCH_LIST[1:])
        answer_2, _ = conn.receive_fetch(sent_behind[0], keep)
        assert bytes(answer_2.responses[0].partitions[0].records) == b"".join(BATCH_LIST[2:])
    assert offsets == [0, 3, 6]


@settings(max_examples=80, deadline=None)
@given(how=st.sampled_from(["flip", "cut", "trail"]), where=st.integers(0, 1 << 16), xor=st.integers(1, 255),
       extra=st.binary(min_size=1, max_size=8))
def test_damaged_fetch_answers_raise_only_the_connections_errors(how: str, where: int, xor: int,
                                                                 extra: bytes) -> None:
    def damaged(request: Request) -> bytes:
        frame = bytearray(fetch_answer(request))
        if how == "flip":  # any byte after the size prefix
            frame[4 + where % (len(frame) - 4)] ^= xor
        elif how == "cut":
            frame = frame[:where % len(frame)]
        else:
            frame += extra
            struct.pack_into(">i", frame, 0, len(frame) - 4)
        return Close(frame)

    with scripted_leader(api_versions, damaged) as address, connect(address, timeout_ms=500) as conn:
        used: list[bytes] = []
        try:
            answer, streamed = conn.fetch(fetch_request(0), lambda v, final: used.append(bytes(v)) or 0)
        except (ProtocolError, BrokerConnectionError, RequestTimeoutError):
            assert conn.closed
        except Exception as error:  # the assertion names what escaped
            raise AssertionError(f"{type(error).__name__} escaped: {error}") from error
        else:
            records = answer.responses[0].partitions[0].records if answer.responses else None
            if streamed:  # what was handed over is exactly the answer's records
                assert used and used[-1] == bytes(records)


def test_a_fetch_answer_with_the_wrong_correlation_id_is_refused() -> None:
    def wrong(request: Request) -> bytes:
        return fetch_answer(request._replace(header=request.header._replace(
            correlation_id=request.header.correlation_id + 1)))

    with scripted_leader(api_versions, wrong) as address, connect(address) as conn:
        with pytest.raises(ProtocolError, match=r"response correlation id \d+, expected \d+"):
            conn.fetch(fetch_request(0), lambda v, final: 0)
        assert conn.closed


# --- the two walks over an answer's records, against iter_batches ---------------------------------------

def oracle_walk(records: bytes, *, verify_crc: bool) -> list[tuple[int, Any]]:
    return list(iter_batches(records, verify_crc=verify_crc, allow_truncated_tail=True))


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=0, max_size=6), cut=st.integers(0, 1 << 12),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 1 << 12), st.integers(1, 255))),
       tail=st.binary(max_size=80))
def test_the_record_walks_agree_with_iter_batches(counts: list[int], cut: int,
                                                  flip: tuple[int, int] | None, tail: bytes) -> None:
    offset, whole = 0, b""
    for count in counts:
        whole += bytes(build_batch([b"r%d" % i for i in range(count)], base_offset=offset))
        offset += count
    cut_records = whole[:len(whole) - cut % (len(whole) + 1)]
    expected = oracle_walk(cut_records, verify_crc=True)  # whole valid batches, then maybe a partial one
    assert list(_whole_batches(memoryview(cut_records), "answer")) == expected
    end = expected[-1][1].base_offset + expected[-1][1].last_offset_delta + 1 if expected else 0
    assert _next_offset_after(memoryview(cut_records), 0) == end
    assert _next_offset_after(memoryview(cut_records), end + 5) == end + 5
    damaged = bytearray(whole + tail)
    if flip is not None and damaged:
        damaged[flip[0] % len(damaged)] ^= flip[1]
    try:
        oracle: list[tuple[int, Any]] | CorruptRecordError = oracle_walk(bytes(damaged), verify_crc=True)
    except CorruptRecordError as error:
        oracle = error
    try:
        walked: list[tuple[int, Any]] | CorruptRecordError = list(_whole_batches(memoryview(damaged),
                                                                                 "buffer"))
    except CorruptRecordError as error:
        walked = error
    if isinstance(oracle, CorruptRecordError):
        assert isinstance(walked, CorruptRecordError) and str(walked) == str(oracle)
    else:
        assert walked == oracle
    assert _next_offset_after(memoryview(damaged), 3) >= 3  # garbage never raises; it only ends the walk
