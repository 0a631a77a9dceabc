"""A reader in another process while a clean swaps segments: ``LogReader`` never shows a hole.

A child process appends, rolls and cleans in a loop (small segments: every clean swaps many groups); this
process reads the log from the start over and over with a ``LogReader``.  Every read must be a state the log
passed through: each record is the one appended at its offset, offsets increase, and an offset is missing
only if a later record of its key was appended below where the read ended (a clean may have dropped it).
A second test stops a swap midway with a SIGKILL at a named fault point: the reader refuses to list a
half-swapped directory (a retriable ``KafkaStorageError``) instead of reading around the hole, and reads the
whole log again once ``Log.open`` has finished or undone the swap.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compaction_oracle import read_records

from storage.batch_builder import build_batch
from storage.clean_faults import CLEAN_FAULTS
from storage.cleaner import clean_log
from storage.errors import KafkaStorageError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader

CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=256)
ROUNDS = 80
BATCHES_PER_ROUND = 12
KEYS = 30
ROOT = Path(__file__).resolve().parents[2]


def _batch(j: int) -> tuple[list[bytes], list[bytes]]:
    """The keys and values of the ``j``-th batch the child appends (the same in both processes)."""
    rng = random.Random(j)
    count = rng.randint(1, 4)
    return [b"k%d" % rng.randrange(KEYS) for _ in range(count)], [b"v%d-%d" % (j, r) for r in range(count)]


def _history(batches: int) -> dict[int, tuple[bytes, bytes]]:
    """Offset -> (key, value) of everything the child appends (offsets are dense as appended)."""
    history: dict[int, tuple[bytes, bytes]] = {}
    for j in range(batches):
        keys, values = _batch(j)
        for key, value in zip(keys, values, strict=True):
            history[len(history)] = (key, value)
    return history


def _child(directory: str, kill_at: str) -> None:
    """Append, roll and clean ``ROUNDS`` times; with ``kill_at``, SIGKILL at that fault point instead."""
    if kill_at:
        CLEAN_FAULTS.arm(kill_at, "kill", after=2)
    with Log.open(directory, CONFIG) as log:
        print("ready", flush=True)
        for round_ in range(ROUNDS):
            for j in range(round_ * BATCHES_PER_ROUND, (round_ + 1) * BATCHES_PER_ROUND):
                keys, values = _batch(j)
                log.append(build_batch(values, keys, timestamp_ms=1_000 + j), leader_epoch=0)
            log.roll()
            clean_log(log, upper_bound=log.log_end_offset)


def _start_child(directory: Path, kill_at: str = "") -> subprocess.Popen[bytes]:
    paths = (ROOT, ROOT / "tests", ROOT / "tests" / "storage")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in paths))
    child = subprocess.Popen([sys.executable, __file__, str(directory), kill_at], stdout=subprocess.PIPE,
                             env=env, cwd=ROOT)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def _check_state(found: dict[int, tuple[bytes | None, bytes | None]],
                 history: dict[int, tuple[bytes, bytes]]) -> None:
    """``found`` (a read from the start) is a state the log passed through (the module docstring)."""
    if not found:
        return
    end = max(found) + 1
    later_keys: set[bytes] = set()  # keys appended after the offset being checked, below ``end``
    for offset in range(end - 1, -1, -1):
        key, _ = history[offset]
        if offset in found:
            assert found[offset] == history[offset], offset
        else:
            assert key in later_keys, f"offset {offset} (key {key!r}) is missing, and no later record of " \
                                      f"its key was appended below {end}: a hole"
        later_keys.add(key)


def test_reads_during_a_clean_loop_in_another_process_never_see_a_hole(tmp_path: Path) -> None:
    directory = tmp_path / "swap-0"
    history = _history(ROUNDS * BATCHES_PER_ROUND)
    child = _start_child(directory)
    reads = 0
    try:
        with LogReader(str(directory), CONFIG) as reader:
            while child.poll() is None or reads < 3:
                _check_state(read_records(reader.batches()), history)
                reads += 1
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    assert child.returncode == 0 and reads >= 3
    with LogReader(str(directory), CONFIG) as reader:
        found = read_records(reader.batches())
    _check_state(found, history)
    assert max(found) == len(history) - 1


@pytest.mark.parametrize("point", ["clean.deleted", "clean.indexes", "clean.swap", "clean.unlinked"])
def test_a_half_done_swap_is_refused_then_read_whole_after_recovery(tmp_path: Path, point: str) -> None:
    directory = tmp_path / "half-0"
    history = _history(ROUNDS * BATCHES_PER_ROUND)
    child = _start_child(directory, point)
    try:
        child.wait(timeout=120)
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert [n for n in os.listdir(directory) if n.endswith((".deleted", ".swap"))]
    with pytest.raises(KafkaStorageError, match=r"half-0 holds .*: a clean's swap has been unfinished"):
        LogReader(str(directory), CONFIG, swap_wait_s=0.2)  # a reader that starts while the swap is half done
    with Log.open(directory, CONFIG) as log:  # finishes or undoes the swap
        expected = read_records(log.batches())
    started = time.monotonic()
    with LogReader(str(directory), CONFIG) as reader:
        assert read_records(reader.batches()) == expected
    assert time.monotonic() - started < 5
    _check_state(expected, history)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
