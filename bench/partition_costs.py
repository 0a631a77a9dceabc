"""What partitions cost: ``appliance bench partitions --counts 10,100,1000,5000``.

For each count a fresh ``appliance serve`` (its own data directory), and in it, over the Kafka protocol with
confluent-kafka (librdkafka):

1. **create**: one CreateTopics of a topic of that many partitions (AdminClient, ``operation_timeout`` 600
   s): seconds from the request to its answer.
2. **idle**: after :data:`SETTLE_S`, the CPU time (utime + stime of ``/proc/PID/stat``) of every process of
   the appliance's tree (the supervisor and all its descendants, listed again at the end so none is missed)
   over ``--idle-s`` seconds, as a share of one core; then the tree's total PSS (``Pss:`` of
   ``/proc/PID/smaps_rollup``, so pages shared copy-on-write between the supervisor and its children are
   counted once) and the instance's ``/dev/shm`` use (the allocated blocks of every object whose name
   starts with the instance's prefix, from the supervisor's ``status``).
3. **first produce**: one record to every partition from one producer (``linger.ms`` 5, acks all): seconds
   from the first ``produce()`` to the last delivery report.  This is the cost of the first use of each
   partition (the broker attaches rings, writers wake).
4. **throughput**: ``--records`` records of ``--record-size`` bytes into a topic of one partition, then the
   same into the N partitions (round robin), each from a new producer, in the same appliance; the ratio
   N / 1 of records per second.
5. **after the round**: PSS and ``/dev/shm`` again, once the producers have closed.

**Waves.**  Steps 3 and 4 run a writer process for every partition they touch, ~6 MiB each: 5,000 at once
would take more memory than a small host has.  Above ``--wave`` partitions (default :data:`WAVE`) they go
in waves of that many partitions: the first produce, then the throughput run (its records split evenly),
wave after wave, and between two waves the bench waits until the previous wave's writers have exited, so
at most one wave's writers run at a time.  For that the appliance of such a row gets
``appliance.ring.idle.ms`` and ``appliance.writer.idle.ms`` of :data:`WAVE_IDLE_MS` (unless ``--override``
sets them).  The row then reports each wave's first-produce seconds (``first_produce_waves_s``; the total
is their sum, waits excluded), the throughput over the waves' own time, and ``peak_pss_mib``: the most
PSS seen right after a wave (all its writers up).

The results are a table and JSON (``--json FILE``), like the other bench commands.  ``--override KEY=VALUE``
passes settings to the appliance (``appliance.ring.bytes`` bounds ``/dev/shm`` per ring).
"""

from __future__ import annotations

import os
import time
from typing import Any, Final, NamedTuple

from bench.harness import Appliance
from storage.errors import ConfigError

__all__ = ["SETTLE_S", "WAVE", "TreeUsage", "run_partition_costs", "tree_pids", "tree_usage", "waves"]

SETTLE_S: Final = 3.0  # after a change, before an idle measure: writers started, the loop asleep
WAVE: Final = 1000  # the most partitions a produce round touches at once (module docstring, "Waves")
WAVE_IDLE_MS: Final = 1000  # ring.idle.ms and writer.idle.ms of a row that goes in waves
WAVE_GONE_S: Final = 300.0  # the longest wait for a wave's writers to exit
TOPIC: Final = "costs"
ONE: Final = "costs-one"
_TICKS: Final = os.sysconf("SC_CLK_TCK")
_MIB: Final = 1 << 20


class TreeUsage(NamedTuple):
    """Memory of the appliance at one moment."""

    processes: int
    pss_bytes: int  # total PSS of the process tree
    shm_bytes: int  # allocated blocks of the instance's /dev/shm objects


