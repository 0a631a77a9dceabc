"""What idle partitions cost: CPU, wake-ups and memory of an appliance that serves N partitions and no one.

Runs ``appliance serve`` of a given source tree (its own ``.venv``), so two trees can be compared in
turns (A B A B) on the same host::

    python -m bench.idle_writers --tree /work/wt-idle-base --tree . --partitions 100 --seconds 10 --rounds 2

Each run: a fresh data directory, one topic of ``--partitions`` partitions created at start and never
produced to; the start-up time (from the fork of ``appliance serve`` to its "ready:" line, and to the last
writer when writers are resident); a settle time, then ``--seconds`` of measurement: the CPU time (utime +
stime, ``/proc/PID/stat``) of the supervisor, of all writers together and of the whole process tree, as a
share of one core; the voluntary context switches of every thread of every writer
(``/proc/PID/task/*/status``: each one is a sleep that ended, i.e. a wake-up), per writer and second; and
the proportional set size of the whole tree (``Pss`` of ``/proc/PID/smaps_rollup``) at the end.
With writers on demand (``appliance.writer.idle.ms`` >= 0) an idle partition has no writer, so ``writers``
is 0; ``--override KEY=VALUE`` passes settings on (``appliance.writer.idle.ms=-1``: resident writers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.partition_costs import cpu_ticks, pss_bytes

__all__ = ["IdleCost", "main", "measure"]

_TICKS = os.sysconf("SC_CLK_TCK")


class IdleCost(NamedTuple):
    """One run's figures."""

    tree: str
    partitions: int
    seconds: float
    writers: int
    writers_core_pct: float
    supervisor_core_pct: float
    tree_core_pct: float
    wakeups_per_writer_s: float
    startup_s: float  # fork of `appliance serve` to "ready:" (and to every writer, when they are resident)
    tree_pss_mib: float


def _wakeups(pid: int) -> int:
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    except OSError:
        pass
    return total


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _is_writer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"appliance: writer ")
    except OSError:
        return False


def measure(tree: Path, partitions: int, seconds: float, settle_s: float = 5.0,
            overrides: tuple[str, ...] = ()) -> IdleCost:
    """Start the tree's appliance with ``partitions`` idle partitions, measure ``seconds``, stop it."""
    cwd = Path(tempfile.mkdtemp(prefix="la-idle-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("NOTIFY_SOCKET", None)
    args = [str(tree / ".venv" / "bin" / "python"), "-m", "appliance.cli", "serve",
            "--override", f"topics.idle.partitions={partitions}", "--override", "listeners=127.0.0.1:0"]
    for item in overrides:
        args += ["--override", item]
    resident = "appliance.writer.idle.ms=-1" in overrides
    log_path = cwd / "serve.log"
    begun = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while b"ready:" not in log_path.read_bytes() or (
            resident and len([p for p in _children(process.pid) if _is_writer(p)]) < partitions
        ):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the appliance of {tree} did not start: {cwd}/serve.log")
            time.sleep(0.05)
        startup_s = time.monotonic() - begun
        time.sleep(settle_s)
        writers = [p for p in _children(process.pid) if _is_writer(p)]
        everyone = [process.pid, *_children(process.pid)]
        before = {pid: (cpu_ticks(pid), _wakeups(pid)) for pid in everyone}
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        after = {pid: (cpu_ticks(pid), _wakeups(pid)) for pid in everyone}
        pss_mib = sum(pss_bytes(pid) for pid in everyone) / 2**20
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(cwd, ignore_errors=True)

    def core_pct(pids: list[int]) -> float:
        ticks = sum(after[p][0] - before[p][0] for p in pids)
        return round(100.0 * ticks / _TICKS / elapsed, 2)

    wakeups = sum(after[p][1] - before[p][1] for p in writers)
    return IdleCost(str(tree), partitions, round(elapsed, 2), len(writers), core_pct(writers),
                    core_pct([process.pid]), core_pct(everyone),
                    round(wakeups / max(len(writers), 1) / elapsed, 3), round(startup_s, 2),
                    round(pss_mib, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_writers", description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", type=Path, required=True, help="a source tree (repeat)")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="turns over the trees (A B A B ...)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every tree's appliance (repeat)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for tree in args.tree:
            cost = measure(tree.resolve(), args.partitions, args.seconds, overrides=tuple(args.override))
            rows.append(cost._asdict())
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
