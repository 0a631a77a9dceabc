"""The one-batch hot path of ``Log.append_batches`` / ``Log.append`` (``LogSegment.append_batch``): its index
entries across the pages faulted in ahead of it, and the writer checks the log makes before it (a forked
child, a closed log).  Its roll decisions against the general path:
tests/storage/test_log_prealloc_hot_path.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.batch_builder import build_batch
from storage.batch_header import check_batch
from storage.errors import LogLockedError
from storage.log import Log
from storage.log_config import LogConfig


def _frame(value: bytes, timestamp: int) -> memoryview:
    return memoryview(bytearray(build_batch([value], timestamps=[timestamp])))


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


@pytest.mark.parametrize("index_interval_bytes", [0, 150])
def test_index_entries_across_many_faulted_in_chunks(tmp_path: Path, index_interval_bytes: int) -> None:
    """3,000 appends with an offset-index entry for (nearly) every batch: 24 KB of .index, so the hot path
    writes through several chunks of pages faulted in ahead (one page first, then as much again as the
    file holds), and the time index grows too.  The oracle: a follower log fed the leader's stamped bytes
    (``append_as_follower`` never takes the hot path); both directories must end byte for byte equal."""
    config = LogConfig(index_interval_bytes=index_interval_bytes)
    leader = Log.open(tmp_path / "leader" / "t-0", config)
    follower = Log.open(tmp_path / "follower" / "t-0", config)
    for i in range(3000):
        frame = _frame(b"v" * (i % 50), 1_700_000_000_000 + i // 3)  # timestamps grow every third batch
        header = check_batch(frame)
        assert not isinstance(header, int)
        info = leader.append_batches([frame], [header], leader_epoch=0)
        assert (info.first_offset, info.batch_count) == (i, 1)
        follower.append_as_follower(frame)
    assert [s._replace(path='') for s in leader.segments] == [s._replace(path='') for s in follower.segments]
    for offset in (0, 1, 511, 512, 513, 1500, 2999):  # through the live indexes
        assert leader.read(offset, 1).position == follower.read(offset, 1).position
    assert leader.offset_for_timestamp(1_700_000_000_000 + 700) == follower.offset_for_timestamp(
        1_700_000_000_000 + 700)
    position_2000 = leader.read(2000, 1).position
    leader.close()
    follower.close()
    assert _files(tmp_path / "leader" / "t-0") == _files(tmp_path / "follower" / "t-0")
    reopened = Log.open(tmp_path / "leader" / "t-0", config)
    assert reopened.read(2000, 1).position == position_2000
    reopened.close()


def test_a_forked_child_cannot_append_on_the_hot_path(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig())
    frame = _frame(b"a", 1000)
    header = check_batch(frame)
    assert not isinstance(header, int)
    log.append_batches([frame], [header], leader_epoch=0)
    log.append_batches([frame], [header], leader_epoch=0)  # the budget is set: the next one is hot
    pid = os.fork()
    if pid == 0:  # the child: one writer per log, and it is the parent
        code = 1
        try:
            log.append_batches([frame], [header], leader_epoch=0)
        except LogLockedError as error:
            code = 0 if "forked process" in str(error) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert log.append_batches([frame], [header], leader_epoch=0).first_offset == 2  # the parent goes on
    log.close()
    with pytest.raises(LogLockedError, match="closed"):
        log.append_batches([frame], [header], leader_epoch=0)
    with Log.open(tmp_path / "t-0", LogConfig()) as reopened:
        assert reopened.log_end_offset == 3
