"""``Log.append_batches``: the writer's zero-copy append of already-validated batches.

The oracle is ``Log.append`` (which validates): the same batches appended either way, with the same
configuration, must give the same answers and byte-identical directories, whatever rolls, index limits and
``IOV_MAX`` splits happen on the way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from batchgen import batch_of_size, build_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.append_plan import AppendInfo
from storage.batch_header import check_batch, parse_header, validate_batch
from storage.errors import LogLockedError, NotLeaderError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader
from storage.segment_file import IOV_MAX

TEMPLATES = [bytes(batch_of_size(size, records=records, timestamp_ms=1_700_000_000_000 + size))
             for size, records in ((80, 1), (150, 3), (333, 2), (700, 5), (1200, 1))]


def _dir_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != ".lock"}


def _ring(batches: list[bytes]) -> tuple[np.ndarray, list[memoryview]]:
    """The batches laid out back to back in one writable uint8 array (like ring memory), with a view of
    each and a gap byte between them, so nothing depends on their being contiguous."""
    memory = np.zeros(sum(len(b) + 1 for b in batches), dtype=np.uint8)
    views = []
    at = 0
    for batch in batches:
        memory[at : at + len(batch)] = np.frombuffer(batch, dtype=np.uint8)
        views.append(memoryview(memory)[at : at + len(batch)])
        at += len(batch) + 1
    return memory, views


def _same_answer(got: AppendInfo, expected: AppendInfo) -> None:
    assert got._replace(log_append_time_ms=0) == expected._replace(log_append_time_ms=0)


def _append_both_ways(trusted: Log, oracle: Log, batches: list[bytes], epoch: int) -> list[memoryview]:
    _, views = _ring(batches)
    headers = [check_batch(view) for view in views]
    assert all(not isinstance(h, int) for h in headers)
    got = trusted.append_batches(views, headers, leader_epoch=epoch)  # type: ignore[arg-type]
    expected = oracle.append(bytearray(b"".join(batches)), leader_epoch=epoch)
    _same_answer(got, expected)
    return views


CONFIGS = [
    LogConfig(segment_bytes=1 << 20),
    LogConfig(segment_bytes=2000, index_interval_bytes=64, segment_index_bytes=4096),
    LogConfig(segment_bytes=700, index_interval_bytes=0, segment_index_bytes=24),  # index-full rolls
    LogConfig(segment_bytes=300, index_interval_bytes=1000, segment_index_bytes=96),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=st.sampled_from(CONFIGS),
    calls=st.lists(st.tuples(st.lists(st.integers(0, len(TEMPLATES) - 1), min_size=1, max_size=12),
                             st.integers(0, 1)), min_size=1, max_size=8),
)
def test_the_same_as_a_validating_append(tmp_path_factory: pytest.TempPathFactory, config: LogConfig,
                                         calls: list[tuple[list[int], int]]) -> None:
    root = tmp_path_factory.mktemp("same")
    trusted = Log.open(root / "a" / "t-0", config)
    oracle = Log.open(root / "b" / "t-0", config)
    epoch = 0
    for picks, bump in calls:
        epoch += bump
        views = _append_both_ways(trusted, oracle, [TEMPLATES[i] for i in picks], epoch)
        for view, base in zip(views, _bases(views, trusted.log_end_offset), strict=True):
            header = validate_batch(view)  # stamped in place, CRC still valid
            assert (header.base_offset, header.partition_leader_epoch) == (base, epoch)
    assert trusted.log_end_offset == oracle.log_end_offset
    assert [s[0] for s in trusted.segments] == [s[0] for s in oracle.segments]
    trusted.close()
    oracle.close()
    assert _dir_bytes(root / "a" / "t-0") == _dir_bytes(root / "b" / "t-0")


def _bases(views: list[memoryview], end: int) -> list[int]:
    counts = [parse_header(v).last_offset_delta + 1 for v in views]
    first = end - sum(counts)
    return [first + sum(counts[:i]) for i in range(len(counts))]


@pytest.mark.parametrize("segment_bytes", [1 << 30, 250_000])
def test_more_buffers_than_iov_max_in_one_call(tmp_path: Path, segment_bytes: int) -> None:
    """2.5 x IOV_MAX batches in one call: several writev calls, with a roll after more than IOV_MAX of them
    or no roll."""
    count = IOV_MAX * 5 // 2
    batches = [TEMPLATES[i % 3] for i in range(count)]
    config = LogConfig(segment_bytes=segment_bytes)
    trusted = Log.open(tmp_path / "a" / "t-0", config)
    oracle = Log.open(tmp_path / "b" / "t-0", config)
    _append_both_ways(trusted, oracle, batches, 3)
    assert len(trusted.segments) == (1 if segment_bytes == 1 << 30 else 2)
    assert trusted.segments[-1].base_offset > IOV_MAX or segment_bytes == 1 << 30
    expected = list(oracle.batches())
    assert list(trusted.batches()) == expected
    with LogReader(str(tmp_path / "a" / "t-0")) as reader:
        assert list(reader.batches()) == expected
    trusted.close(clean=False)  # as a crash leaves it: recovery must find every batch valid
    oracle.close()
    reopened = Log.open(tmp_path / "a" / "t-0", config)
    assert reopened.log_end_offset == sum(parse_header(b).last_offset_delta + 1 for b in batches)
    assert list(reopened.batches()) == expected
    reopened.close()


def test_refused_calls_stamp_and_append_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "orders-1"
    log = Log.open(directory, CONFIGS[1])
    log.append(build_batch([b"first"]), leader_epoch=4)
    before = _dir_bytes(directory)
    memory, views = _ring([TEMPLATES[0], TEMPLATES[1]])
    untouched = memory.copy()
    headers = [parse_header(v) for v in views]
    with pytest.raises(NotLeaderError, match=r"orders-1.*epoch 3.*epoch 4"):
        log.append_batches(views, headers, leader_epoch=3)
    with pytest.raises(ValueError, match="2 buffers and 1 headers"):
        log.append_batches(views, headers[:1], leader_epoch=4)
    with pytest.raises(ValueError, match="0 buffers"):
        log.append_batches([], [], leader_epoch=4)
    assert np.array_equal(memory, untouched)
    assert log.log_end_offset == 1 and _dir_bytes(directory) == before
    log.close()
    with pytest.raises(LogLockedError, match="closed"):
        log.append_batches(views, headers, leader_epoch=4)


def test_a_new_epoch_is_recorded_where_it_starts(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", CONFIGS[0])
    _, views = _ring([TEMPLATES[1]])
    with pytest.raises(ValueError, match="must be >= 0"):
        log.append_batches(views, [parse_header(views[0])], leader_epoch=-1)
    assert log.log_end_offset == 0 and parse_header(views[0]).base_offset == 0
    log.append_batches(views, [parse_header(views[0])], leader_epoch=0)
    _, views = _ring([TEMPLATES[2], TEMPLATES[1]])
    info = log.append_batches(views, [parse_header(v) for v in views], leader_epoch=7)
    assert (info.first_offset, info.last_offset, info.batch_count, info.record_count) == (3, 7, 2, 5)
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(7) == (7, 8)
    log.close()


def test_a_short_write_is_finished_or_raises(tmp_path: Path) -> None:
    """Past RLIMIT_FSIZE a writev writes short, then the next write fails with EFBIG: what reached the file
    is exactly the parts' first bytes, and the error reaches the caller (a real process, a real limit)."""
    path = tmp_path / "limited.log"
    code = textwrap.dedent(
        f"""
        import os, resource, signal
        from storage.segment_file import write_fully
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        parts = [bytes([i]) * 300 for i in range(1, 6)]
        fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        write_fully(fd, parts[:2], 600)          # fits: written whole
        try:
            write_fully(fd, parts[2:], 900)      # 400 bytes fit, then EFBIG
        except OSError as exc:
            print(exc.errno)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["27"]  # EFBIG
    expected = b"".join(bytes([i]) * 300 for i in range(1, 6))[:1000]
    assert path.read_bytes() == expected
