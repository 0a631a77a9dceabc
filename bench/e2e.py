"""``appliance bench e2e``: produce-to-consume latency at an offered load, through the real processes.

Producer process(es) (forked) send ``--throughput`` records/s for ``--seconds`` through ``Producer.send``,
paced like Kafka's ThroughputThrottler; each value starts with the CLOCK_MONOTONIC nanosecond at which it was
handed to ``send`` (8 bytes, little-endian; the clock is one for every process of the host), followed by a
log-like payload up to ``--record-size``.  This process consumes the topic with ``appliance.Consumer``
(``poll_batch``, local memory-mapped path by default, ``--transport tcp`` for the broker) and takes, per
record, the moment ``poll_batch`` returned it minus its stamp: the time from ``send`` to the consumer holding
the record -- the producer's batching (``linger.ms``), the ring, the writer's drain round and append, the high
watermark, the consumer's wait strategy, all included.

``linger.ms`` defaults to 0 here (a latency run; the producer's own default, 5 ms, would dominate): the batch
is sealed at once and goes to the ring; records sent meanwhile batch up behind it.  The producers warm up
for half a second at the same rate before the clock starts, and the consumer reads their records (its
decoding kernels load on the first ones); it is at the end of the log when the clock starts.

**Garbage collection.**  A full collection of a process holding numpy, numba and the appliance's modules
pauses it for longer than the latencies measured here (docs/performance.md); so, with ``freeze_gc`` (the
default), the producer processes and this one collect once and ``gc.freeze()`` their long-lived heap before
the clock starts, as a latency-sensitive application would (the appliance's own writers are forked from a
frozen supervisor).

**Where the time goes.**  When the appliance was started with ``APPLIANCE_PUBLISH_TRACE_DIR`` set
(``appliance.server.publish_trace``), its writers note when each drain round began and when it published the
high watermark; the run then splits every record's latency (single partition runs) into *send -> writer round*
(the producer's batching and linger thread, the ring, the writer's wake-up), *round -> high watermark
published* (validate, append, publish) and *published -> consumer holds it* (the consumer's wait strategy, its
wake-up and decoding), each summarised like the total under ``extra.breakdown``.

The steps: :func:`run_e2e` settles an :class:`E2ERun` (topic, configurations, payload); :func:`_measure`
starts a :class:`ProducerJob` per producer process (each sends its :class:`Load` with :func:`_paced_send`
and reports a :class:`ProducerReport`), drains the warm-up, then receives every timed record into
:class:`Arrivals` while :class:`Usage` counts the writers' and this process's CPU and wake-ups.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from appliance.server.publish_trace import TRACE_DIR_ENV, read_traces, round_times
from bench.harness import Appliance
from bench.limits import Limits, measure_limits
from bench.produce import ProduceSettings, payload_pool, producer_settings, start_ready_processes
from bench.stats import Progress, latency_summary, make_result, process_cpu_ns
from storage.errors import ApplianceError, ConfigError

__all__ = ["Arrivals", "E2ERun", "Load", "ProducerJob", "ProducerReport", "Sent", "Usage", "breakdown",
           "run_e2e", "stamps_of", "wakeups"]

STAMP_BYTES = 8
WARMUP_S = 0.5
IDLE_TIMEOUT_S = 10.0
TRACE_WAIT_S = 3.0  # a writer writes its trace after 100 ms idle
BURST_S = 0.0002  # records due within this much time go out together


@dataclass(frozen=True)
class Load:
    """What one producer offers: stamped records to ``topic`` at ``rate`` per second, the values' tails
    cycling through ``tails``, the records due within ``burst_s`` sent back to back."""

    topic: str
    tails: list[bytes]
    rate: float
    burst_s: float = BURST_S


class Sent(NamedTuple):
    """What :func:`_paced_send` did: records sent, the clock (ns) at its start and after the flush."""

    records: int
    start_ns: int
    end_ns: int


class ProducerReport(NamedTuple):
    """One producer process's timed part: what it sent, its CPU time and its voluntary wake-ups."""

    sent: Sent
    cpu_ns: int
    wakeups: int


@dataclass(frozen=True)
class ProducerJob:
    """One producer process: its Producer ``config``, the topic's ``partitions`` (each gets a record before
    the warm-up, so every ring is attached), its ``load`` and the ``records`` it sends on the clock;
    ``freeze_gc``: collect and freeze its heap before the clock starts."""

    config: dict[str, object]
    partitions: int
    load: Load
    records: int
    freeze_gc: bool


