"""``appliance repair``: the real console script on real partition directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.errors import LogCorruptionError
from storage.log import Log
from storage.log_config import LogConfig

APPLIANCE = str(Path(sys.executable).with_name("appliance"))
CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=150, segment_index_bytes=4096)


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([APPLIANCE, "repair", *map(str, args)], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def _damaged_log(directory: Path) -> tuple[list[bytes], Path, int]:
    """A log of 40 batches over several segments whose first segment has a bad CRC in its second batch,
    left as a crash leaves it (so start-up scans it); returns the batches, the file and the position."""
    log = Log.open(directory, CONFIG)
    for i in range(40):
        log.append(build_batch([b"v%03d" % i] * (1 + i % 3), timestamp_ms=1000 + i), leader_epoch=0)
    batches = list(log.batches())
    log.close(clean=False)
    first = sorted(directory.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    position = parse_header(bytes(data)).size
    data[position + 70] ^= 0xFF
    first.write_bytes(bytes(data))
    (directory / "recovery-point-offset-checkpoint").write_text("0\n1\nt 0 0\n")
    return batches, first, position


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and p.name != ".lock"}


def test_dry_run_shows_the_damage_and_changes_nothing_then_repair_cuts_there(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    batches, first, position = _damaged_log(directory)
    with pytest.raises(LogCorruptionError):
        Log.open(directory, CONFIG)
    before = _files(directory)
    dry = _run("--dry-run", directory)
    assert dry.returncode == 3, dry.stderr
    assert f"damaged: {first}: invalid record batch at position {position}" in dry.stdout
    later = len(list(directory.glob("*.log"))) - 1
    assert f"and remove {later} later segments" in dry.stdout
    assert f"the damaged batch and {len(batches) - 2} valid batches after it" in dry.stdout
    assert _files(directory) == before

    done = _run(directory)
    assert done.returncode == 0, done.stderr
    assert "restart the appliance" in done.stdout
    (aside,) = directory.glob("repaired-*")
    removed = (aside / f"{first.name}.tail").read_bytes()
    assert removed == before[first.name][position:]
    assert sorted(p.name for p in aside.glob("*.log")) == sorted(n for n in before if n.endswith(".log"))[1:]
    with Log.open(directory, CONFIG) as log:
        assert list(log.batches()) == batches[:1]
        assert log.append(build_batch([b"after"]), leader_epoch=0).first_offset == 1
    again = _run(directory)
    assert again.returncode == 0 and "nothing to repair" in again.stdout


def test_refused_while_the_writer_lock_is_held(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with Log.open(directory, CONFIG) as log:
        log.append(build_batch([b"x"]), leader_epoch=0)
        refused = _run(directory)
    assert refused.returncode == 1
    assert "refused" in refused.stderr and "already open for writing by process" in refused.stderr
    assert "Stop the appliance" in refused.stderr


def test_not_a_partition_directory(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 1
    assert "not a partition log directory" in result.stderr


def test_help_says_when_to_use_it() -> None:
    result = _run("--help")
    assert result.returncode == 0
    assert "offline" in result.stdout and "acknowledged" in result.stdout and "--dry-run" in result.stdout
