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
