"""Start-up after damage done while the log was stopped cleanly: the clean-shutdown marker records the
active segment, a mismatch is recovered as after a crash, and damage with valid batches after it refuses."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from batchgen import build_batch

from storage.errors import LogCorruptionError
from storage.log import Log
from storage.log_config import LogConfig

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=150, segment_index_bytes=4096)


def _clean_log(directory: Path, count: int = 40) -> list[bytes]:
    log = Log.open(directory, CONFIG)
    for i in range(count):
        log.append(build_batch([b"v%03d" % i] * (1 + i % 3), timestamp_ms=1000 + i), leader_epoch=0)
    batches = list(log.batches())
    log.close()
    return batches


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def test_the_marker_records_the_active_segment(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    batches = _clean_log(directory)
    record = json.loads((directory / ".clean-shutdown").read_text())
    active = _segments(directory)[-1]
    assert record["active_segment"] == int(active.stem)
    assert record["size_bytes"] == active.stat().st_size
    position, _, last = record["last_batch"]
    assert active.read_bytes()[position:] == batches[-1]
    assert last == 39 + sum(i % 3 for i in range(40))  # offsets 0.. in records


@pytest.mark.parametrize("damage", ["garbage appended", "cut mid-batch", "zeros appended"])
def test_a_changed_active_segment_after_a_clean_stop_is_recovered(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "t-0"
    batches = _clean_log(directory)
    active = _segments(directory)[-1]
    data = active.read_bytes()
    last_size = len(batches[-1])
    if damage == "garbage appended":
        active.write_bytes(data + b"\x8f\x13garbage" * 40)
        survivors, position = batches, len(data)
    elif damage == "zeros appended":
        active.write_bytes(data + bytes(4096))
        survivors, position = batches, len(data)
    else:
        active.write_bytes(data[: len(data) - last_size // 2])
        survivors, position = batches[:-1], len(data) - last_size
    with caplog.at_level(logging.WARNING):
        log = Log.open(directory, CONFIG)
    try:
        assert list(log.batches()) == survivors
        assert "not as the clean stop left it" in caplog.text
        assert f"{active}: truncating the log tail at position {position}" in caplog.text
        assert active.stat().st_size == position
        assert log.append(build_batch([b"after"]), leader_epoch=0).first_offset == log.log_end_offset - 1
    finally:
        log.close()
    assert list(Log.open(directory, CONFIG).batches())[: len(survivors)] == survivors


def test_garbage_appended_to_a_closed_segment_is_cut_when_it_holds_no_offsets(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "t-0"
    batches = _clean_log(directory)
    closed = _segments(directory)[0]
    size = closed.stat().st_size
    closed.write_bytes(closed.read_bytes() + b"junk" * 100)
    with caplog.at_level(logging.WARNING):
        with Log.open(directory, CONFIG) as log:
            assert list(log.batches()) == batches
    assert closed.stat().st_size == size
    assert f"{closed}: truncating the log tail at position {size}" in caplog.text


@pytest.mark.parametrize("where", ["active", "closed"])
def test_corruption_with_valid_batches_after_it_refuses_and_cuts_nothing(tmp_path: Path, where: str) -> None:
    directory = tmp_path / "t-0"
    _clean_log(directory)
    segment = _segments(directory)[-1 if where == "active" else 0]
    data = bytearray(segment.read_bytes())
    data[100] ^= 0xFF  # inside the second batch: its CRC fails, the batches after it are whole
    segment.write_bytes(bytes(data))
    files = {p.name: p.read_bytes() for p in directory.glob("*.log")}
    Path(directory / ".clean-shutdown").unlink()  # as after a crash: every segment from the recovery point
    if where == "closed":
        (directory / "recovery-point-offset-checkpoint").write_text("0\n1\nt 0 0\n")
    with pytest.raises(LogCorruptionError) as caught:
        Log.open(directory, CONFIG)
    damage = caught.value.damage
    assert damage.path == str(segment)
    assert damage.resumes is not None and damage.resumes.path == str(segment)
    assert f"{segment}: invalid record batch at position {damage.position}" in str(caught.value)
    assert "valid batches follow" in str(caught.value)
    assert {p.name: p.read_bytes() for p in directory.glob("*.log")} == files
