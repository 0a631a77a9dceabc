"""The producer id allocator: increasing ids, one owner at a time, a damaged file refused, no id handed out
twice across SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.errors import ConfigError, CorruptRecordError, LogLockedError
from storage.producer_ids import ID_FILE, ProducerIdBlockAllocator

ROOT = Path(__file__).resolve().parents[2]


def test_allocator_hands_out_increasing_ids_and_resumes_after_the_reserved_block(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    seen: list[int] = []
    for block_size in (1, 3, 1000, 2):
        allocator = ProducerIdBlockAllocator(path, block_size=block_size)
        for _ in range(5):
            seen.append(allocator.allocate())
        on_disk = path.read_bytes()
        allocator.close()  # writes nothing: reopening after close is reopening after a crash
        assert path.read_bytes() == on_disk
    assert seen == sorted(set(seen))
    assert seen[:5] == [0, 1, 2, 3, 4]
    assert seen[5] == 5 and seen[10] == 11 and seen[15] == 1011  # the unused rest of a block is skipped


def test_allocator_is_owned_by_one_process_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    with ProducerIdBlockAllocator(path) as first:
        with pytest.raises(LogLockedError, match="producer_ids"):
            ProducerIdBlockAllocator(path)
        first.allocate()
    with ProducerIdBlockAllocator(path) as second:
        assert second.allocate() == 1000


def test_allocator_refuses_a_damaged_file_rather_than_reuse_ids(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    with ProducerIdBlockAllocator(path) as allocator:
        allocator.allocate()
    good = path.read_bytes()
    assert len(good) == ID_FILE.size
    damaged = [good[:n] for n in range(len(good))] + [good + b"x"]
    damaged += [good[:i] + bytes([good[i] ^ 1]) + good[i + 1 :] for i in range(len(good))]
    for data in damaged:
        path.write_bytes(data)
        with pytest.raises(CorruptRecordError, match="producer_ids"):
            ProducerIdBlockAllocator(path)
    with pytest.raises(ConfigError):
        ProducerIdBlockAllocator(tmp_path / "other", block_size=0)


_CHILD = """
import sys
from storage.producer_ids import ProducerIdBlockAllocator
allocator = ProducerIdBlockAllocator(sys.argv[1], block_size=int(sys.argv[2]))
print("ready", flush=True)
while True:
    print(allocator.allocate(), flush=True)
"""


@pytest.mark.timeout(60)
def test_allocator_never_repeats_an_id_across_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    rng = random.Random(3)
    everything: list[int] = []
    for block_size in (1, 1, 7, 1000, 1, 50):
        with subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(block_size)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:  # on exit: the pipe is closed and the child reaped
            try:
                assert child.stdout is not None
                assert child.stdout.readline() == "ready\n"
                with pytest.raises(LogLockedError):
                    ProducerIdBlockAllocator(path)
                first = child.stdout.readline()
                time.sleep(rng.uniform(0.0, 0.05))
                child.send_signal(signal.SIGKILL)
                # Read through the same buffered reader (communicate() with a timeout would read the raw
                # pipe and lose what readline() already buffered); the pipe ends when the child is gone.
                output = child.stdout.read()
                child.wait(timeout=10)
            finally:
                if child.poll() is None:
                    child.kill()
        assert child.returncode == -signal.SIGKILL
        # Every complete line is an id the child had allocated; a torn last line is left out.
        ids = [int(line) for line in (first + output).split("\n")[:-1]]
        assert ids == list(range(ids[0], ids[0] + len(ids)))  # one process hands out consecutive ids
        assert not everything or ids[0] > everything[-1]
        everything.extend(ids)
    assert everything == sorted(set(everything))
    with ProducerIdBlockAllocator(path) as allocator:
        assert allocator.allocate() > everything[-1]
