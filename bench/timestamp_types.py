"""``appliance bench produce --message-timestamp-type compare``: what LogAppendTime costs the produce path.

A topic with ``message.timestamp.type=LogAppendTime`` has its partition writer stamp each batch's
timestamp-type bit and ``maxTimestamp`` and recompute the batch's CRC (``storage.timestamp_rules``); a
CreateTime topic's writer only stamps offsets.  The comparison runs the same produce (``bench.produce``) on
a fresh CreateTime topic and a fresh LogAppendTime topic in alternation, ``PAIRS`` times, in one appliance,
so both see the same load and page cache, and reports each run and the ratio of the medians
(LogAppendTime records/s over CreateTime records/s) as ``extra.log_append_time_ratio``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Final

from bench.harness import Appliance
from bench.produce import ProduceSettings, run_produce

__all__ = ["PAIRS", "compare_timestamp_types"]

PAIRS: Final = 3


def compare_timestamp_types(app: Appliance, settings: ProduceSettings, *, progress: bool = False,
                            bootstrap: str | None = None, pairs: int = PAIRS) -> dict[str, Any]:
    """The LogAppendTime runs' result, with every run's records/s and the ratio of the medians in
    ``extra``."""
    rates: dict[str, list[float]] = {"CreateTime": [], "LogAppendTime": []}
    last: dict[str, Any] = {}
    for _ in range(pairs):
        for kind in rates:
            run = dataclasses.replace(settings, timestamp_type=kind, topic=None)
            last = run_produce(app, run, progress=progress, bootstrap=bootstrap)
            rates[kind].append(float(last["records_per_s"]))
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    ratio = medians["LogAppendTime"] / medians["CreateTime"] if medians["CreateTime"] else 0.0
    last["command"] = "produce-timestamp-types"
    last["extra"] = {**last["extra"], "records_per_s": rates, "median_records_per_s": medians,
                     "log_append_time_ratio": round(ratio, 3)}
    last["notes"] = [*last["notes"], f"{pairs} CreateTime/LogAppendTime pairs in alternation; "
                     f"LogAppendTime / CreateTime median records/s = {ratio:.3f}"]
    return last


def append_cost(records: int, batches: int, rounds: int = 8) -> dict[str, float]:
    """Microseconds per ``Log.append_batches`` of one batch of ``records`` 100-byte records, best of
    ``rounds`` alternating rounds of ``batches`` appends, for each timestamp type: the writer's own share
    of the stamp, apart from the producers and the load of the rest of the host.  The CreateTime batches'
    timestamps grow by 1 ms per batch, as a live producer's do, so both kinds add time-index entries."""
    import tempfile
    import time

    from storage.batch_builder import build_batch
    from storage.batch_header import parse_header
    from storage.log import Log
    from storage.log_config import LogConfig

    first_ms = int(time.time() * 1000)
    built = [bytes(build_batch([b"x" * 100] * records, timestamp_ms=first_ms + i)) for i in range(batches)]
    best = {"CreateTime": float("inf"), "LogAppendTime": float("inf")}
    for _ in range(rounds):
        for kind in best:
            views = [memoryview(bytearray(b)) for b in built]
            headers = [parse_header(v) for v in views]
            with tempfile.TemporaryDirectory(dir="/dev/shm") as directory, Log.open(
                    f"{directory}/t-0", LogConfig(message_timestamp_type=kind, preallocate=False)) as log:
                started = time.perf_counter()
                for view, header in zip(views, headers, strict=True):
                    log.append_batches([view], [header], leader_epoch=0)
                best[kind] = min(best[kind], (time.perf_counter() - started) / batches * 1e6)
    return best


if __name__ == "__main__":
    for count, appends in ((10, 2000), (1000, 300)):
        cost = append_cost(count, appends)
        print(f"{count} records of 100 B per batch: CreateTime {cost['CreateTime']:.1f} us, LogAppendTime "
              f"{cost['LogAppendTime']:.1f} us per append; throughput ratio "
              f"{cost['CreateTime'] / cost['LogAppendTime']:.3f}")
