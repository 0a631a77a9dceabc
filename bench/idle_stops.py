"""Writers going idle together: how many the supervisor had to kill, and how long the stops took.

Each run starts a private ``appliance serve`` with two topics of ``--partitions`` partitions and short idle
times (``appliance.writer.idle.ms`` and ``appliance.ring.idle.ms`` = ``--idle-ms``); a local Producer writes
one record to every partition of the first topic and closes, then does the same to the second while the
first topic's writers go idle and stop; then it waits until no writer process is left.  Reported: the
writers the supervisor logged as "did not stop" (and killed), the seconds of the second produce, and the
seconds from the end of the first produce until every writer had exited::

    python -m bench.idle_stops --partitions 300 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from appliance.client.producer import Producer
from bench.harness import Appliance

__all__ = ["IdleStops", "main", "measure"]


class IdleStops(NamedTuple):
    """One run's figures."""

    partitions: int  # per topic (two topics)
    killed: int  # writers logged "did not stop ... killing it"
    second_produce_s: float  # one record to every partition of the second topic, while the first goes idle
    all_stopped_s: float  # from the end of the first produce until no writer process was left


def _writers(group: int) -> int:
    """Writer processes in the process group ``group``."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            title = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        count += int(fields[2]) == group and title.startswith(b"appliance: writer")
    return count


def _produce(socket_path: str, topic: str, partitions: int) -> float:
    started = time.monotonic()
    with Producer({"appliance.control.socket": socket_path, "acks": "all"}) as producer:
        for i in range(partitions):
            producer.send(topic, b"%s-%d" % (topic.encode(), i), partition=i)
        producer.flush(600)
    return time.monotonic() - started


def measure(partitions: int, idle_ms: int = 3000, timeout_s: float = 600) -> IdleStops:
    overrides = [f"topics.a.partitions={partitions}", f"topics.b.partitions={partitions}",
                 f"appliance.writer.idle.ms={idle_ms}", f"appliance.ring.idle.ms={idle_ms}"]
    with Appliance.open(None, overrides=overrides) as app:
        assert app.process is not None and app.log_path is not None
        _produce(app.socket_path, "a", partitions)
        first_done = time.monotonic()
        second = _produce(app.socket_path, "b", partitions)
        deadline = first_done + timeout_s
        while _writers(app.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        all_stopped = time.monotonic() - first_done
        killed = app.log_path.read_text(errors="replace").count("did not stop")
    return IdleStops(partitions, killed, round(second, 2), round(all_stopped, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_stops", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=300, help="partitions per topic (two topics)")
    parser.add_argument("--idle-ms", type=int, default=3000, help="appliance.writer.idle.ms and ring.idle.ms")
    parser.add_argument("--json", help="write the figures to this file as well")
    args = parser.parse_args(argv)
    result = measure(args.partitions, args.idle_ms)
    print(f"{2 * result.partitions} writers going idle: {result.killed} killed as 'did not stop'; "
          f"second produce {result.second_produce_s} s; all writers exited "
          f"{result.all_stopped_s} s after the first produce")
    if args.json:
        Path(args.json).write_text(json.dumps(result._asdict(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
