"""How cost grows: ``appliance bench partition-throughput`` and ``appliance bench recovery``.

(What an idle or a first-used partition costs is ``appliance bench partitions``: ``bench.partition_costs``.)

**Partition throughput** (``--counts 1,4,16,64,256``): for each count a fresh ``appliance serve`` with one
topic of that many partitions (one writer process each), one producer sending ``--records`` records through
``send_many`` (null keys: sticky partitioning, a new partition per batch). ``batch.size`` is cut so that every
partition gets several batches (total bytes / (4 x partitions), between 16 KiB and 1 MiB): a run that touches
only a few partitions would measure nothing about the rest. Reported per count: records/s, MB/s, the time
``appliance serve`` took to become ready, and unique memory (USS, the ``Private_*`` lines of
``/proc/PID/smaps_rollup``) of the supervisor and of all writers together, idle after start and after the run.
Pages shared copy-on-write with the supervisor (code, numba kernels) are not counted: that is the point of
forking the writers after the imports.

**Recovery** (``--segments 1,10,100,1000``, ``--max-bytes 2GiB``; ``--large``: 10 GiB): the segment size
is ``max-bytes / max(segments)``, so the log grows to ``max-bytes`` at the largest count.  For each count: a
fresh appliance, one partition with ``segment.bytes`` set so, filled with 1 KiB records (``send_many``); then

1. the whole process tree is SIGKILLed (a crash: nothing closed cleanly) and ``appliance serve`` started
   again: ``crash_restart_s`` (start to ready) and the supervisor's own ``recovered N partition logs in X
   ms`` line (``crash_recovery_ms``);
2. it is stopped with SIGTERM (``clean_stop_s``) and started again: ``clean_restart_s``.

Files stay in the page cache between writing and recovering (a restart right after a crash); after a reboot
recovery reads from the disk instead.  Free space is checked first (1.2 x the largest log).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

from bench.harness import Appliance, free_bytes
from bench.limits import MIB
from bench.produce import ProducerOutcome, ProduceSettings, payload_pool, produce_into
from bench.stats import Progress
from storage.errors import ApplianceError

__all__ = ["run_partitions", "run_recovery"]

_RECOVERED = re.compile(r"recovered (\d+) partition logs in (\d+) ms")
RECOVERY_RECORD_BYTES = 1024
SCALE_TOPIC = "scale"
RECOVERY_TOPIC = "recovery"


def _producer(app: Appliance, batch_size: int) -> Any:
    from appliance.client.producer import Producer

    return Producer({"appliance.control.socket": app.socket_path, "acks": "1", "batch.size": batch_size,
                     "client.id": "appliance-bench"})


def _mib(value: int) -> float:
    return round(value / MIB, 2)


def _utc(started_at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at))


# -- partitions -------------------------------------------------------------------------------------------


def run_partitions(counts: list[int], *, records: int = 1_000_000, record_size: int = 100,
                   api: str = "send_many", progress: bool = False) -> dict[str, Any]:
    """Throughput and memory per partition count; the JSON result (``rows``, one per count)."""
    started_at = time.time()
    rows = []
    for count in counts:
        total = records * record_size
        batch_size = int(min(1 << 20, max(16 << 10, total // (4 * count))))
        settings = ProduceSettings(records=records, record_size=record_size, partitions=count, api=api,
                                   batch_size=batch_size)
        rows.append(_partitions_row(settings, progress))
    lines = ["partitions  records/s      MB/s   ready s  USS sup+writers MiB  per writer MiB"]
    for row in rows:
        lines.append(f"{row['partitions']:>10}  {row['records_per_s']:>11,.0f}  {row['mb_per_s']:>8,.1f}  "
                     f"{row['serve_ready_s']:>7.2f}  {row['supervisor_and_writers_uss_mib']:>19,.1f}  "
                     f"{row['uss_per_writer_mib']:>14.2f}")
    return {"command": "partitions", "rows": rows, "summary": "\n".join(lines),
            "config": {"counts": counts, "records": records, "record_size": record_size, "api": api},
            "started_at": _utc(started_at), "notes": []}


def _partitions_row(settings: ProduceSettings, progress: bool) -> dict[str, Any]:
    """One count: a fresh appliance and topic of ``settings.partitions`` partitions, the run, its row."""
    count, batch_size = settings.partitions, settings.batch_size
    started = time.monotonic()
    app = Appliance.open(None)
    try:
        ready_s = time.monotonic() - started
        app.create_topic(SCALE_TOPIC, count)
        time.sleep(0.2)  # the writers of the new topic start
        idle = app.memory()
        outcome = _produce_to_every_partition(app, settings, progress)
        busy = app.memory()
        ends = app.end_offsets(SCALE_TOPIC)
    finally:
        app.close()
    seconds = (outcome.end_ns - outcome.start_ns) / 1e9
    return {
        "partitions": count, "records": outcome.records, "seconds": round(seconds, 4),
        "records_per_s": round(outcome.records / seconds, 1),
        "mb_per_s": round(outcome.payload_bytes / seconds / 1e6, 2), "batch_size": batch_size,
        "serve_ready_s": round(ready_s, 3),
        "partitions_written": sum(1 for e in ends if e > 1),
        "supervisor_uss_mib": _mib(busy["supervisor_uss_bytes"]),
        "writers_uss_mib": _mib(busy["writers_uss_bytes"]),
        "supervisor_and_writers_uss_mib": _mib(busy["supervisor_and_writers_uss_bytes"]),
        "uss_per_writer_mib": _mib(busy["writers_uss_bytes"] // max(busy["writers"], 1)),
        "idle_supervisor_and_writers_uss_mib": _mib(idle["supervisor_and_writers_uss_bytes"]),
    }


def _produce_to_every_partition(app: Appliance, settings: ProduceSettings, progress: bool) -> ProducerOutcome:
    """A record to every partition (a ring each) and an untimed warm-up, then the timed run."""
    batch_size, api, records = settings.batch_size, settings.api, settings.records
    assert batch_size is not None
    pool = payload_pool(settings, batch_size)
    producer = _producer(app, batch_size)
    try:
        first = pool[0].tobytes()
        for partition in range(settings.partitions):  # a ring per partition before the clock starts
            producer.send(SCALE_TOPIC, first, partition=partition)
        producer.flush()
        produce_into(producer, SCALE_TOPIC, pool, min(records, 50_000), api=api, batch_bytes=batch_size)
        line = Progress(records, settings.record_size, enabled=progress,
                        label=f"{settings.partitions} partitions: ")
        outcome = produce_into(producer, SCALE_TOPIC, pool, records, api=api, batch_bytes=batch_size,
                               counter=line.update)
        line.finish()
        return outcome
    finally:
        producer.close(timeout=60)


# -- recovery ---------------------------------------------------------------------------------------------


def _recovered_ms(app: Appliance) -> int | None:
    """The supervisor's own figure from its last start: ``recovered N partition logs in X ms``."""
    found = _RECOVERED.findall(app.log_tail(1 << 20))
    return int(found[-1][1]) if found else None


