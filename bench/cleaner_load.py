"""``appliance bench cleaner``: what the cleaner process costs the producers, and its memory.

One appliance, two topics: ``dirty``, compacted (``min.cleanable.dirty.ratio`` 0.01), refilled before each
pair with ``--dirty-records`` keyed records of ``--keys`` keys (untimed), and a fresh ``delete`` topic per
run that ``send()`` produces ``--records`` records of ``--record-size`` bytes into (``bench.produce``).
In each pair one run has the cleaner stopped (SIGSTOP: no CPU, no I/O) and one has it cleaning ``dirty``
(SIGCONT, and the run starts once the cleaner's log says it began a pass); the order alternates from pair
to pair.  The result: each run's records/s, the median ratio with / without, whether the cleaner was still
in its pass when each "with" run ended, and the cleaner's peak resident memory (``VmHWM``, which counts
the pages it shares with the supervisor it was forked from) beside its resident memory before any pass,
against ``log.cleaner.dedupe.buffer.size``.  The throttle is the default (no limit) unless ``--override`` sets
``log.cleaner.io.max.bytes.per.second``.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness import Appliance
from bench.produce import ProduceSettings, open_producer, run_produce

__all__ = ["run_cleaner_load"]

_DIRTY = "dirty"


def _cleaner_pid(app: Appliance) -> int:
    with app.client() as client:
        status = client.status()
    for child in status.get("children", []):
        if child.get("name") == "cleaner" and child.get("pid"):
            return int(child["pid"])
    raise RuntimeError("no cleaner process runs (log.cleaner.enable=false?)")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _fill(app: Appliance, records: int, keys: int, record_size: int, round_: int) -> None:
    producer = open_producer({"appliance.control.socket": app.socket_path, "acks": "1"})
    try:
        value = (b"%06d-" % round_).ljust(record_size, b"d")
        for i in range(records):
            producer.send(_DIRTY, value, key=b"key-%09d" % (i % keys))
        producer.flush(120)
    finally:
        producer.close(timeout=60)


def _passes(app: Appliance) -> tuple[int, int]:
    text = app.log_tail(1 << 22)
    return text.count(f"cleaner: cleaning {_DIRTY}-0"), text.count(f"cleaner: {_DIRTY}-0 cleaned offsets")


def _run(app: Appliance, records: int, record_size: int) -> float:
    settings = ProduceSettings(records=records, record_size=record_size, api="send", measure_limits=False)
    return float(run_produce(app, settings, command="cleaner")["records_per_s"])


def run_cleaner_load(*, records: int, record_size: int, dirty_records: int, keys: int, pairs: int,
                     overrides: list[str]) -> dict[str, Any]:
    """The measurement of the module docstring; its JSON result."""
    app = Appliance.open(None, overrides=["log.cleaner.backoff.ms=100", *overrides])
    try:
        app.create_topic(_DIRTY, 1, {"cleanup.policy": "compact", "segment.bytes": 8 << 20,
                                     "min.cleanable.dirty.ratio": 0.01})
        cleaner = _cleaner_pid(app)
        idle_rss_kib = _status_kib(cleaner, "VmRSS")
        with_rates: list[float] = []
        without_rates: list[float] = []
        busy_throughout: list[bool] = []
        for pair in range(pairs):
            os.kill(cleaner, signal.SIGSTOP)
            _fill(app, dirty_records, keys, 100, pair)
            for cleaning in ((True, False) if pair % 2 else (False, True)):
                if not cleaning:
                    without_rates.append(_run(app, records, record_size))
                    continue
                begun, finished = _passes(app)
                os.kill(cleaner, signal.SIGCONT)
                deadline = time.monotonic() + 30
                while _passes(app)[0] == begun and time.monotonic() < deadline:
                    time.sleep(0.01)
                with_rates.append(_run(app, records, record_size))
                busy_throughout.append(_passes(app)[1] == finished)
                os.kill(cleaner, signal.SIGSTOP)
        os.kill(cleaner, signal.SIGCONT)
        ratios = [w / wo for w, wo in zip(with_rates, without_rates, strict=True)]
        return {
            "command": "cleaner",
            "records": records, "record_size": record_size, "dirty_records": dirty_records, "keys": keys,
            "with_cleaner_records_per_s": with_rates,
            "without_cleaner_records_per_s": without_rates,
            "ratio_median": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "cleaner_busy_throughout": busy_throughout,
            "cleaner_idle_rss_bytes": idle_rss_kib * 1024,
            "cleaner_vm_hwm_bytes": _status_kib(cleaner, "VmHWM") * 1024,
            "dedupe_buffer_bytes": _dedupe_buffer(overrides),
            "summary": (f"send() {record_size} B: {statistics.median(with_rates):,.0f} records/s with the "
                             f"cleaner cleaning, {statistics.median(without_rates):,.0f} without; median "
                             f"ratio {statistics.median(ratios):.2f}; cleaner VmHWM "
                             f"{_status_kib(cleaner, 'VmHWM') / 1024:.1f} MiB (idle RSS "
                             f"{idle_rss_kib / 1024:.1f} MiB, pages shared with the supervisor included)"),
        }
    finally:
        app.close()


def _dedupe_buffer(overrides: list[str]) -> int:
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "log.cleaner.dedupe.buffer.size":
            return int(value)
    return 134_217_728
