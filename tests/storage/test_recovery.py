"""Recovery: torn and corrupt tails are cut to the last valid batch, closed segments are never cut silently,
indexes are rebuilt, and a really killed writer loses nothing it appended."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from batchgen import batch_of_size, build_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.campaign import rounds

from storage.batch_header import ATTRIBUTES_OFFSET, parse_header, validate_batch
from storage.batch_scan import BAD_MAGIC, BAD_OFFSETS, END, FULL, TRUNCATED, plan_index_entries, walk_batches
from storage.errors import CorruptRecordError, LogCorruptionError
from storage.log import Log
from storage.log_config import LogConfig

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=150, segment_index_bytes=4096)


def _build_log(directory: Path, count: int = 40) -> list[bytes]:
    """A log of ``count`` batches over several segments, left as a crash leaves it; returns its batches."""
    log = Log.open(directory, CONFIG)
    for i in range(count):
        log.append(build_batch([b"v%03d" % i] * (1 + i % 3), timestamp_ms=1000 + i), leader_epoch=i // 15)
    batches = list(log.batches())
    log.close(clean=False)
    return batches


def _valid_prefix(data: bytes, base_offset: int) -> int:
    """Independent check (validate_batch in a Python loop): bytes of valid batches whose offsets move
    forward and fit the segment's int32 relative offsets."""
    position, expected = 0, base_offset
    while position < len(data):
        try:
            header = validate_batch(data, position)
        except CorruptRecordError:
            break
        if header.base_offset < expected or header.last_offset - base_offset > 2**31 - 1:
            break
        expected = header.last_offset + 1
        position += header.size
    return position


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """One crashed 40-batch log, copied by each hypothesis example instead of rebuilt."""
    directory = tmp_path_factory.mktemp("template") / "t-0"
    return directory, _build_log(directory)


def _copy(template: tuple[Path, list[bytes]], target: Path) -> list[bytes]:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(template[0], target)
    return template[1]