@dataclass
class E2ERun:
    """One measurement, settled before it starts: ``settings`` with ``records`` resolved, the topic, both
    configurations, the payload ``tails`` after the stamp, and what the run notes on the way."""

    settings: ProduceSettings
    topic: str
    producer_config: dict[str, object]
    consumer_config: dict[str, Any]
    tails: list[bytes]
    burst_s: float = BURST_S
    freeze_gc: bool = True
    progress: bool = False
    started_at: float = field(default_factory=time.time)
    notes: list[str] = field(default_factory=list)

    def jobs(self) -> list[ProducerJob]:
        """The producer processes' jobs: the records split evenly, the rate shared."""
        settings = self.settings
        load = Load(self.topic, self.tails, settings.throughput / settings.producers, self.burst_s)
        share, rest = divmod(settings.records, settings.producers)
        return [ProducerJob(self.producer_config, settings.partitions, load, share + (1 if i < rest else 0),
                            self.freeze_gc) for i in range(settings.producers)]


@dataclass
class Arrivals:
    """Every timed record in arrival order: its send stamp, the moment the consumer held it (both ns of
    CLOCK_MONOTONIC) and its offset."""

    sent_at: np.ndarray
    arrived: np.ndarray
    offsets: np.ndarray

    @classmethod
    def empty(cls, records: int) -> Arrivals:
        return cls(np.empty(records, dtype=np.int64), np.empty(records, dtype=np.int64),
                   np.empty(records, dtype=np.int64))

    @property
    def latencies(self) -> np.ndarray:
        return self.arrived - self.sent_at


class Usage(NamedTuple):
    """CPU time (ns) and voluntary wake-ups of the partition writers and of this, the consuming, process:
    a reading (:func:`_usage_before`) or the difference since one (:func:`_usage_since`)."""

    writer_cpu_ns: int
    writer_wakeups: int
    consumer_cpu_ns: int
    consumer_wakeups: int


class Timed(NamedTuple):
    """What the clock covered: the records' arrivals, every producer's report, the writers' and the
    consumer's usage."""

    arrivals: Arrivals
    reports: list[ProducerReport]
    usage: Usage


def stamps_of(chunk: Any) -> np.ndarray:
    """The int64 stamps in the first 8 bytes of every value of a ``RecordArrays`` chunk."""
    index = chunk.value_positions[:, None] + np.arange(STAMP_BYTES)
    return np.ascontiguousarray(chunk.data[index]).view("<i8").reshape(-1)


