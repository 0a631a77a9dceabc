"""``Log.append_walked_as_follower`` (batches described by ``walk_batches`` arrays) decides exactly as
``Log.append_as_follower`` with headers: the same files byte for byte (log, offset and time indexes), rolls,
epochs, flushes and AppendInfo -- with few batches per call (rows through the general write) and many (one
``plan_index_entries`` call).  And the follower's copy of a Fetch answer
(``replicas.answer_copier.AnswerCopier``), whose plain case goes through it, appends what the batch-by-batch
walk appends, refusing what it refuses."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from replicas.answer_copier import AnswerCopier as _Copier
from replicas.answer_copier import walk_arrays
from replicas.fetcher import FetcherConfig, PartitionFetcher
from replicas.leader_connection import LeaderInfo
from storage.batch_builder import build_batch
from storage.batch_header import CRC_OFFSET
from storage.batch_reader import iter_batches
from storage.batch_scan import END, BatchArrays, walk_batches
from storage.errors import InvalidRecordError
from storage.log import Log
from storage.log_config import LONG_MAX, LogConfig

configs = st.builds(
    LogConfig,
    segment_bytes=st.sampled_from([900, 5000, 1 << 20]),
    index_interval_bytes=st.sampled_from([0, 64, 1000]),
    segment_index_bytes=st.sampled_from([24, 4096, 1 << 20]),
    segment_ms=st.sampled_from([1000, LONG_MAX]),
    flush_messages=st.sampled_from([5, LONG_MAX]),
    preallocate=st.booleans(),
)
batches_plan = st.lists(
    st.tuples(
        st.integers(1, 3),  # records
        st.integers(0, 40),  # value bytes
        st.sampled_from([0, 1, -3, 400, 1001]),  # ms step (-3: timestamps go back)
        st.integers(0, 15),  # 0: the leader epoch moves up
        st.booleans(),  # no timestamp (-1)
    ),
    min_size=1,
    max_size=150,
)


def _leader_bytes(root: Path, plan: list[tuple[int, int, int, int, bool]]) -> bytes:
    """A leader's log (epochs, timestamps as planned), its segments' bytes back to back."""
    leader = Log.open(root / "leader" / "t-0", LogConfig(segment_bytes=1 << 30))
    clock, epoch = 1_000_000, 0
    for records, value_bytes, step, bump, untimed in plan:
        clock += step
        epoch += bump == 0
        stamps = [-1 if untimed else clock] * records
        leader.append(bytearray(build_batch([b"v" * value_bytes] * records, timestamps=stamps)),
                      leader_epoch=epoch)
    leader.close()
    return b"".join(p.read_bytes() for p in sorted((root / "leader" / "t-0").glob("*.log")))


def _walk(view: memoryview, log_end_offset: int) -> BatchArrays:
    arrays = tuple(np.empty(len(view) // 61 + 1, dtype=np.int64) for _ in range(7))
    count, stop, code = walk_batches(np.frombuffer(view, dtype=np.uint8), 0, len(view), log_end_offset,
                                     log_end_offset, *arrays)
    assert (code, stop) == (END, len(view))
    return BatchArrays(*(a[:count] for a in arrays))


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, plan=batches_plan, cuts=st.lists(st.integers(1, 100), min_size=1, max_size=8))
def test_walked_append_decides_as_the_header_append(
    config: LogConfig, plan: list[tuple[int, int, int, int, bool]], cuts: list[int],
) -> None:
    with tempfile.TemporaryDirectory(prefix="walked-") as name:
        root = Path(name)
        data = memoryview(_leader_bytes(root, plan))
        positions = [p for p, _ in iter_batches(data)] + [len(data)]
        by_headers = Log.open(root / "headers" / "t-0", config)
        walked = Log.open(root / "walked" / "t-0", config)
        try:
            first, i = 0, 0
            while first < len(positions) - 1:  # groups of batches as Fetch answers would bring them
                last = min(len(positions) - 1, first + cuts[i % len(cuts)])
                i += 1
                piece = data[positions[first]:positions[last]]
                headers = [h for _, h in iter_batches(piece)]
                expected = by_headers.append_as_follower(piece, validated=headers)
                info = walked.append_walked_as_follower(piece, _walk(piece, walked.log_end_offset))
                assert info._replace(log_append_time_ms=0) == expected._replace(log_append_time_ms=0)
                shapes = [[s[:1] + s[2:] for s in log.segments] for log in (walked, by_headers)]  # no path
                assert shapes[0] == shapes[1]
                assert walked.leader_epoch_cache.entries == by_headers.leader_epoch_cache.entries
                flushed = [log.recovery_point == log.log_end_offset for log in (walked, by_headers)]
                assert flushed in ([True, True], [False, False])
                first = last
        finally:
            walked.close()
            by_headers.close()
        assert _files(root / "walked" / "t-0") == _files(root / "headers" / "t-0")


def test_walked_append_refuses_batches_we_hold_or_arrays_of_other_bytes(tmp_path: Path) -> None:
    data = memoryview(_leader_bytes(tmp_path, [(2, 10, 1, 1, False)] * 3))
    log = Log.open(tmp_path / "f" / "t-0", LogConfig())
    batches = _walk(data, 0)
    log.append_walked_as_follower(data[:int(batches.sizes[0])], BatchArrays(*(a[:1] for a in batches)))
    with pytest.raises(InvalidRecordError, match="base offset 0, below the log end offset 2"):
        log.append_walked_as_follower(data, batches)  # the first batch again
    rest = data[int(batches.sizes[0]):]
    with pytest.raises(InvalidRecordError, match="do not cover the buffer"):
        log.append_walked_as_follower(rest[:-1], _walk(rest, 2))
    assert (log.log_end_offset, log.size_bytes) == (2, int(batches.sizes[0]))
    log.append_walked_as_follower(rest, _walk(rest, 2))
    assert log.log_end_offset == 6
    log.close()


def _copy(tmp_path: Path, name: str, answer: memoryview, *,
          walked: bool) -> tuple[_Copier, bytes, tuple[int, int]]:
    """The copier after consuming ``answer`` as its final piece, the follower's log bytes, (its log end
    offset, the bytes the copier said it used)."""
    log = Log.open(tmp_path / name / "t-0", LogConfig(segment_bytes=1 << 30))
    fetcher = PartitionFetcher(log, LeaderInfo("127.0.0.1", 9, 0, 0), FetcherConfig(broker_id=1))
    copier = _Copier(log, "answer", 0, walk_arrays(), None)
    used = copier.consume(answer, True) if walked else copier._consume_checked(answer, True)
    end = log.log_end_offset
    fetcher.close()
    log.close()
    files = sorted((tmp_path / name / "t-0").glob("*.log"))
    return copier, b"".join(p.read_bytes() for p in files), (end, used)


@pytest.mark.parametrize("damage", ["none", "crc", "partial_tail", "crc_past_the_first_walk"])
def test_the_copy_of_an_answer_appends_what_the_batch_walk_appends(tmp_path: Path, damage: str) -> None:
    # 1100 small batches: more than one walk_batches call (1024 rows each)
    data = bytearray(_leader_bytes(tmp_path, [(1, 3, 1, 7, False)] * 1100))
    positions = [p for p, _ in iter_batches(memoryview(data))]
    if damage == "crc":
        data[positions[5] + CRC_OFFSET] ^= 1
    elif damage == "crc_past_the_first_walk":
        data[positions[1030] + CRC_OFFSET] ^= 1
    elif damage == "partial_tail":
        data = data[:-5]
    answer = memoryview(data)
    walked, walked_bytes, walked_end = _copy(tmp_path, "walked", answer, walked=True)
    checked, checked_bytes, checked_end = _copy(tmp_path, "checked", answer, walked=False)
    assert walked_bytes == checked_bytes
    assert walked_end == checked_end
    assert walked.problem == checked.problem
    assert (walked.appended_bytes, walked.partial_tail_bytes) == (checked.appended_bytes,
                                                                  checked.partial_tail_bytes)
    if damage == "none":
        assert walked.problem is None and len(walked_bytes) == len(data)
    elif damage == "partial_tail":
        assert walked.problem is None and walked.partial_tail_bytes > 0
    else:
        assert walked.problem is not None and "CRC" in walked.problem[0]
