"""Crash test: a process cleaning a log in a loop is SIGKILLed at random moments, and at each named fault
point of the swap (``storage.clean_faults``); ``Log.open`` must then recover a log that reads as a compaction
of what was appended: every record it holds was appended at that offset, every key's latest record is
there, and a full clean afterwards reads exactly as the model of a full clean.

Ten kills in ``make test``, 200 under ``make soak`` (``tests/support/campaign.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compaction_oracle import Model, read_records
from support.campaign import rounds

from storage.batch_builder import build_batch
from storage.clean_faults import CLEAN_FAULTS, FAULT_POINTS
from storage.cleaner import clean_log
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_dir import CLEANER_OFFSET_CHECKPOINT_FILE
from storage.offset_map import BYTES_PER_ENTRY

KILLS = rounds(10, 200)
NOW_MS = 2_000_000_000_000  # every clean runs at this time: tombstones stay inside their grace period
RETENTION_MS = 86_400_000
CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=256)
ROOT = Path(__file__).resolve().parents[2]


def _fill(directory: str, seed: int) -> Model:
    """Append a log of keyed records (some tombstones, some compressed); returns its model."""
    rng = random.Random(seed)
    model = Model()
    with Log.open(directory, CONFIG) as log:
        for i in range(400):
            count = rng.randint(1, 4)
            keys = [bytes([97 + rng.randrange(12)]) for _ in range(count)]
            values = [None if rng.random() < 0.1 else f"v{i}-{j}".encode() for j in range(count)]
            data = build_batch(values, keys, timestamp_ms=1_000 + i, compression=rng.choice([0, 0, 1, 4]))
            model.append(log.append(data, leader_epoch=0).first_offset, keys, values)
    return model


def _child(directory: str, seed: int) -> None:
    """Clean forever; after each full pass forget the checkpoint so the next pass rewrites everything.
    Says "ready" after its first pass."""
    rng = random.Random(seed)
    if rng.random() < 0.6:
        CLEAN_FAULTS.arm(rng.choice(FAULT_POINTS), "kill", after=rng.randrange(4))
    log = Log.open(directory, CONFIG)
    passes = 0
    while True:
        end = log.log_end_offset
        upper = end if rng.random() < 0.7 else rng.randint(0, end)  # a compacted log is one small segment
        result = clean_log(log, upper_bound=upper, now_ms=NOW_MS,
                           delete_retention_ms=RETENTION_MS,
                           dedupe_buffer_bytes=rng.randint(8, 60) * BYTES_PER_ENTRY)
        if result.done:
            with contextlib.suppress(FileNotFoundError):  # a pass with nothing to clean writes none
                os.unlink(os.path.join(directory, CLEANER_OFFSET_CHECKPOINT_FILE))
        passes += 1
        if passes == 1:  # the kernels are loaded: from here on a kill lands inside a clean
            print("ready", flush=True)


def _check_compaction_of(model: Model, directory: str) -> None:
    """The recovered log holds only appended records, and every key's latest record."""
    with Log.open(directory, CONFIG) as log:
        found = read_records(log.batches())
    for offset, record in found.items():
        assert model.records[offset] == record, offset
    latest = model.latest_by_key()
    for key, (offset, value) in latest.items():
        assert found.get(offset) == (key, value), (key, offset)


@pytest.mark.slow
@pytest.mark.campaign
def test_cleaner_killed_at_random_moments_recovers(tmp_path: Path) -> None:
    directory = str(tmp_path / "crash-0")
    model = _fill(directory, seed=17)
    paths = (ROOT, ROOT / "tests", ROOT / "tests" / "storage")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in paths))
    rng = random.Random(5)
    for kill in range(KILLS):
        child = subprocess.Popen([sys.executable, __file__, directory, str(kill)], stdout=subprocess.PIPE,
                                 env=env, cwd=ROOT)
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line == b"ready\n":
                time.sleep(rng.uniform(0, 0.3))
                child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        _check_compaction_of(model, directory)
    with Log.open(directory, CONFIG) as log:
        result = clean_log(log, upper_bound=log.log_end_offset, now_ms=NOW_MS,
                           delete_retention_ms=RETENTION_MS)
        assert result.done
        model.clean(result.end_offset, NOW_MS, RETENTION_MS)
        assert read_records(log.batches()) == model.records
    assert not [name for name in os.listdir(directory) if name.endswith((".cleaned", ".swap", ".deleted"))]


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
