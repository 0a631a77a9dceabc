"""``bench.partition_costs``' readings of ``/proc`` and ``/dev/shm`` on a real process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from bench.partition_costs import idle_core_pct, tree_pids, tree_usage, waves


def test_the_tree_holds_every_descendant_and_its_memory() -> None:
    grandchild = ("import subprocess, sys; "
                  "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])")
    child = subprocess.Popen([sys.executable, "-c", grandchild])
    name = f"la-test-costs-{uuid.uuid4().hex}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, 1 << 20)
        for _ in range(500):  # until the grandchild runs (other tests' processes may be our children too)
            if len(tree_pids(child.pid)) >= 2:
                break
            time.sleep(0.01)
        pids = tree_pids(os.getpid())
        assert os.getpid() in pids and child.pid in pids and len(pids) >= 3, pids
        usage = tree_usage(child.pid, f"/{name}")
        assert usage.processes == 2 and usage.pss_bytes > 0
        assert usage.shm_bytes == 1 << 20  # allocated blocks, not the size
        assert 0.0 <= idle_core_pct(child.pid, 0.2) < 100.0
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")
        for pid in tree_pids(child.pid)[1:]:
            os.kill(pid, 9)
        child.kill()
        child.wait()


def test_a_produce_round_goes_in_waves_that_cover_every_partition_once() -> None:
    assert waves(10, 1000) == [range(0, 10)]
    assert waves(5000, 1000) == [range(i, i + 1000) for i in range(0, 5000, 1000)]
    parts = waves(2500, 1000)
    assert [len(w) for w in parts] == [1000, 1000, 500]
    assert [p for w in parts for p in w] == list(range(2500))
