"""A large Fetch answer is appended while it arrives (``LeaderConnection.fetch``), not after.

Against the test leader over loopback TCP: the records of one answer are handed to the follower in pieces,
the logs still end byte-identical; a corrupt batch in the middle of an answer keeps the batches before it
(valid, at their offsets) and nothing from it on, and the rest is fetched again.
"""

from __future__ import annotations

from pathlib import Path

from test_fetcher import TOPIC, dirs, fast, segment_files, step_until
from tiny_leader import TinyLeader

from ipc.kafka import FetchPartition, FetchRequest, FetchTopic
from replicas.fetcher import FetchPhase, PartitionFetcher
from replicas.leader_connection import STREAM_CHUNK_BYTES, LeaderConnection
from storage.batch_builder import build_batch
from storage.log import Log
from storage.log_config import LogConfig

BIG = LogConfig(segment_bytes=1 << 30, index_interval_bytes=4096)
__all__ = ["dirs"]  # the fixture, imported for these tests


def fill(log: Log, megabytes: int) -> None:
    batch = build_batch([b"%06d" % i + b"x" * 994 for i in range(50)])  # ~50 KB per batch
    while log.size_bytes < megabytes << 20:
        log.append(bytearray(batch), leader_epoch=0)


def test_a_large_answer_is_handed_over_in_pieces_and_the_copy_is_identical(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, BIG) as leader_log:
        fill(leader_log, 3)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        pieces: list[tuple[int, bool]] = []

        def record(view: memoryview, final: bool) -> int:
            pieces.append((len(view), final))
            return 0  # use nothing: every piece starts at the records' first byte

        with LeaderConnection.connect(leader.host, leader.port) as conn:
            partition = FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=8 << 20)
            request = FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=1, max_bytes=8 << 20,
                                   topics=[FetchTopic(TOPIC, [partition])])
            answer, streamed = conn.fetch(request, record)
        size = len(answer.responses[0].partitions[0].records)
        assert streamed and size > 3 << 20
        assert len(pieces) >= 2 and pieces[-1] == (size, True)
        assert all(not final and STREAM_CHUNK_BYTES <= n < size for n, final in pieces[:-1])
        with Log.open(follower_dir, BIG) as follower_log:
            fetcher = PartitionFetcher(follower_log, leader.info(), fast(replica_fetch_max_bytes=8 << 20))
            step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
            outcome = fetcher.step()
            assert outcome.action == "appended" and follower_log.log_end_offset == end
            fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_a_corrupt_batch_mid_answer_keeps_what_came_before_and_nothing_after(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, BIG) as leader_log:
        fill(leader_log, 3)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, BIG) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        fetcher = PartitionFetcher(follower_log, leader.info(), fast(replica_fetch_max_bytes=8 << 20))
        step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
        leader.corrupt_next_fetch = True
        leader.corrupt_position = 2 << 20  # inside a batch about two thirds in
        outcome = fetcher.step()
        assert outcome.action == "backoff" and "stored CRC" in outcome.detail
        kept = follower_log.log_end_offset
        assert 0 < kept < end
        assert f"nothing of this answer from offset {kept} on was appended" in outcome.detail
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)
