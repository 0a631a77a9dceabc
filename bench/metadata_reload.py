"""What the broker's blocking topic-list reload costs a Metadata request: ``.venv/bin/python -m
bench.metadata_reload [--partitions 10,1000,4000] [--requests 15]``.

For each size, one appliance (a temporary data dir) with topics of at most 1,000 partitions adding up to it
(``--partitions``), nothing produced; then Metadata v4 for no topic (the broker answers from its table, so the
time is its own), ``--requests`` times after 250 ms with no request (the table older than the broker's 200 ms:
each reloads the topic list from the supervisor first and waits) and as many times back to back (none
reloads), then for a name that does not exist back to back for ``--flood-s`` seconds (each may force a
reload: a client asking for a topic not created yet, in a loop).  Prints the wall-clock medians and ranges;
the difference is the stall a reload puts in the broker's loop, and the flood's share of its time spent
reloading (docs/performance.md, "The broker's blocking topic-list reload").
"""

from __future__ import annotations

import argparse
import statistics
import time

from appliance.client.kafka_cluster import KafkaCluster
from bench.harness import Appliance

QUIET_S = 0.25  # longer than the broker's METADATA_REFRESH_MS (200 ms)


def _timed(cluster: KafkaCluster, pause_s: float, topics: list[str] | None = None) -> float:
    if pause_s:
        time.sleep(pause_s)
    start = time.perf_counter()
    cluster.metadata(topics or [])
    return 1e3 * (time.perf_counter() - start)


def measure(partitions: int, requests: int, flood_s: float) -> str:
    with Appliance.start(None) as app:
        sizes = [1000] * (partitions // 1000) + ([partitions % 1000] if partitions % 1000 else [])
        for n, size in enumerate(sizes):
            app.create_topic(f"t{n}", size)
        cluster = KafkaCluster(app.require_bootstrap())
        try:
            _timed(cluster, 0)  # connected, versions negotiated
            quiet = [_timed(cluster, QUIET_S) for _ in range(requests)]
            busy = [_timed(cluster, 0) for _ in range(requests)]
            flood: list[float] = []
            until = time.perf_counter() + flood_s
            while time.perf_counter() < until:
                flood.append(_timed(cluster, 0, ["no-such-topic"]))
        finally:
            cluster.close()
    stall = statistics.median(quiet) - statistics.median(busy)
    reloading = sum(t for t in flood if t > statistics.median(busy) + stall / 2) / (flood_s * 1000)
    return (f"{partitions:>6} partitions ({len(sizes)} topics): after {QUIET_S * 1000:.0f} ms quiet "
            f"{statistics.median(quiet):.2f} ms ({min(quiet):.2f}-{max(quiet):.2f}), back to back "
            f"{statistics.median(busy):.2f} ms ({min(busy):.2f}-{max(busy):.2f}); an unknown name back to "
            f"back {len(flood) / flood_s:.0f} requests/s, {100 * reloading:.0f}% of the time in requests "
            f"that reloaded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="10,1000,4000", help="total partitions of each run")
    parser.add_argument("--requests", type=int, default=15, help="Metadata requests of each kind")
    parser.add_argument("--flood-s", type=float, default=3.0, help="seconds of Metadata for an unknown name")
    args = parser.parse_args()
    for partitions in (int(p) for p in args.partitions.split(",")):
        print(measure(partitions, args.requests, args.flood_s), flush=True)


if __name__ == "__main__":
    main()
