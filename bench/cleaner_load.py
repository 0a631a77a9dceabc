"""``appliance bench cleaner``: what the cleaner process costs the producers, and its memory.

One appliance, two topics: ``dirty``, compacted (``min.cleanable.dirty.ratio`` 0.01), refilled before each
pair with ``--dirty-records`` keyed records of ``--keys`` keys (untimed), and a fresh ``delete`` topic per
run that ``send()`` produces ``--records`` records of ``--record-size`` bytes into (``bench.produce``).
In each pair one run has the cleaner stopped (SIGSTOP: no CPU, no I/O) and one has it cleaning ``dirty``
(SIGCONT, and the run starts once the cleaner's log says it began a pass); the order alternates from pair
to pair.  The result: each run's records/s, the median ratio with / without, the load average at each
pair's end, whether the cleaner was still in its pass when each "with" run ended, and the cleaner's memory
against ``log.cleaner.dedupe.buffer.size``: its anonymous resident memory (``RssAnon``: heap and arrays,
not the page cache of the segments it maps) read every 2 ms from ``/proc/PID/status`` during each "with"
run, its peak less its value just before the pass (the growth the buffer bounds), and its value before any
pass (numba's kernels not loaded yet); the peak of ``RssFile`` (pages of the files it maps) beside its idle
value; also ``VmHWM``, which counts file pages of mapped segments and the
pages shared with the supervisor it was forked from.  The throttle is the default (no limit) unless
``--override`` sets ``log.cleaner.io.max.bytes.per.second``.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import Appliance
from bench.produce import ProduceSettings, open_producer, run_produce

__all__ = ["run_cleaner_load"]

_DIRTY = "dirty"
_SEGMENT_BYTES = 8 << 20  # the dirty topic's; the cleaner cleans only segments rolled


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


class _AnonPeak:
    """The largest ``RssAnon`` of process ``pid``, read every 2 ms on a thread until :meth:`stop`; also the
    largest ``RssFile`` (pages of mapped files) beside it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = _status_kib(pid, "RssAnon")
        self.file_peak_kib = _status_kib(pid, "RssFile")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(0.002):
            self.peak_kib = max(self.peak_kib, _status_kib(self.pid, "RssAnon"))
            self.file_peak_kib = max(self.file_peak_kib, _status_kib(self.pid, "RssFile"))

    def stop(self) -> int:
        self._stopped.set()
        self._thread.join()
        return self.peak_kib


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
        app.create_topic(_DIRTY, 1, {"cleanup.policy": "compact", "segment.bytes": _SEGMENT_BYTES,
                                     "min.cleanable.dirty.ratio": 0.01})
        cleaner = _cleaner_pid(app)
        idle_rss_kib = _status_kib(cleaner, "VmRSS")
        idle_anon_kib = _status_kib(cleaner, "RssAnon")
        anon_growth_kib: list[int] = []
        anon_peak_kib = idle_anon_kib
        idle_file_kib = _status_kib(cleaner, "RssFile")
        file_peak_kib = idle_file_kib
        loads: list[float] = []
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
                before_kib = _status_kib(cleaner, "RssAnon")
                sampler = _AnonPeak(cleaner)
                os.kill(cleaner, signal.SIGCONT)
                try:
                    deadline = time.monotonic() + 30
                    while _passes(app)[0] == begun:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the cleaner began no pass of {_DIRTY}-0 within 30 s: "
                                               f"--dirty-records {dirty_records} must fill more than one "
                                               f"{_SEGMENT_BYTES >> 20} MiB segment (about 62,000 records)")
                        time.sleep(0.01)
                    with_rates.append(_run(app, records, record_size))
                    busy_throughout.append(_passes(app)[1] == finished)
                    os.kill(cleaner, signal.SIGSTOP)
                finally:
                    peak_kib = sampler.stop()
                anon_growth_kib.append(peak_kib - before_kib)
                anon_peak_kib = max(anon_peak_kib, peak_kib)
                file_peak_kib = max(file_peak_kib, sampler.file_peak_kib)
            loads.append(os.getloadavg()[0])
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
            "load_1min": [round(x, 1) for x in loads],
            "cleaner_rss_anon_idle_bytes": idle_anon_kib * 1024,
            "cleaner_rss_anon_peak_bytes": anon_peak_kib * 1024,
            "cleaner_rss_file_idle_bytes": idle_file_kib * 1024,
            "cleaner_rss_file_peak_bytes": file_peak_kib * 1024,
            "cleaner_rss_anon_growth_bytes": [k * 1024 for k in anon_growth_kib],
            "cleaner_idle_rss_bytes": idle_rss_kib * 1024,
            "cleaner_vm_hwm_bytes": _status_kib(cleaner, "VmHWM") * 1024,
            "dedupe_buffer_bytes": _dedupe_buffer(overrides),
            "summary": (f"send() {record_size} B: {statistics.median(with_rates):,.0f} records/s with the "
                             f"cleaner cleaning, {statistics.median(without_rates):,.0f} without; median "
                             f"ratio {statistics.median(ratios):.2f}; cleaner RssAnon growth during a pass "
                             f"{max(anon_growth_kib) / 1024:.1f} MiB at most (idle before any pass "
                             f"{idle_anon_kib / 1024:.1f} MiB); VmHWM "
                             f"{_status_kib(cleaner, 'VmHWM') / 1024:.1f} MiB (idle RSS "
                             f"{idle_rss_kib / 1024:.1f} MiB; file pages and pages shared with the "
                             "supervisor included)"),
        }
    finally:
        app.close()


def _dedupe_buffer(overrides: list[str]) -> int:
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "log.cleaner.dedupe.buffer.size":
            return int(value)
    return 134_217_728
