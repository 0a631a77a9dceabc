"""A swap of several cleaned groups at once (``storage.clean_swap``): a process cleaning a log of several
groups is SIGKILLed between two groups' commits (the fault point ``clean.swap`` after the k-th group), and
``Log.open`` must finish the groups committed and undo the others: the log reads as a compaction of what
was appended, the first groups cleaned, every segment after them byte for byte as it was.  Also the rule
itself on a listing (``log_files_now``: what the log is during a swap)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from compaction_oracle import Model, read_records

from storage.batch_builder import build_batch
from storage.clean_faults import CLEAN_FAULTS
from storage.clean_swap import log_files_now
from storage.cleaner import clean_log
from storage.log import Log
from storage.log_config import LogConfig

CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=256)
ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 2_000_000_000_000


def _fill(directory: str) -> Model:
    """Five closed segments of records of three keys: each segment a group, cleaned to a few records."""
    model = Model()
    with Log.open(directory, CONFIG) as log:
        i = 0
        while len(log.segments) < 6:
            keys = [b"abc"[i % 3 : i % 3 + 1]]
            values = [f"value-{i:04d}".encode() * 4]
            model.append(log.append(build_batch(values, keys, timestamp_ms=1_000 + i), leader_epoch=0)
                         .first_offset, keys, values)  # fmt: skip
            i += 1
    return model


def _segment_bytes(directory: str) -> dict[int, bytes]:
    return {int(n.split(".")[0]): Path(directory, n).read_bytes() for n in os.listdir(directory)
            if n.endswith(".log")}  # fmt: skip


def _child(directory: str, after: int) -> None:
    CLEAN_FAULTS.arm("clean.swap", "kill", after=after)
    with Log.open(directory, CONFIG) as log:
        clean_log(log, upper_bound=log.log_end_offset, now_ms=NOW_MS)
    raise SystemExit("the clean ended without reaching its fault point")


@pytest.mark.parametrize("committed", [1, 3])
def test_a_kill_between_two_groups_commits_keeps_the_committed_and_undoes_the_rest(
        tmp_path: Path, committed: int) -> None:  # fmt: skip
    directory = str(tmp_path / "groups-0")
    model = _fill(directory)
    before = _segment_bytes(directory)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (ROOT, ROOT / "tests" / "storage")))
    child = subprocess.run([sys.executable, __file__, directory, str(committed - 1)], env=env, cwd=ROOT,
                           capture_output=True, timeout=120, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    names = os.listdir(directory)
    assert [n for n in names if n.endswith(".log.swap")], names  # killed mid-swap, some groups committed
    with Log.open(directory, CONFIG) as log:
        found = read_records(log.batches())
        bases = [s.base_offset for s in log.segments]
    assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
    for offset, record in found.items():
        assert model.records[offset] == record, offset
    for key, (offset, value) in model.latest_by_key().items():
        assert found.get(offset) == (key, value), (key, offset)
    after = _segment_bytes(directory)
    changed = [b for b in bases if after[b] != before[b]]
    assert changed == bases[:committed]  # the first groups cleaned, one segment each
    assert all(after[b] == before[b] for b in bases[committed:])  # the others as they were


def test_the_log_during_a_swap_of_three_groups_is_each_groups_own_state() -> None:
    names = ["0.log.swap", "0.log.deleted", "5.log.deleted",  # group 0 (segments 0, 5): committed
             "10.log.cleaned", "10.log.deleted",  # group 10: not committed
             "20.log.cleaned", "20.log.deleted", "25.log.deleted",  # group 20: not committed
             "30.log", "20.index.swap", "0.index.swap"]
    assert sorted(log_files_now(names)) == sorted(["0.log.swap", "10.log.deleted", "20.log.deleted",
                                                   "25.log.deleted", "30.log"])


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