def wakeups(pids: list[int]) -> int:
    """Voluntary context switches of every thread of ``pids`` (each one a sleep and a wake-up; a process
    gone counts 0), from ``/proc/PID/task/TID/status``: at a paced load, what CPU per record follows."""
    count = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"voluntary_ctxt_switches:"):
                            count += int(line.split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
    return count


def _paced_send(producer: Any, load: Load, records: int,
                on_burst: Callable[[int], None] | None = None) -> Sent:
    """Send ``records`` stamped records at ``load.rate`` per second, then flush.

    Paced like ``bench.produce``'s throttle (and Kafka's ThroughputThrottler): the records due within
    ``load.burst_s`` go out back to back, each stamped as it is handed to ``send``, then the thread sleeps
    until the next burst is due (one sleep per burst rather than per record, whose wake-ups would cost the
    sending process more CPU than the sends).  ``on_burst(sent)`` after each burst."""
    clock = time.monotonic_ns
    send = producer.send
    topic, tails = load.topic, load.tails
    burst = max(1, int(load.rate * load.burst_s))
    period = 1e9 / load.rate
    count = len(tails)
    start = clock()
    sent = 0
    while sent < records:
        ahead_ns = (sent * period) - (clock() - start)
        if ahead_ns > 0:
            time.sleep(ahead_ns / 1e9)
        due = min(records, sent + burst)
        while sent < due:
            send(topic, clock().to_bytes(STAMP_BYTES, "little") + tails[sent % count])
            sent += 1
        if on_burst is not None:
            on_burst(sent)
    producer.flush()
    return Sent(sent, start, clock())


def _warm_up(producer: Any, job: ProducerJob) -> None:
    """A record to every partition, then half a second of the load, untimed; the heap frozen after."""
    load = job.load
    for partition in range(job.partitions):
        producer.send(load.topic, bytes(STAMP_BYTES) + load.tails[0], partition=partition)
    producer.flush()
    _paced_send(producer, load, max(1, int(load.rate * WARMUP_S)))
    if job.freeze_gc:
        gc.collect()
        gc.freeze()  # the long-lived heap out of the collector's sight (see the module doc)


def _producer_process(job: ProducerJob, counters: Any, index: int, pipe: Any) -> None:
    """A forked producer: warm up, say ``ready``, wait for ``go``, send the load (its count of records sent
    in ``counters[index]``), report ``done`` with a :class:`ProducerReport` (or ``error``)."""
    from appliance.client.producer import Producer

    def count(sent: int) -> None:
        counters[index] = sent

    try:
        with Producer(job.config) as producer:
            _warm_up(producer, job)
            pipe.send(("ready", None))
            pipe.recv()
            cpu = time.process_time_ns()
            switches = wakeups([os.getpid()])
            sent = _paced_send(producer, job.load, job.records, count)
            pipe.send(("done", ProducerReport(sent, time.process_time_ns() - cpu,
                                              wakeups([os.getpid()]) - switches)))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def _drain(consumer: Any, ends: list[int], assignment: list[tuple[str, int]]) -> None:
    """Consume the warm-up records (the decoding kernels load on the first records, which must not count),
    leaving the consumer at the end of the log."""
    consumer.seek_to_beginning(*assignment)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        if all(consumer.position(tp) >= end for tp, end in zip(assignment, ends, strict=True)):
            return
        consumer.poll_batch(timeout_ms=100)
    raise ApplianceError("e2e: the consumer did not reach the end of the warm-up records")


def run_e2e(app: Appliance, settings: ProduceSettings, *, seconds: float = 5.0, progress: bool = False,
            bootstrap: str | None = None, keep_topic: bool = False,
            consumer_props: dict[str, Any] | None = None, freeze_gc: bool = True,
            burst_s: float = BURST_S) -> dict[str, Any]:
    """Run the e2e latency measurement (see the module doc); the JSON result (``bench.stats``).
    ``seconds``: how long to offer the load when ``settings.records`` is not given; ``consumer_props``:
    any other consumer setting; ``burst_s``: the producers send the records due within this much time
    back to back, then sleep (:func:`_paced_send`)."""
    _check(settings)
    if settings.linger_ms is None:
        settings = replace(settings, linger_ms=0)
    records = settings.records if settings.records > 0 else max(1, int(settings.throughput * seconds))
    settings = replace(settings, records=records)
    started_at = time.time()
    topic = settings.topic or f"perf-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    app.create_topic(topic, settings.partitions)
    try:
        notes: list[str] = []
        tcp_address = app.require_bootstrap(bootstrap) if settings.transport == "tcp" else None
        producer_config = _producer_config(app, settings, tcp_address or bootstrap or app.bootstrap, notes)
        pool = payload_pool(replace(settings, records=min(records, 65_536)))
        run = E2ERun(settings, topic, producer_config, _consumer_config(app, tcp_address, consumer_props),
                     [row[STAMP_BYTES:].tobytes() for row in pool], burst_s=burst_s, freeze_gc=freeze_gc,
                     progress=progress, started_at=started_at, notes=notes)
        return _measure(app, run)
    finally:
        if settings.topic is None and not keep_topic:
            app.delete_topic(topic)


def _check(settings: ProduceSettings) -> None:
    """ConfigError for a run e2e cannot measure: records too small for the stamp, no offered load."""
    if settings.record_size < STAMP_BYTES:
        raise ConfigError(f"--record-size {settings.record_size}: e2e needs at least {STAMP_BYTES} bytes "
                          "(the send time travels in the value)")
    if settings.throughput <= 0:
        raise ConfigError("e2e: give --throughput (the offered load, records/s)")


def _producer_config(app: Appliance, settings: ProduceSettings, address: str | None,
                     notes: list[str]) -> dict[str, object]:
    """The producers' configuration; over TCP when asked and available, else through the local rings (and
    a note saying so)."""
    if settings.transport == "tcp":
        from bench.produce import tcp_producer_status

        assert address is not None
        ok, why = tcp_producer_status(address)
        if not ok:
            notes.append(f"the TCP producer is not available in this tree ({why}): records were produced "
                         "through the local rings and consumed over TCP")
            return producer_settings(replace(settings, transport="shm"), app, address)
    return producer_settings(settings, app, address)


def _consumer_config(app: Appliance, tcp_address: str | None,
                     consumer_props: dict[str, Any] | None) -> dict[str, Any]:
    """The consumer's configuration: over TCP to ``tcp_address`` when given, else the local path."""
    config: dict[str, Any] = {"auto.offset.reset": "latest", "client.id": "appliance-bench-e2e"}
    if tcp_address is not None:
        config.update({"bootstrap.servers": tcp_address, "fetch.max.wait.ms": 100})
    else:
        config["appliance.data.dir"] = str(app.data_dir)
    config.update(consumer_props or {})
    return config


def _measure(app: Appliance, run: E2ERun) -> dict[str, Any]:
    """Start the producer processes and the consumer, drain the warm-up, time the run; the JSON result."""
    from appliance.client.consumer import Consumer

    settings = run.settings
    context = multiprocessing.get_context("fork")
    counters = context.RawArray("q", settings.producers)
    consumer = Consumer(run.consumer_config)
    assignment = [(run.topic, p) for p in range(settings.partitions)]
    consumer.assign(assignment)
    pipes: list[Any] = []
    processes: list[Any] = []
    limits: Limits | None = None
    try:
        arguments = [(job, counters, index) for index, job in enumerate(run.jobs())]
        start_ready_processes(context, _producer_process, arguments, (), pipes, processes,
                              "e2e producer process")
        if settings.measure_limits:
            limits = measure_limits(app.data_dir, settings.records * settings.record_size)
            os.sync()
        _drain(consumer, app.end_offsets(run.topic), assignment)
        timed = _run_timed(app, run, consumer, pipes)
    finally:
        if run.freeze_gc:
            gc.unfreeze()
        consumer.close()
        if limits is not None:
            limits.remove_probe_files()
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()
    return _result(run, timed, limits)


def _run_timed(app: Appliance, run: E2ERun, consumer: Any, pipes: list[Any]) -> Timed:
    """Freeze this process's heap, start the clock and the producers, receive every record, stop the
    clock, collect the producers' reports."""
    records = run.settings.records
    line = Progress(records, run.settings.record_size, enabled=run.progress, label="e2e: ")
    arrivals = Arrivals.empty(records)
    if run.freeze_gc:
        gc.collect()
        gc.freeze()
    writers = app.writer_pids(run.topic)
    before = _usage_before(writers)
    for pipe in pipes:
        pipe.send("go")
    _receive(consumer, arrivals, line)
    usage = _usage_since(before, writers)
    line.finish()
    reports = []
    for index, pipe in enumerate(pipes):
        kind, payload = pipe.recv()
        if kind != "done":
            raise ApplianceError(f"e2e producer process {index} failed: {payload}")
        reports.append(payload)
    return Timed(arrivals, reports, usage)


def _receive(consumer: Any, arrivals: Arrivals, line: Progress) -> None:
    """Poll until every record of ``arrivals`` has arrived, noting each one's stamp, arrival and offset."""
    sent_at, arrived, offsets = arrivals.sent_at, arrivals.arrived, arrivals.offsets
    records = len(sent_at)
    clock = time.monotonic_ns
    seen = 0
    last_data = clock()
    while seen < records:
        chunks = consumer.poll_batch(timeout_ms=100)
        now = clock()
        if not chunks:
            if now - last_data > IDLE_TIMEOUT_S * 1e9:
                raise ApplianceError(f"e2e: only {seen:,} of {records:,} records arrived; none for "
                                     f"{IDLE_TIMEOUT_S:.0f} s")
            continue
        last_data = now
        for chunk in chunks:
            n = min(len(chunk), records - seen)
            sent_at[seen : seen + n] = stamps_of(chunk)[:n]
            arrived[seen : seen + n] = now
            offsets[seen : seen + n] = chunk.offsets[:n]
            seen += n
        line.update(seen)


def _usage_before(writers: list[int]) -> Usage:
    """A reading of :class:`Usage`; this process's CPU time last, so the other readings cost it nothing."""
    writer_cpu = process_cpu_ns(writers, missing_ok=True)
    writer_wakeups = wakeups(writers)
    consumer_wakeups = wakeups([os.getpid()])
    return Usage(writer_cpu, writer_wakeups, time.process_time_ns(), consumer_wakeups)


def _usage_since(before: Usage, writers: list[int]) -> Usage:
    """:class:`Usage` since ``before``; this process's CPU time first."""
    consumer_cpu = time.process_time_ns() - before.consumer_cpu_ns
    writer_cpu = process_cpu_ns(writers, missing_ok=True) - before.writer_cpu_ns
    consumer_wakeups = wakeups([os.getpid()]) - before.consumer_wakeups
    writer_wakeups = wakeups(writers) - before.writer_wakeups
    return Usage(writer_cpu, writer_wakeups, consumer_cpu, consumer_wakeups)


def _result(run: E2ERun, timed: Timed, limits: Limits | None) -> dict[str, Any]:
    """The JSON result: latency of every record, CPU per record and wake-ups per second of each side."""
    settings, arrivals, reports, usage = run.settings, timed.arrivals, timed.reports, timed.usage
    records = settings.records
    latencies = arrivals.latencies
    first_send = min(r.sent.start_ns for r in reports)
    seconds = (int(arrivals.arrived.max()) - first_send) / 1e9
    extra = {
        "topic": run.topic,
        "offered_records_per_s": settings.throughput,
        "produce_seconds": round((max(r.sent.end_ns for r in reports) - first_send) / 1e9, 4),
        "producer_cpu_ns_per_record": round(sum(r.cpu_ns for r in reports) / records, 1),
        "writer_cpu_ns_per_record": round(usage.writer_cpu_ns / records, 1),
        "consumer_cpu_ns_per_record": round(usage.consumer_cpu_ns / records, 1),
        "wakeups_per_s": {"producer": round(sum(r.wakeups for r in reports) / seconds),
                          "writer": round(usage.writer_wakeups / seconds),
                          "consumer": round(usage.consumer_wakeups / seconds)},
        "consumer": "tcp" if "bootstrap.servers" in run.consumer_config else "local mmap",
        "linger_ms": settings.linger_ms,
        "burst_ms": run.burst_s * 1000,
    }
    trace_dir = os.environ.get(TRACE_DIR_ENV)
    if trace_dir and settings.partitions == 1:
        extra["breakdown"] = breakdown(trace_dir, run.topic, 0, arrivals)
    if float(latencies.min()) < 0:
        run.notes.append("negative latencies: the stamps are not this host's CLOCK_MONOTONIC")
    return make_result("e2e", records=records, payload_bytes=records * settings.record_size, seconds=seconds,
                       latency=latency_summary(latencies, "produce-to-consume"), config=settings.as_json(),
                       limits=limits, primary_limit=None, extra=extra, notes=run.notes,
                       started_at=run.started_at)


def breakdown(trace_dir: str, topic: str, partition: int, arrivals: Arrivals) -> dict[str, Any]:
    """Each record's latency split at its writer round (``appliance.server.publish_trace``): send -> round
    start, round start -> high watermark published, published -> the consumer holds it."""
    last = int(arrivals.offsets.max())
    deadline = time.monotonic() + TRACE_WAIT_S
    while True:
        rows = read_traces(trace_dir, topic, partition)
        if (len(rows) and int(rows["end_offset"][-1]) > last) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    row = round_times(rows, arrivals.offsets)
    start, appending, published = row["round_start_ns"], row["append_start_ns"], row["published_ns"]
    traced = start > 0
    if not traced.any():
        return {"note": f"no writer trace for {topic}-{partition} in {trace_dir}"}
    sent_at, arrived = arrivals.sent_at[traced], arrivals.arrived[traced]
    start, appending, published = start[traced], appending[traced], published[traced]
    return {
        "traced_records": int(traced.sum()),
        "rounds": int(np.unique(start).size),
        "send_to_writer_round": latency_summary(start - sent_at, "send -> writer round"),
        "round_to_published": latency_summary(published - start, "writer round -> high watermark published"),
        "round_to_append": latency_summary(appending - start,
                                           "of which round start -> append (peek, validate, dedup)"),
        "append_to_published": latency_summary(published - appending,
                                               "of which append -> published (writev, index)"),
        "published_to_consumer": latency_summary(arrived - published, "published -> consumer holds it"),
    }