def run_recovery(segment_counts: list[int], *, max_bytes: int = 2 << 30, data_dir: str | None = None,
                 progress: bool = False) -> dict[str, Any]:
    """Crash-restart and clean-restart time per segment count; the JSON result (``rows``)."""
    largest = max(segment_counts)
    segment_bytes = max(1 << 20, max_bytes // largest)
    need = int(segment_bytes * largest * 1.2)
    where = data_dir or "/tmp"
    free = free_bytes(where)
    if free < need:
        raise ApplianceError(f"recovery benchmark: needs {need / 2**30:.1f} GiB free in {where}, has "
                             f"{free / 2**30:.1f} GiB; give --max-bytes lower or --data-dir elsewhere")
    started_at = time.time()
    rows = [_recovery_row(count, segment_bytes, data_dir, progress) for count in segment_counts]
    lines = ["segments   log GiB  crash restart s  (recovery ms)  clean stop s  clean restart s"]
    for row in rows:
        lines.append(f"{row['segments']:>8}  {row['log_gib']:>8.3f}  {row['crash_restart_s']:>15.2f}  "
                     f"{row['crash_recovery_ms']!s:>13}  {row['clean_stop_s']:>12.2f}  "
                     f"{row['clean_restart_s']:>15.2f}")
    return {"command": "recovery", "rows": rows, "summary": "\n".join(lines),
            "config": {"segments": segment_counts, "max_bytes": max_bytes, "segment_bytes": segment_bytes},
            "started_at": _utc(started_at), "notes": [
                "files are in the page cache (restart right after the crash); a cold cache reads the disk"]}


def _recovery_row(count: int, segment_bytes: int, data_dir: str | None, progress: bool) -> dict[str, Any]:
    """One count: a fresh appliance whose one partition fills ``count`` segments, killed and restarted, then
    stopped and restarted; its row."""
    where = Path(data_dir) / f"recovery-{count}" if data_dir else None
    overrides = [f"topics.recovery.segment.bytes={segment_bytes}", "topics.recovery.partitions=1"]
    app = Appliance.start(where, overrides=overrides)
    try:
        _fill_segments(app, segment_bytes * count, segment_bytes, progress, f"{count} segments: ")
        on_disk = app.log_bytes(RECOVERY_TOPIC)
        segments = sum(1 for _ in Path(app.topic(RECOVERY_TOPIC).partitions[0].directory).glob("*.log"))
        app.kill()
        crash_restart_s = app.restart()
        crash_recovery_ms = _recovered_ms(app)
        clean_stop_s = app.stop()
        clean_restart_s = app.restart()
        clean_recovery_ms = _recovered_ms(app)
    finally:
        app.close()
        if where is not None:
            shutil.rmtree(where, ignore_errors=True)
    return {
        "segments": segments, "segment_bytes": segment_bytes, "log_bytes": on_disk,
        "log_gib": round(on_disk / 2**30, 3), "crash_restart_s": round(crash_restart_s, 3),
        "crash_recovery_ms": crash_recovery_ms, "clean_stop_s": round(clean_stop_s, 3),
        "clean_restart_s": round(clean_restart_s, 3), "clean_recovery_ms": clean_recovery_ms,
    }


def _fill_segments(app: Appliance, log_bytes: int, segment_bytes: int, progress: bool, label: str) -> None:
    """About ``log_bytes`` of 1 KiB random records into the recovery topic, ~8 batches a segment."""
    records = max(1, log_bytes // (RECOVERY_RECORD_BYTES + 8))
    settings = ProduceSettings(records=records, record_size=RECOVERY_RECORD_BYTES, api="send_many",
                               payload="random")
    batch_size = int(min(1 << 20, max(64 << 10, segment_bytes // 8)))  # ~8 batches per segment
    pool = payload_pool(settings, batch_size)
    producer = _producer(app, batch_size)
    try:
        line = Progress(records, RECOVERY_RECORD_BYTES, enabled=progress, label=label)
        produce_into(producer, RECOVERY_TOPIC, pool, records, api="send_many", counter=line.update,
                     batch_bytes=batch_size)
        line.finish()
    finally:
        producer.close(timeout=120)