def _active(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_torn_tail_is_cut_to_the_last_whole_batch(tmp_path: Path, data: st.DataObject,
                                                  caplog: pytest.LogCaptureFixture,
                                                  template: tuple[Path, list[bytes]]) -> None:
    directory = tmp_path / "torn-0"
    batches = _copy(template, directory)
    active = _active(directory)
    original = active.read_bytes()
    cut = data.draw(st.integers(0, len(original)), label="cut")
    with open(active, "r+b") as f:
        f.truncate(cut)
    before_active = sum(len(b) for b in batches) - len(original)
    keep = before_active + _valid_prefix(original[:cut], int(active.stem))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        log = Log.open(directory, CONFIG)
    try:
        survivors = [b for b in batches if sum(len(x) for x in batches[: batches.index(b) + 1]) <= keep]
        assert list(log.batches()) == survivors
        expected_end = parse_header(survivors[-1]).last_offset + 1 if survivors else 0
        assert log.log_end_offset == expected_end
        assert os.path.getsize(active) == keep - before_active
        if keep - before_active < cut:
            assert f"{active}: truncating the log tail at position {keep - before_active}" in caplog.text
        assert log.append(build_batch([b"after"]), leader_epoch=9).first_offset == expected_end
    finally:
        log.close()


def _intact_batch_after(original: bytes, damaged: bytes, kept: int) -> bool:
    """Whether a batch of ``original`` starting after position ``kept`` is still whole in ``damaged``."""
    position = 0
    while position < len(original):
        size = parse_header(original, position).size
        if position > kept and damaged[position : position + size] == original[position : position + size]:
            return True
        position += size
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_keeps_the_earlier_valid_batches_or_refuses_when_valid_ones_follow(
        tmp_path: Path, data: st.DataObject, template: tuple[Path, list[bytes]]) -> None:
    directory = tmp_path / "garbage-0"
    batches = _copy(template, directory)
    active = _active(directory)
    original = active.read_bytes()
    at = data.draw(st.integers(0, len(original)), label="at")
    garbage = data.draw(st.binary(min_size=1, max_size=64), label="garbage")
    damaged = original[:at] + garbage + original[at + len(garbage) :]
    active.write_bytes(damaged)
    kept = _valid_prefix(damaged, int(active.stem))
    if _intact_batch_after(original, damaged, kept):  # rule 4: acknowledged records follow the damage
        with pytest.raises(LogCorruptionError, match=f"{active}: invalid record batch at position {kept}"):
            Log.open(directory, CONFIG)
        assert active.read_bytes() == damaged  # nothing cut
        return
    log = Log.open(directory, CONFIG)
    try:
        assert log.active_segment.size_bytes == kept
        earlier = b"".join(batches)[: sum(len(b) for b in batches) - len(original)]
        assert b"".join(log.batches()) == earlier + damaged[:kept]
        # every batch wholly before the first changed byte survives
        first_change = next((i for i, (a, b) in enumerate(zip(original, damaged, strict=False)) if a != b),
                            min(len(original), len(damaged)))
        position = 0
        while position < len(original):
            size = parse_header(original, position).size
            if position + size <= first_change:
                assert kept >= position + size
            position += size
        # no surviving batch has a changed byte under its CRC
        position = 0
        while position < kept:
            size = parse_header(damaged, position).size
            assert damaged[position + ATTRIBUTES_OFFSET : position + size] == original[
                position + ATTRIBUTES_OFFSET : position + size]
            position += size
    finally:
        log.close(clean=False)


def test_corrupt_batch_in_a_closed_segment_is_an_error_naming_file_position_offsets(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    _build_log(directory)
    closed = sorted(directory.glob("*.log"))[0]
    data = bytearray(closed.read_bytes())
    first = parse_header(data, 0)
    second = parse_header(data, first.size)
    data[first.size + second.size - 1] ^= 0x55  # last byte of the second batch: under its CRC
    closed.write_bytes(bytes(data))
    (directory / "recovery-point-offset-checkpoint").unlink()  # nothing was ever fsynced: scan all
    with pytest.raises(CorruptRecordError) as caught:
        Log.open(directory, CONFIG)
    message = str(caught.value)
    assert str(closed) in message
    assert f"position {first.size}" in message
    assert f"offsets {second.base_offset}..{second.last_offset}" in message
    assert "CRC" in message
    assert closed.read_bytes() == bytes(data)  # nothing was cut
    # the lock was released: a second attempt fails the same way, not with LogLockedError
    with pytest.raises(CorruptRecordError):
        Log.open(directory, CONFIG)


def test_trusted_closed_segment_with_a_bad_index_is_rebuilt_and_its_corruption_found(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    _build_log(directory)
    Log.open(directory, CONFIG).close()  # clean: nothing will be scanned on the next open
    closed = sorted(directory.glob("*.log"))[0]
    data = bytearray(closed.read_bytes())
    data[100] ^= 1
    closed.write_bytes(bytes(data))
    Log.open(directory, CONFIG).close()  # below the recovery point and cleanly closed: trusted as is
    closed.with_suffix(".index").write_bytes(b"\x00" * 13)
    expected = f"{closed}: invalid record batch at position 72 \\(its header claims offsets 1..2\\)"
    with pytest.raises(CorruptRecordError, match=expected):
        Log.open(directory, CONFIG)


@pytest.mark.parametrize("damage", ["delete", "garbage", "odd size", "not monotonic", "zeros"])
@pytest.mark.parametrize("clean", [True, False])
def test_missing_or_corrupt_indexes_are_rebuilt(tmp_path: Path, damage: str, clean: bool) -> None:
    directory = tmp_path / "t-0"
    batches = _build_log(directory, count=60)
    if clean:
        Log.open(directory, CONFIG).close()
    originals = {p.name: p.read_bytes() for p in directory.glob("*index")}
    for path in directory.glob("*index"):
        if damage == "delete":
            path.unlink()
        elif damage == "garbage":
            path.write_bytes(os.urandom(path.stat().st_size or 24))
        elif damage == "odd size":
            path.write_bytes(path.read_bytes() + b"\x01")
        elif damage == "not monotonic":
            path.write_bytes(path.read_bytes()[::-1])
        else:
            path.write_bytes(bytes(path.stat().st_size or 24))
    log = Log.open(directory, CONFIG)
    try:
        for offset in range(log.log_end_offset):
            piece = log.read(offset, 1)
            assert piece.first_offset <= offset < piece.next_offset
            assert piece.read_bytes() in batches
        assert list(log.batches()) == batches
        for ts in range(995, 1045, 3):
            headers = [parse_header(b) for b in batches]
            expected = next((h.base_offset for h in headers if h.max_timestamp >= ts), None)
            found = log.offset_for_timestamp(ts)
            assert (None if found is None else found.offset) == expected
    finally:
        log.close()
    rebuilt = {p.name: p.read_bytes() for p in directory.glob("*index")}
    assert rebuilt.keys() == originals.keys()
    for name in sorted(originals)[:-2]:  # closed segments: rebuilt indexes are byte-identical to live ones
        assert rebuilt[name] == originals[name], name


def test_recovery_reassigns_leader_epochs_from_the_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    _build_log(directory)
    (directory / "leader-epoch-checkpoint").unlink()
    (directory / "recovery-point-offset-checkpoint").unlink()
    log = Log.open(directory, CONFIG)
    assert [tuple(e) for e in log.leader_epoch_cache.entries] == [(0, 0), (1, 30), (2, 60)]
    log.close()


def test_recover_false_skips_the_crc_but_still_cuts_a_torn_tail(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    batches = _build_log(directory)
    active = _active(directory)
    data = bytearray(active.read_bytes())
    data[-1] ^= 0xFF  # last batch: bad CRC
    active.write_bytes(bytes(data) + b"\x00" * 7)  # and a torn tail
    log = Log.open(directory, CONFIG, recover=False)
    assert log.log_end_offset == parse_header(batches[-1]).last_offset + 1
    log.close(clean=False)
    log = Log.open(directory, CONFIG)  # still unclean: the CRC check now drops the damaged last batch
    assert list(log.batches()) == batches[:-1]
    log.close()


_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from batchgen import build_batch
    from storage.log import Log
    from storage.log_config import LogConfig
    log = Log.open(sys.argv[1], LogConfig(segment_bytes=20000, index_interval_bytes=500))
    i = 0
    while True:
        info = log.append(build_batch([b"record-%d" % i] * (1 + i % 4)), leader_epoch=1)
        print(info.last_offset, flush=True)
        i += 1
    """
)


@pytest.mark.campaign
def test_a_killed_writer_loses_nothing_it_appended(tmp_path: Path) -> None:
    """SIGKILL a writer at random moments (once here, 50 times under make soak): after each kill the
    recovered log holds every batch the writer had appended, offsets dense."""
    directory = tmp_path / "kill-0"
    here = os.path.dirname(__file__)
    rng = random.Random(7)
    acked = -1
    for round_ in range(rounds(1, 50)):
        target = acked + (3000 if round_ == 0 else rng.randrange(1, 2000))
        with subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), here], stdout=subprocess.PIPE,
                              text=True) as child:
            assert child.stdout is not None
            for line in child.stdout:
                acked = int(line)
                if acked >= target:
                    break
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            for line in child.stdout:  # appended before the kill landed
                acked = int(line)
        _check_dense(directory, acked)


def _check_dense(directory: Path, acked: int) -> None:
    log = Log.open(directory, LogConfig(segment_bytes=20000, index_interval_bytes=500))
    try:
        assert log.log_end_offset >= acked + 1
        assert len(log.segments) > 3
        offset = 0
        for batch in log.batches():
            header = validate_batch(batch)
            assert header.base_offset == offset
            offset = header.last_offset + 1
        assert offset == log.log_end_offset
    finally:
        log.close()


# --- the scan kernels and their pure-Python twins -------------------------------------------------------
def _arrays(n: int) -> list[np.ndarray]:
    return [np.empty(n, dtype=np.int64) for _ in range(7)]


@pytest.mark.parametrize("twin", [False, True], ids=["numba", "py_func"])
def test_walk_batches_kernel_and_twin(twin: bool) -> None:
    walk = walk_batches.py_func if twin else walk_batches
    batches = [build_batch([b"a"] * 3, base_offset=10), build_batch([b"b"], base_offset=13),
               build_batch([b"c"] * 2, base_offset=20)]
    data = np.frombuffer(b"".join(batches), dtype=np.uint8)
    arrays = _arrays(8)
    count, stop, code = walk(data, 0, len(data), 10, 10, *arrays)
    assert (count, stop, code) == (3, len(data), END)
    assert arrays[2][:3].tolist() == [10, 13, 20] and arrays[3][:3].tolist() == [12, 13, 21]
    assert arrays[6][0] == parse_header(batches[0]).crc
    small = _arrays(2)
    assert walk(data, 0, len(data), 10, 10, *small) == (2, len(batches[0]) + len(batches[1]), FULL)
    assert walk(data, 0, len(data) - 1, 10, 10, *arrays)[2] == TRUNCATED
    assert walk(data, 0, len(data), 10, 11, *arrays)[:3:2] == (0, BAD_OFFSETS)
    broken = data.copy()
    broken[len(batches[0]) + 16] = 7
    assert walk(broken, 0, len(broken), 10, 10, *arrays) == (1, len(batches[0]), BAD_MAGIC)


@pytest.mark.parametrize("twin", [False, True], ids=["numba", "py_func"])
def test_plan_index_entries_kernel_and_twin(twin: bool) -> None:
    plan = plan_index_entries.py_func if twin else plan_index_entries
    sizes = np.array([100, 100, 100, 100, 100], dtype=np.int64)
    positions = np.cumsum(sizes) - sizes
    last = np.array([1, 3, 4, 8, 9], dtype=np.int64)
    stamps = np.array([50, 40, 70, 60, 80], dtype=np.int64)
    state = np.array([0, -1, -1, -1], dtype=np.int64)
    out = [np.zeros(5, dtype=np.int64) for _ in range(4)]
    n_index, n_time = plan(positions, sizes, last, stamps, 5, 0, 150, state, *out)
    # entries for batches 2 and 4 (more than 150 bytes since the last entry); time grows at both
    assert (n_index, n_time) == (2, 2)
    assert out[0][:2].tolist() == [4, 9] and out[1][:2].tolist() == [200, 400]
    assert out[2][:2].tolist() == [70, 80] and out[3][:2].tolist() == [4, 9]
    assert state.tolist() == [100, 80, 9, 80]


def test_scan_of_big_batches(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig())
    for _ in range(20):
        log.append(batch_of_size(65536, records=16), leader_epoch=0)
    log.close(clean=False)
    log = Log.open(tmp_path / "t-0", LogConfig())
    assert log.log_end_offset == 320 and log.active_segment.offset_index.entries == 19
    log.close()
