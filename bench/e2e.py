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
takes 50-85 ms on this kind of machine (measured in the producer process), which alone puts a latency
target of a millisecond out of reach; so, with ``freeze_gc`` (the default), the producer processes and this
one collect once and ``gc.freeze()`` their long-lived heap before the clock starts, as a latency-sensitive
application would (the appliance's own writers are forked from a frozen supervisor).

**Where the time goes.**  When the appliance was started with ``APPLIANCE_PUBLISH_TRACE_DIR`` set
(``appliance.server.publish_trace``), its writers note when each drain round began and when it published the
high watermark; the run then splits every record's latency (single partition runs) into *send -> writer round*
(the producer's batching and linger thread, the ring, the writer's wake-up), *round -> high watermark
published* (validate, append, publish) and *published -> consumer holds it* (the consumer's wait strategy, its
wake-up and decoding), each summarised like the total under ``extra.breakdown``. """

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from appliance.server.publish_trace import TRACE_DIR_ENV, read_traces, round_times
from bench.harness import Appliance
from bench.limits import Limits, measure_limits
from bench.produce import ProduceSettings, payload_pool, producer_settings, start_ready_processes
from bench.stats import Progress, latency_summary, make_result, process_cpu_ns
from storage.errors import ApplianceError, ConfigError

__all__ = ["breakdown", "run_e2e", "stamps_of", "wakeups"]

STAMP_BYTES = 8
WARMUP_S = 0.5
IDLE_TIMEOUT_S = 10.0
TRACE_WAIT_S = 3.0  # a writer writes its trace after 100 ms idle
BURST_S = 0.0002  # records due within this much time go out together


def stamps_of(chunk: Any) -> np.ndarray:
    """The int64 stamps in the first 8 bytes of every value of a ``RecordArrays`` chunk."""
    index = chunk.value_positions[:, None] + np.arange(STAMP_BYTES)
    return np.ascontiguousarray(chunk.data[index]).view("<i8").reshape(-1)


def wakeups(pids: list[int]) -> int:
    """Voluntary context switches of every thread of ``pids`` (each one a sleep and a wake-up; a process
    gone counts 0): on a VM a wake-up costs 20-50 us of CPU, so at this load it is what CPU per record
    follows."""
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


def _paced_send(producer: Any, topic: str, tails: list[bytes], rate: float, records: int,
                counters: Any = None, index: int = 0, burst_s: float = BURST_S) -> tuple[int, int, int]:
    """Send ``records`` stamped records at ``rate``/s; (records, first send ns, last flush ns).

    Paced like ``bench.produce``'s throttle (and Kafka's ThroughputThrottler, whose bursts are
    2 ms): the records due within ``burst_s`` (default ``BURST_S``) go out back to back, each stamped as
    it is handed to ``send``, then the thread sleeps until the next burst is due.  (Sleeping until each
    single record was due -- ~10 us apart at 100,000/s -- cost this process 3.4 us of CPU per record
    here, in ~100,000 ``time.sleep`` calls a second of 20-50 us of CPU each: a third of a core taken from
    the appliance.)"""
    clock = time.monotonic_ns
    send = producer.send
    burst = max(1, int(rate * burst_s))
    period = 1e9 / rate
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
        if counters is not None:
            counters[index] = sent
    producer.flush()
    return sent, start, clock()


def _producer_process(config: dict[str, object], topic: str, partitions: int, tails: list[bytes], rate: float,
                      records: int, counters: Any, index: int, pipe: Any, freeze_gc: bool,
                      burst_s: float) -> None:
    from appliance.client.producer import Producer

    try:
        with Producer(config) as producer:
            for partition in range(partitions):
                producer.send(topic, bytes(STAMP_BYTES) + tails[0], partition=partition)
            producer.flush()
            _paced_send(producer, topic, tails, rate, max(1, int(rate * WARMUP_S)), burst_s=burst_s)
            if freeze_gc:
                gc.collect()
                gc.freeze()  # the long-lived heap out of the collector's sight (see the module doc)
            pipe.send(("ready", None))
            pipe.recv()
            cpu = time.process_time_ns()
            switches = wakeups([os.getpid()])
            outcome = _paced_send(producer, topic, tails, rate, records, counters, index, burst_s)
            pipe.send(("done", (*outcome, time.process_time_ns() - cpu, wakeups([os.getpid()]) - switches)))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def _drain(consumer: Any, ends: list[int], assignment: list[tuple[str, int]]) -> None:
    """Consume the warm-up records (the decoding kernels load on the first records: up to half a second on a
    busy machine, which must not count), leaving the consumer at the end of the log."""
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
    """Run the e2e latency measurement (see the module doc); ``burst_s``: the producers send the records
    due within this much time back to back, then sleep (``_paced_send``)."""
    from appliance.client.consumer import Consumer

    if settings.record_size < STAMP_BYTES:
        raise ConfigError(f"--record-size {settings.record_size}: e2e needs at least {STAMP_BYTES} bytes "
                          "(the send time travels in the value)")
    if settings.throughput <= 0:
        raise ConfigError("e2e: give --throughput (the offered load, records/s)")
    if settings.linger_ms is None:
        settings = replace(settings, linger_ms=0)
    records = settings.records if settings.records > 0 else max(1, int(settings.throughput * seconds))
    settings = replace(settings, records=records)
    address = bootstrap or app.bootstrap
    notes: list[str] = []
    started_at = time.time()
    topic = settings.topic or f"perf-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    fresh = settings.topic is None
    app.create_topic(topic, settings.partitions)
    try:
        if settings.transport == "tcp":
            from bench.produce import tcp_producer_status

            address = app.require_bootstrap(bootstrap)
            ok, why = tcp_producer_status(address)
            if not ok:
                notes.append(f"the TCP producer is not available in this tree ({why}): records were produced "
                             "through the local rings and consumed over TCP")
            producer_config = producer_settings(settings if ok else replace(settings, transport="shm"), app,
                                                address)
        else:
            producer_config = producer_settings(settings, app, address)
        pool = payload_pool(replace(settings, records=min(records, 65_536)))
        tails = [row[STAMP_BYTES:].tobytes() for row in pool]
        consumer_config: dict[str, Any] = {"auto.offset.reset": "latest", "client.id": "appliance-bench-e2e"}
        if settings.transport == "tcp":
            consumer_config.update({"bootstrap.servers": address, "fetch.max.wait.ms": 100})
        else:
            consumer_config["appliance.data.dir"] = str(app.data_dir)
        consumer_config.update(consumer_props or {})
        return _measure(app, settings, topic, producer_config, consumer_config, tails, progress, notes,
                        started_at, Consumer, freeze_gc, burst_s)
    finally:
        if fresh and not keep_topic:
            app.delete_topic(topic)


def _measure(app: Appliance, settings: ProduceSettings, topic: str, producer_config: dict[str, object],
             consumer_config: dict[str, Any], tails: list[bytes], progress_enabled: bool, notes: list[str],
             started_at: float, consumer_class: Any, freeze_gc: bool, burst_s: float) -> dict[str, Any]:
    records = settings.records
    per = [records // settings.producers + (1 if i < records % settings.producers else 0)
           for i in range(settings.producers)]
    rate = settings.throughput / settings.producers
    context = multiprocessing.get_context("fork")
    counters = context.RawArray("q", settings.producers)
    consumer = consumer_class(consumer_config)
    assignment = [(topic, p) for p in range(settings.partitions)]
    consumer.assign(assignment)
    pipes: list[Any] = []
    processes: list[Any] = []
    limits: Limits | None = None
    arrived = np.empty(records, dtype=np.int64)
    sent_at = np.empty(records, dtype=np.int64)
    offsets = np.empty(records, dtype=np.int64)
    try:
        start_ready_processes(context, _producer_process, [
            (producer_config, topic, settings.partitions, tails, rate, count, counters, index)
            for index, count in enumerate(per)
        ], (freeze_gc, burst_s), pipes, processes, "e2e producer process")
        if settings.measure_limits:
            limits = measure_limits(app.data_dir, records * settings.record_size)
            os.sync()
        _drain(consumer, [app_end for app_end in app.end_offsets(topic)], assignment)
        line = Progress(records, settings.record_size, enabled=progress_enabled, label="e2e: ")
        if freeze_gc:
            gc.collect()
            gc.freeze()
        writers = app.writer_pids(topic)
        writer_cpu = process_cpu_ns(writers, missing_ok=True)
        writer_wakeups = wakeups(writers)
        consumer_wakeups = wakeups([os.getpid()])
        consumer_cpu = time.process_time_ns()
        for pipe in pipes:
            pipe.send("go")
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
        consumer_cpu = time.process_time_ns() - consumer_cpu
        writer_cpu = process_cpu_ns(writers, missing_ok=True) - writer_cpu
        consumer_wakeups = wakeups([os.getpid()]) - consumer_wakeups
        writer_wakeups = wakeups(writers) - writer_wakeups
        line.finish()
        outcomes = []
        for index, pipe in enumerate(pipes):
            kind, payload = pipe.recv()
            if kind != "done":
                raise ApplianceError(f"e2e producer process {index} failed: {payload}")
            outcomes.append(payload)
    finally:
        if freeze_gc:
            gc.unfreeze()
        consumer.close()
        if limits is not None:
            limits.remove_probe_files()
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()
    latencies = arrived - sent_at
    first_send = min(o[1] for o in outcomes)
    seconds = (int(arrived.max()) - first_send) / 1e9
    producer_cpu = sum(o[3] for o in outcomes)
    extra = {
        "topic": topic,
        "offered_records_per_s": settings.throughput,
        "produce_seconds": round((max(o[2] for o in outcomes) - first_send) / 1e9, 4),
        "producer_cpu_ns_per_record": round(producer_cpu / records, 1),
        "writer_cpu_ns_per_record": round(writer_cpu / records, 1),
        "consumer_cpu_ns_per_record": round(consumer_cpu / records, 1),
        "wakeups_per_s": {"producer": round(sum(o[4] for o in outcomes) / seconds),
                          "writer": round(writer_wakeups / seconds),
                          "consumer": round(consumer_wakeups / seconds)},
        "consumer": "tcp" if "bootstrap.servers" in consumer_config else "local mmap",
        "linger_ms": settings.linger_ms,
        "burst_ms": burst_s * 1000,
    }
    trace_dir = os.environ.get(TRACE_DIR_ENV)
    if trace_dir and settings.partitions == 1:
        extra["breakdown"] = breakdown(trace_dir, topic, 0, sent_at, arrived, offsets)
    if float(latencies.min()) < 0:
        notes.append("negative latencies: the stamps are not this host's CLOCK_MONOTONIC")
    return make_result("e2e", records=records, payload_bytes=records * settings.record_size, seconds=seconds,
                       latency=latency_summary(latencies, "produce-to-consume"), config=settings.as_json(),
                       limits=limits, primary_limit=None, extra=extra, notes=notes, started_at=started_at)


def breakdown(trace_dir: str, topic: str, partition: int, sent_at: np.ndarray, arrived: np.ndarray,
              offsets: np.ndarray) -> dict[str, Any]:
    """Each record's latency split at its writer round (``appliance.server.publish_trace``): send -> round
    start, round start -> high watermark published, published -> the consumer holds it."""
    last = int(offsets.max())
    deadline = time.monotonic() + TRACE_WAIT_S
    while True:
        rows = read_traces(trace_dir, topic, partition)
        if (len(rows) and int(rows["end_offset"][-1]) > last) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    row = round_times(rows, offsets)
    start, appending, published = row["round_start_ns"], row["append_start_ns"], row["published_ns"]
    traced = start > 0
    if not traced.any():
        return {"note": f"no writer trace for {topic}-{partition} in {trace_dir}"}
    return {
        "traced_records": int(traced.sum()),
        "rounds": int(np.unique(start[traced]).size),
        "send_to_writer_round": latency_summary(start[traced] - sent_at[traced], "send -> writer round"),
        "round_to_published": latency_summary(published[traced] - start[traced],
                                              "writer round -> high watermark published"),
        "round_to_append": latency_summary(appending[traced] - start[traced],
                                           "of which round start -> append (peek, validate, dedup)"),
        "append_to_published": latency_summary(published[traced] - appending[traced],
                                               "of which append -> published (writev, index)"),
        "published_to_consumer": latency_summary(arrived[traced] - published[traced],
                                                 "published -> consumer holds it"),
    }
