"""The one-batch hot path (``Log.append``/``append_batches`` of one batch within the active segment's append
budget) decides exactly as the general path: the same rolls (segment.bytes, segment.ms, full indexes), the
same index entries, epochs, flushes and AppendInfo.  The oracle is a follower log fed the leader's stamped
bytes one batch at a time: ``append_as_follower`` always takes the general path."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from storage.batch_builder import build_batch
from storage.batch_header import check_batch
from storage.errors import LogLockedError, NotLeaderError
from storage.log import Log
from storage.log_config import LONG_MAX, LogConfig

configs = st.builds(
    LogConfig,
    segment_bytes=st.sampled_from([700, 3000, 20_000]),
    index_interval_bytes=st.sampled_from([0, 64, 1000]),
    segment_index_bytes=st.sampled_from([24, 36, 4096]),  # 3 or 4 offset entries: full indexes roll
    segment_ms=st.sampled_from([1000, LONG_MAX]),
    flush_messages=st.sampled_from([3, LONG_MAX]),
    preallocate=st.booleans(),
)
steps = st.lists(
    st.tuples(
        st.integers(1, 4),  # records
        st.integers(0, 120),  # value bytes
        st.sampled_from([0, 1, -1, 250, 499, 500, 501, 999, 1000, 1001]),  # ms steps, around segment.ms
        st.sampled_from(["append", "append_batches"]),
        st.integers(0, 12),  # 0: the leader epoch moves up by one before this batch
    ),
    min_size=1,
    max_size=60,
)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


def _shape(log: Log) -> list[tuple[int, int, int, int, bool]]:
    return [(s.base_offset, s.size_bytes, s.next_offset, s.max_timestamp, s.is_active) for s in log.segments]


@pytest.mark.slow  # 4-8 s: 80 examples of up to 60 appends into two logs
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, plan=steps, timestamps=st.booleans())
def test_hot_path_decides_as_the_general_path(config: LogConfig, plan: list[tuple[int, int, int, str, int]],
                                              timestamps: bool) -> None:
    no_timestamps = not timestamps and config.segment_ms == LONG_MAX  # without them age decides: the clock
    with tempfile.TemporaryDirectory(prefix="hotpath-") as root:
        leader = Log.open(Path(root) / "leader" / "t-0", config)
        follower = Log.open(Path(root) / "follower" / "t-0", config)
        clock, epoch = 1_000_000, 0
        try:
            for records, value_bytes, step, how, bump in plan:
                clock += step
                epoch += bump == 0
                stamps = [-1 if no_timestamps else clock] * records
                batch = bytearray(build_batch([b"v" * value_bytes] * records, timestamps=stamps))
                if how == "append":
                    info = leader.append(batch, leader_epoch=epoch)  # stamps ``batch`` in place
                else:
                    frame = memoryview(batch)  # a writable 1-D byte view, as a ring frame
                    header = check_batch(frame)
                    assert not isinstance(header, int)
                    info = leader.append_batches([frame], [header], leader_epoch=epoch)
                expected = follower.append_as_follower(batch)  # the leader's stamped bytes, as replicated
                assert info._replace(log_append_time_ms=0) == expected._replace(log_append_time_ms=0)
                assert _shape(leader) == _shape(follower)
                # flush.messages flushed both at this append, or neither (rolled segments are fsynced in the
                # background: the recovery point in between is timing)
                flushed = [log.recovery_point == log.log_end_offset for log in (leader, follower)]
                assert flushed in ([True, True], [False, False])
                assert leader.latest_epoch == follower.latest_epoch == epoch
            assert list(leader.batches()) == list(follower.batches())
        finally:
            leader.close()
            follower.close()
        assert _files(Path(root) / "leader" / "t-0") == _files(Path(root) / "follower" / "t-0")


def test_a_segment_fills_to_exactly_segment_bytes_on_the_hot_path(tmp_path: Path) -> None:
    batch = bytearray(build_batch([b"v" * 100], timestamps=[1000]))
    size = len(batch)
    for segment_bytes, per_segment in ((3 * size, 3), (3 * size - 1, 2), (3 * size + 1, 3)):
        log = Log.open(tmp_path / f"s{segment_bytes}" / "t-0", LogConfig(segment_bytes=segment_bytes))
        for _ in range(7):
            log.append(batch, leader_epoch=0)
        assert [s.size_bytes for s in log.segments][:-1] == [per_segment * size] * (7 // per_segment)
        log.close()


def test_the_hot_path_refuses_what_the_general_path_refuses(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig())
    log.append(bytearray(build_batch([b"a"])), leader_epoch=3)
    with pytest.raises(NotLeaderError, match="epoch 2, but epoch 3"):
        log.append(bytearray(build_batch([b"b"])), leader_epoch=2)
    frame = memoryview(bytearray(build_batch([b"c"])))
    header = check_batch(frame)
    assert not isinstance(header, int)
    with pytest.raises(NotLeaderError):
        log.append_batches([frame], [header], leader_epoch=1)
    log.close()
    with pytest.raises(LogLockedError, match="closed"):
        log.append_batches([frame], [header], leader_epoch=3)
    assert log.log_end_offset == 1