# -- /proc --------------------------------------------------------------------------------------------------


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant (``/proc/PID/task/*/children``)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def cpu_ticks(pid: int) -> int:
    """User plus system clock ticks of ``pid`` so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def pss_bytes(pid: int) -> int:
    """The proportional set size of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _shm_bytes(prefix: str) -> int:
    name_prefix = prefix.lstrip("/")
    total = 0
    with os.scandir("/dev/shm") as entries:
        for entry in entries:
            if entry.name.startswith(name_prefix):
                try:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    return total


def tree_usage(root: int, shm_prefix: str) -> TreeUsage:
    pids = tree_pids(root)
    return TreeUsage(len(pids), sum(pss_bytes(p) for p in pids), _shm_bytes(shm_prefix))


def idle_core_pct(root: int, seconds: float) -> float:
    """CPU of the whole tree over ``seconds``, as a share of one core (percent)."""
    before = {pid: cpu_ticks(pid) for pid in tree_pids(root)}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = {pid: cpu_ticks(pid) for pid in tree_pids(root)}
    ticks = sum(t - before.get(pid, 0) for pid, t in after.items())
    return 100.0 * ticks / _TICKS / elapsed


# -- the Kafka side -----------------------------------------------------------------------------------------


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ConfigError("appliance bench partitions needs confluent-kafka (pip install "
                          "confluent-kafka)") from None
    return confluent_kafka


def create_seconds(bootstrap: str, topic: str, partitions: int) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})  # thousands: minutes
    started = time.monotonic()
    future = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=600,
                                 request_timeout=660)[topic]  # fmt: skip
    future.result(timeout=700)
    return time.monotonic() - started


def _producer(bootstrap: str) -> Any:
    return _kafka().Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                              "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})


def waves(count: int, wave: int) -> list[range]:
    """The partitions ``0..count-1`` in consecutive waves of at most ``wave``."""
    return [range(first, min(first + wave, count)) for first in range(0, count, max(wave, 1))]


def first_produce_seconds(bootstrap: str, topic: str, partitions: range) -> float:
    """One record to every partition of ``partitions``: from the first produce() to the last delivery
    report."""
    producer = _producer(bootstrap)
    producer.list_topics(topic, timeout=60)  # metadata known before the clock starts
    failed: list[str] = []

    def report(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    started = time.monotonic()
    for partition in partitions:
        producer.produce(topic, b"first", partition=partition, on_delivery=report)
    if producer.flush(600) != 0 or failed:
        raise ConfigError(f"first produce to {topic}: {len(failed)} failed ({failed[:1]}), or not flushed")
    return time.monotonic() - started


def produce_seconds(bootstrap: str, topic: str, partitions: range, records: int, record_size: int) -> float:
    """Seconds to produce ``records`` records round robin over ``partitions``, all delivered."""
    producer = _producer(bootstrap)
    producer.list_topics(topic, timeout=60)
    value = b"x" * record_size
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=partitions[i % len(partitions)])
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(600) != 0:
        raise ConfigError(f"throughput run into {topic}: records left undelivered")
    return time.monotonic() - started


def wait_writers_gone(root: int, processes: int) -> None:
    """Until the tree has no more than ``processes`` processes (the wave's writers exited)."""
    deadline = time.monotonic() + WAVE_GONE_S
    while len(tree_pids(root)) > processes:
        if time.monotonic() > deadline:
            raise ConfigError(f"the writers of a wave did not exit in {WAVE_GONE_S:.0f} s: "
                              f"{len(tree_pids(root))} processes, {processes} expected")
        time.sleep(0.5)


class _Round(NamedTuple):
    """A produce round over a topic's partitions, in waves."""

    first_s: list[float]  # per wave: one record to each of its partitions
    one_records_per_s: float  # the throughput run into one partition
    records_per_s: float  # the same into the N partitions, over the waves' own time
    peak: TreeUsage  # the most PSS seen right after a wave


# -- the runs -----------------------------------------------------------------------------------------------


def _produce_round(app: Any, root: int, prefix: str, count: int, wave: int, records: int,
                   record_size: int, idle_processes: int) -> _Round:
    """First produce and throughput into ``count`` partitions, wave after wave (module docstring)."""
    bootstrap = app.require_bootstrap()
    groups = waves(count, wave)
    first: list[float] = []
    peak = TreeUsage(0, 0, 0)

    def after_wave() -> None:
        nonlocal peak
        usage = tree_usage(root, prefix)
        peak = usage if usage.pss_bytes > peak.pss_bytes else peak
        if len(groups) > 1:
            wait_writers_gone(root, idle_processes)

    for group in groups:
        first.append(first_produce_seconds(bootstrap, TOPIC, group))
        after_wave()
    create_seconds(bootstrap, ONE, 1)
    one = records / produce_seconds(bootstrap, ONE, range(1), records, record_size)
    if len(groups) > 1:
        wait_writers_gone(root, idle_processes)
    spent = 0.0
    for group in groups:
        spent += produce_seconds(bootstrap, TOPIC, group, records // len(groups), record_size)
        after_wave()
    many = (records // len(groups)) * len(groups) / spent
    return _Round(first, one, many, peak)


def _row(count: int, idle_s: float, records: int, record_size: int, overrides: list[str],
         wave: int = WAVE) -> dict[str, Any]:
    if count > wave:
        overrides = [f"{key}={WAVE_IDLE_MS}" for key in ("appliance.ring.idle.ms", "appliance.writer.idle.ms")
                     if not any(o.startswith(f"{key}=") for o in overrides)] + overrides  # fmt: skip
    app = Appliance.open(None, overrides=overrides)
    try:
        assert app.process is not None
        bootstrap = app.require_bootstrap()
        root = app.process.pid
        with app.client() as client:
            prefix = str(client.status()["shm_prefix"])
        created_s = create_seconds(bootstrap, TOPIC, count)
        time.sleep(SETTLE_S)
        idle_pct = idle_core_pct(root, idle_s)
        idle = tree_usage(root, prefix)
        done = _produce_round(app, root, prefix, count, wave, records, record_size, idle.processes)
        time.sleep(SETTLE_S)
        busy = tree_usage(root, prefix)
    finally:
        app.close()
    return {
        "partitions": count, "create_s": round(created_s, 3), "idle_core_pct": round(idle_pct, 2),
        "processes": idle.processes, "idle_pss_mib": round(idle.pss_bytes / _MIB, 1),
        "idle_shm_mib": round(idle.shm_bytes / _MIB, 1), "first_produce_s": round(sum(done.first_s), 3),
        "first_produce_waves_s": [round(s, 3) for s in done.first_s],
        "one_partition_records_per_s": round(done.one_records_per_s),
        "records_per_s": round(done.records_per_s),
        "throughput_ratio": round(done.records_per_s / done.one_records_per_s, 3),
        "peak_pss_mib": round(done.peak.pss_bytes / _MIB, 1), "peak_processes": done.peak.processes,
        "after_pss_mib": round(busy.pss_bytes / _MIB, 1), "after_shm_mib": round(busy.shm_bytes / _MIB, 1),
        "processes_after": busy.processes, "wave": min(wave, count),
    }


def run_partition_costs(counts: list[int], *, idle_s: float = 30.0, records: int = 100_000,
                        record_size: int = 100, overrides: list[str] | None = None,
                        wave: int = WAVE) -> dict[str, Any]:
    """Every figure of the module docstring per partition count; the JSON result (``rows``)."""
    _kafka()
    started_at = time.time()
    rows = [_row(count, idle_s, records, record_size, list(overrides or []), wave) for count in counts]
    lines = ["partitions  create s  idle %core  idle PSS MiB  idle shm MiB  first produce s  ratio N/1  "
             "peak PSS MiB  after PSS MiB  after shm MiB"]
    for r in rows:
        lines.append(f"{r['partitions']:>10}  {r['create_s']:>8.2f}  {r['idle_core_pct']:>10.2f}  "
                     f"{r['idle_pss_mib']:>12,.1f}  {r['idle_shm_mib']:>12,.1f}  "
                     f"{r['first_produce_s']:>15.3f}  {r['throughput_ratio']:>9.3f}  "
                     f"{r['peak_pss_mib']:>12,.1f}  "
                     f"{r['after_pss_mib']:>13,.1f}  {r['after_shm_mib']:>13,.1f}")
        if len(r["first_produce_waves_s"]) > 1:
            lines.append(f"{'':>10}  first produce per wave of {r['wave']}: "
                         + ", ".join(f"{s:.2f}" for s in r["first_produce_waves_s"]) + " s")
    return {"command": "partitions", "rows": rows, "summary": "\n".join(lines),
            "config": {"counts": counts, "idle_s": idle_s, "records": records, "record_size": record_size,
                       "overrides": list(overrides or []), "client": "confluent-kafka", "wave": wave},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
            "targets": {"idle_core_pct_at_1000": 2.0, "idle_pss_mib_at_1000": 300.0}, "notes": []}
