"""``appliance bench produce``: kafka-producer-perf-test for the appliance.

What one run does
-----------------
1. Payloads: a pool of distinct records of exactly ``--record-size`` bytes, cycled through.  ``json`` (the
   default) are log-like JSON lines (timestamp, level, service, host, trace id, method, path, status, latency,
   user agent, message; records longer than a line hold several lines, shorter ones a line's start), so zstd
   sees what it would see on real logs; ``random`` are incompressible bytes.  The pool
   holds at least two batches' worth of records, so a batch never repeats a record (zstd would flatter).
2. ``--producers K`` producers, each its own ``appliance.Producer`` (over the local rings, or over TCP with
   ``--bootstrap-server``); with K > 1 each runs in a forked process.
   Each attaches to every partition of the topic and sends warm-up records (rings attached, kernels loaded)
   before the clock starts; then all start together.
3. Records go through ``send()`` (one call per record, like Kafka's perf test) or ``send_many()`` (``--api
   send_many``: calls of about ``batch.size`` bytes of rows of a 2-D array).  ``--throughput`` caps the rate
   (records/s, all producers together) the way Kafka's ThroughputThrottler does: sleep whenever ahead of
   schedule.
4. Latency is *send-to-ack*, as in Kafka's perf test: one record per burst of records (``send``) or every
   ``send_many`` call carries a callback; its latency is the time from the call to the callback (the record's
   batch acknowledged by the partition writer: appended to the log).  The clock stops when the last producer's
   ``flush()`` returns.
5. The limits (``bench.limits``): the page-cache write bandwidth is probed *right before and right
   after* the timed part, each time for the run's volume and with the run's own bytes (the pool's rows from
   the first, cycled as the producers send them), into a new file in the data directory (the log's file
   system), after ``os.sync()`` as the run itself; the probe files stay until the run is over.  The run is
   held against the faster of the two (``ratios.page_cache_write``); ``extra.page_cache_probes`` gives both
   samples, the ratio to each and to their mean, and the CPU per byte of the probe, the producers and the
   writers (a probe's CPU per byte tells pages the host still backs from pages it must fault in first: on
   a virtual machine that, not the appliance, moves the figure; docs/performance.md).  memcpy and loopback
   ``sendfile`` are measured after the second probe, so nothing but ``os.sync()`` separates a probe from the
   run.  ``recycle_pages`` (the matrix sets it for records of 10 KiB and more): right before each probe and
   the run, as much memory as it will write is touched and freed (``perf_limits.recycle_pages``), so all
   three write into pages the host backs, as a long-running appliance's page cache does; without it, which
   kind each gets depends on what was freed how long before.
6. Afterwards the records in the log are counted (log end offsets): a lost or duplicated record is reported.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.harness import Appliance
from bench.limits import (
    MIB,
    Limits,
    PageCacheProbe,
    limits_with_probe,
    probe_volume_bytes,
    recycle_pages,
)
from bench.stats import Progress, latency_summary, make_result, process_cpu_ns, profiled
from storage.errors import ApplianceError, ConfigError

__all__ = ["ProduceSettings", "TcpProducerUnavailable", "log_line_payloads", "payload_pool", "probe_report",
           "produce_into", "producer_settings", "run_produce", "tcp_producer_status"]

POOL_BYTES = 8 * MIB  # distinct payload bytes per run (more for small records, see payload_pool)
POOL_MAX_RECORDS = 200_000
UNTHROTTLED_BURST = 1000  # records between two looks at the clock (progress, latency sample)
THROTTLE_BURST_S = 0.0002  # a throttled producer sends at most this much of its rate at once


@dataclass(frozen=True)
class ProduceSettings:
    """One produce run; the options of ``appliance bench produce``."""

    records: int
    record_size: int = 100
    partitions: int = 1
    producers: int = 1
    acks: str = "1"
    compression: str = "none"
    batch_size: int | None = None  # None: the producer's default (1 MiB)
    linger_ms: int | None = None  # None: the producer's default (5 ms)
    throughput: float = -1.0  # records/s for all producers together; <= 0: unlimited
    api: str = "send"  # send | send_many
    payload: str = "json"  # json | random
    transport: str = "shm"  # shm (local rings) | tcp (the broker, bootstrap.servers)
    topic: str | None = None
    producer_props: tuple[tuple[str, str], ...] = ()
    warmup_records: int | None = None  # None: min(records / 10, 50,000) per producer
    measure_limits: bool = True
    recycle_pages: bool = False  # the probes and the run each start right after perf_limits.recycle_pages
    profile: str | None = None  # cProfile the timed part of each producer into this file (.<pid> for K > 1)
    timestamp_type: str = "CreateTime"  # the topic's message.timestamp.type

    def __post_init__(self) -> None:
        if self.records < 1:
            raise ConfigError(f"--records {self.records}: expected at least 1")
        if self.record_size < 1:
            raise ConfigError(f"--record-size {self.record_size}: expected at least 1 byte")
        if self.partitions < 1 or self.producers < 1:
            raise ConfigError("--partitions and --producers: expected at least 1")
        if self.api not in ("send", "send_many"):
            raise ConfigError(f"--api {self.api!r}: expected send or send_many")
        if self.payload not in ("json", "random"):
            raise ConfigError(f"--payload {self.payload!r}: expected json or random")
        if self.transport not in ("shm", "tcp"):
            raise ConfigError(f"--transport {self.transport!r}: expected shm or tcp")
        if self.timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ConfigError(f"--message-timestamp-type {self.timestamp_type!r}: expected CreateTime or "
                              "LogAppendTime")

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["producer_props"] = dict(self.producer_props)
        return out


class TcpProducerUnavailable(ApplianceError):
    """Producing over TCP (``bootstrap.servers``) is not possible: ``appliance.Producer`` could not reach
    the broker."""


def producer_settings(settings: ProduceSettings, app: Appliance, bootstrap: str | None) -> dict[str, object]:
    """The ``appliance.Producer`` configuration for a run (Kafka's names)."""
    config: dict[str, object] = {"acks": settings.acks, "compression.type": settings.compression,
                                 "client.id": "appliance-bench"}
    if settings.batch_size is not None:
        config["batch.size"] = settings.batch_size
        config["max.request.size"] = max(settings.batch_size, 1_048_576)
    if settings.linger_ms is not None:
        config["linger.ms"] = settings.linger_ms
    if settings.transport == "tcp":
        config["bootstrap.servers"] = bootstrap or ""
    else:
        config["appliance.control.socket"] = app.socket_path
    for key, value in settings.producer_props:
        config[key] = value
    return config


def tcp_producer_status(bootstrap: str) -> tuple[bool, str]:
    """Whether ``appliance.Producer`` can produce over TCP to ``bootstrap``; why not, or which client will.
    Constructing one against the broker is the test."""
    from appliance.client.producer import Producer

    try:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "1"})
    except Exception as exc:  # a broker that does not answer, a bad address
        return False, f"appliance.Producer: {exc}"
    producer.close(timeout=5)
    return True, "appliance.Producer (bootstrap.servers)"


def open_producer(config: dict[str, object]) -> Any:
    """The ``appliance.Producer`` of a run (local rings, or TCP with ``bootstrap.servers``)."""
    from appliance.client.producer import Producer

    return Producer(config)


# ----------------------------------------------------------------------------------------------- payloads

_LEVELS = ("INFO", "INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_SERVICES = ("api-gateway", "checkout", "inventory", "auth", "search", "billing", "recommendation")
_METHODS = ("GET", "GET", "GET", "POST", "PUT", "DELETE")
_PATHS = ("/v1/orders", "/v1/orders/{id}", "/v1/cart", "/v1/users/{id}/profile", "/v1/search", "/health",
          "/v1/payments", "/v2/items/{id}/stock")
_MESSAGES = ("request completed", "cache miss, loading from store", "slow upstream response",
             "token refreshed", "retrying after timeout", "validation failed: missing field 'sku'",
             "connection pool exhausted, waiting")
_AGENTS = ("Mozilla/5.0 (X11; Linux x86_64)", "okhttp/4.12.0", "curl/8.5.0", "python-requests/2.31",
           "Go-http-client/2.0")


def _log_lines(count: int, rng: np.random.Generator, first_seq: int) -> list[bytes]:
    """``count`` JSON log lines (about 230 bytes each)."""
    ts = (1_763_800_000_000 + np.cumsum(rng.integers(0, 3, count))).tolist()
    level = rng.integers(0, len(_LEVELS), count).tolist()
    service = rng.integers(0, len(_SERVICES), count).tolist()
    host = rng.integers(1, 33, count).tolist()
    trace = rng.integers(0, 2**63, count).tolist()
    method = rng.integers(0, len(_METHODS), count).tolist()
    path = rng.integers(0, len(_PATHS), count).tolist()
    ident = rng.integers(1, 99_999, count).tolist()
    status = np.where(rng.random(count) < 0.9, 200,
                      rng.choice([201, 204, 400, 404, 500, 503], count)).tolist()
    latency = rng.gamma(2.0, 12.0, count).tolist()
    size = rng.integers(80, 40_000, count).tolist()
    agent = rng.integers(0, len(_AGENTS), count).tolist()
    message = rng.integers(0, len(_MESSAGES), count).tolist()
    return [
        (f'{{"ts":{ts[i]},"trace_id":"{trace[i]:016x}","level":"{_LEVELS[level[i]]}",'
         f'"service":"{_SERVICES[service[i]]}","host":"node-{host[i]:02d}","method":"{_METHODS[method[i]]}",'
         f'"path":"{_PATHS[path[i]].replace("{id}", str(ident[i]))}","status":{status[i]},'
         f'"latency_ms":{latency[i]:.2f},"bytes":{size[i]},"agent":"{_AGENTS[agent[i]]}",'
         f'"seq":{first_seq + i},"msg":"{_MESSAGES[message[i]]}"}}').encode()
        for i in range(count)
    ]


_TRACE_AT = len(b'{"ts":1763800000000,"trace_id":"')  # records under 64 bytes start at the trace id


def log_line_payloads(count: int, size: int, seed: int = 7) -> np.ndarray:
    """``count`` distinct log-like payloads of exactly ``size`` bytes: JSON log lines, newline-separated,
    each record starting at a line (records under 64 bytes at its random trace id) and holding as many
    lines as fit; a ``(count, size)`` uint8 array."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, size), dtype=np.uint8)
    wanted = count if size < 64 else count + (count * size) // 200 + 16  # lines are ~230 bytes
    lines = _log_lines(wanted, rng, 0)
    stream = b"\n".join(lines) + b"\n"
    starts = np.zeros(len(lines), dtype=np.int64)
    np.cumsum([len(line) + 1 for line in lines[:-1]], out=starts[1:])
    skip = _TRACE_AT if size < 64 else 0
    data = np.frombuffer(stream, dtype=np.uint8)
    line = 0
    for i in range(count):
        begin = int(starts[line]) + skip
        chunk = data[begin : begin + size]
        out[i, : len(chunk)] = chunk
        out[i, len(chunk) :] = ord("\n")
        line = min(int(np.searchsorted(starts, begin + size)), len(lines) - 1) if size >= 64 else line + 1
    return out


def payload_pool(settings: ProduceSettings, batch_bytes: int = 1_048_576) -> np.ndarray:
    """The distinct payloads a run cycles through: a ``(n, record_size)`` uint8 array."""
    size = settings.record_size
    per_batch = max(1, batch_bytes // size)
    count = max(16, POOL_BYTES // size, 2 * per_batch)
    count = min(count, POOL_MAX_RECORDS, max(settings.records, 16))
    if settings.payload == "random":
        return np.frombuffer(np.random.default_rng(11).bytes(count * size), np.uint8).reshape(count, size)
    if size <= 4096:
        return log_line_payloads(count, size)
    # large records: build a few distinct ones fully, the rest as rotations of them (still distinct bytes)
    base = log_line_payloads(min(count, 16), size)
    out = np.empty((count, size), dtype=np.uint8)
    for i in range(count):
        out[i] = np.roll(base[i % len(base)], (i // len(base)) * 4099)
    return out


# ----------------------------------------------------------------------------------------------- producing


@dataclass
class ProducerOutcome:
    """What one producer did in the timed part of a run."""

    records: int = 0
    payload_bytes: int = 0
    start_ns: int = 0  # time.monotonic_ns (one clock for every process of the host)
    end_ns: int = 0
    cpu_ns: int = 0  # the producing process's CPU time (all its threads)
    errors: int = 0
    first_error: str = ""
    latencies_ns: list[int] = field(default_factory=list)


def produce_into(producer: Any, topic: str, pool: np.ndarray, records: int, *, api: str,
                 rate_per_s: float = -1.0, batch_bytes: int = 1_048_576,
                 counter: Callable[[int], None] | None = None) -> ProducerOutcome:
    """Send ``records`` records of the pool (cycled) through ``producer``, then flush; the timed part of
    a producer's run."""
    outcome = ProducerOutcome()
    latencies = outcome.latencies_ns
    clock = time.monotonic_ns
    size = pool.shape[1]

    def sampled(started_ns: int) -> Callable[[Any, Any], None]:
        def done(error: Any, _metadata: Any) -> None:
            latencies.append(clock() - started_ns)
            if error is not None:
                outcome.errors += 1
                if not outcome.first_error:
                    outcome.first_error = str(error)
        return done

    throttled = rate_per_s > 0
    burst = _burst(api, rate_per_s, len(pool), batch_bytes // size)
    values = [row.tobytes() for row in pool] if api == "send" else []
    pool_count = len(pool)
    send = producer.send
    send_many = producer.send_many
    cpu_start = time.process_time_ns()
    start = clock()
    outcome.start_ns = start
    sent = 0
    position = 0
    while sent < records:
        count = min(burst, records - sent, pool_count - position)
        if api == "send":
            send(topic, values[position], callback=sampled(clock()))
            for value in values[position + 1 : position + count]:
                send(topic, value)
        else:
            send_many(topic, pool[position : position + count], callback=sampled(clock()))
        sent += count
        position += count
        if position >= pool_count:
            position = 0
        if counter is not None:
            counter(sent)
        if throttled:
            ahead_ns = int(sent * 1e9 / rate_per_s) - (clock() - start)
            if ahead_ns > 0:
                time.sleep(ahead_ns / 1e9)
    producer.flush()
    outcome.end_ns = clock()
    outcome.cpu_ns = time.process_time_ns() - cpu_start
    outcome.records = sent
    outcome.payload_bytes = sent * size
    return outcome


def _burst(api: str, rate_per_s: float, pool_count: int, records_per_batch: int) -> int:
    """Records per call between two looks at the clock: ``send`` 1,000 unthrottled, a throttled rate's
    THROTTLE_BURST_S worth; ``send_many`` a batch's worth of the pool, at most that much of the rate."""
    throttled = rate_per_s > 0
    if api == "send":
        return max(1, int(rate_per_s * THROTTLE_BURST_S)) if throttled else UNTHROTTLED_BURST
    burst = max(1, min(pool_count, records_per_batch))
    if throttled:
        burst = max(1, min(burst, int(rate_per_s * THROTTLE_BURST_S)))
    return burst


def _warm_up(producer: Any, topic: str, partitions: int, pool: np.ndarray, records: int, api: str) -> None:
    """Attach a ring to every partition and load the kernels: nothing of this is timed."""
    first = pool[0].tobytes()
    for partition in range(partitions):
        producer.send(topic, first, partition=partition)
    producer.flush()
    if records > 0:
        produce_into(producer, topic, pool, records, api=api)


def _producer_process(config: dict[str, object], topic: str, partitions: int, pool: np.ndarray, records: int,
                      warmup: int, api: str, rate_per_s: float, batch_bytes: int, counters: Any, index: int,
                      pipe: Any, profile: str | None) -> None:
    """One of K producer processes: warm up, say ready, wait for go, produce, send the outcome back."""
    try:
        producer = open_producer(config)
        try:
            _warm_up(producer, topic, partitions, pool, warmup, api)
            pipe.send(("ready", None))
            pipe.recv()

            def count(sent: int) -> None:
                counters[index] = sent

            with profiled(f"{profile}.{os.getpid()}" if profile else None):
                outcome = produce_into(producer, topic, pool, records, api=api, rate_per_s=rate_per_s,
                                       batch_bytes=batch_bytes, counter=count)
        finally:
            producer.close(timeout=60)
        pipe.send(("done", outcome))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_produce(app: Appliance, settings: ProduceSettings, *, progress: bool = False,
                bootstrap: str | None = None, keep_topic: bool = False,
                command: str = "produce") -> dict[str, Any]:
    """One produce run against ``app``; the JSON result (``bench.stats``).  Raises
    TcpProducerUnavailable for ``transport="tcp"`` when this tree cannot produce over TCP."""
    notes: list[str] = []
    address = bootstrap or app.bootstrap
    if settings.transport == "tcp":
        address = app.require_bootstrap(bootstrap)
        ok, why = tcp_producer_status(address)
        if not ok:
            raise TcpProducerUnavailable(
                f"producing over TCP is not available in this tree ({why}); use --transport shm meanwhile")
        notes.append(f"records went over TCP to the broker at {address} (Kafka Produce requests) through "
                     f"{why}")
    topic = settings.topic or f"perf-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    fresh = settings.topic is None
    config = producer_settings(settings, app, address)
    batch_bytes = settings.batch_size or 1_048_576
    app.create_topic(topic, settings.partitions, {"message.timestamp.type": settings.timestamp_type})
    try:
        return _run(app, settings, topic, config, batch_bytes, progress, notes, command)
    finally:
        if fresh and not keep_topic:
            app.delete_topic(topic)


@dataclass(frozen=True)
class _Timed:
    """The timed part of a run: each producer's outcome, the writers' CPU time meanwhile, the limits."""

    outcomes: list[ProducerOutcome]
    writer_cpu_ns: int
    limits: Limits | None


@dataclass(frozen=True)
class _LogMark:
    """The topic's log right before a run: its records (the sum of the log end offsets) and bytes."""

    records: int
    log_bytes: int


def _run(app: Appliance, settings: ProduceSettings, topic: str, config: dict[str, object], batch_bytes: int,
         progress_enabled: bool, notes: list[str], command: str) -> dict[str, Any]:
    """One run against a fresh topic: the timed part between its two probes, then the JSON result."""
    started_at = time.time()
    pool = payload_pool(settings, batch_bytes)
    warmup = settings.warmup_records
    if warmup is None:
        warmup = min(max(settings.records // 10, 1), 50_000)
    before = _LogMark(sum(app.end_offsets(topic)), app.log_bytes(topic))
    progress = Progress(settings.records, settings.record_size, enabled=progress_enabled)
    probe = _probe(app, settings, pool)
    try:
        timed = _timed_part(app, settings, topic, config, pool, warmup, batch_bytes, progress, probe)
    finally:
        progress.finish()
        if probe is not None:
            probe.remove()
    warm_total = (warmup + settings.partitions) * settings.producers
    return _result(app, settings, topic, timed, before, warm_total, notes, command, started_at)


def _timed_part(app: Appliance, settings: ProduceSettings, topic: str, config: dict[str, object],
                pool: np.ndarray, warmup: int, batch_bytes: int, progress: Progress,
                probe: PageCacheProbe | None) -> _Timed:
    """Warm the producers up, probe, produce (timed), probe again."""
    per_producer = _split(settings.records, settings.producers)
    rate = settings.throughput / settings.producers if settings.throughput > 0 else -1.0
    writer_pids = app.writer_pids(topic)
    outcomes: list[ProducerOutcome] = []
    if settings.producers == 1:
        producer = open_producer(config)
        try:
            _warm_up(producer, topic, settings.partitions, pool, warmup, settings.api)
            _probe_before(probe, settings)
            writer_cpu = process_cpu_ns(writer_pids, missing_ok=True)
            progress.restart()
            with profiled(settings.profile):
                outcomes.append(produce_into(
                    producer, topic, pool, per_producer[0], api=settings.api, rate_per_s=rate,
                    batch_bytes=batch_bytes, counter=progress.update))
            writer_cpu = process_cpu_ns(writer_pids, missing_ok=True) - writer_cpu
        finally:
            producer.close(timeout=60)
    else:
        writer_cpu = _run_processes(settings, topic, config, pool, per_producer, warmup, rate,
                                    batch_bytes, progress, outcomes, writer_pids, probe)
    return _Timed(outcomes, writer_cpu, _probe_after(probe, settings))


def _result(app: Appliance, settings: ProduceSettings, topic: str, timed: _Timed, before: _LogMark,
            warm_total: int, notes: list[str], command: str, started_at: float) -> dict[str, Any]:
    """The JSON result of a run (``bench.stats.make_result``), with what the log holds now."""
    outcomes, writer_cpu, limits = timed.outcomes, timed.writer_cpu_ns, timed.limits
    records = sum(o.records for o in outcomes)
    payload = sum(o.payload_bytes for o in outcomes)
    seconds = (max(o.end_ns for o in outcomes) - min(o.start_ns for o in outcomes)) / 1e9
    latencies = [x for o in outcomes for x in o.latencies_ns]
    errors = sum(o.errors for o in outcomes)
    in_log = sum(app.end_offsets(topic)) - before.records
    log_bytes = app.log_bytes(topic) - before.log_bytes
    if errors:
        first = next(o.first_error for o in outcomes if o.first_error)
        notes.append(f"{errors} sampled sends failed; first: {first}")
    if settings.acks != "0" and in_log != records + warm_total:
        notes.append(f"the log holds {in_log:,} new records, expected {records + warm_total:,} "
                     f"({records:,} timed + {warm_total:,} warm-up)")
    cpu = sum(o.cpu_ns for o in outcomes)
    timed_log_bytes = log_bytes * records / max(records + warm_total, 1)  # the warm-up's share taken out
    log_mb_per_s = round(timed_log_bytes / seconds / 1e6, 2)
    extra: dict[str, Any] = {
        "topic": topic,
        "log_bytes": log_bytes,
        "log_mb_per_s": log_mb_per_s,
        "compression_ratio": round(payload / max(timed_log_bytes, 1), 3),
        "records_in_log": in_log,
        "warmup_records": warm_total,
        "producer_cpu_ns_per_record": round(cpu / max(records, 1), 1),
        "producer_bound_records_per_s": round(records * 1e9 / max(cpu, 1)),
        "writer_cpu_ns_per_record": round(writer_cpu / max(records, 1), 1),
        "per_producer_records_per_s": [round(o.records / max((o.end_ns - o.start_ns) / 1e9, 1e-9))
                                       for o in outcomes],
        "errors": errors,
    }
    replication_factor = app.topic(topic).replication_factor
    extra["replication_factor"] = replication_factor
    if settings.acks == "all" and replication_factor == 1:
        notes.append("acks=all on a topic without followers: the writer acknowledges after the append, as "
                     "for acks=1 (`appliance bench replicate` compares the two with followers)")
    payload_bytes_per_s = payload / max(seconds, 1e-9)
    extra["producer_cpu_ns_per_byte"] = round(cpu / max(payload, 1), 3)
    extra["writer_cpu_ns_per_byte"] = round(writer_cpu / max(payload, 1), 3)
    if limits is not None:
        page_cache = limits.page_cache_write_bytes_per_s
        extra["log_ratio_to_page_cache_write"] = round(log_mb_per_s * 1e6 / page_cache, 4)
        extra["page_cache_probes"] = probe_report(limits, payload_bytes_per_s, cpu, writer_cpu, payload)
    return make_result(command, records=records, payload_bytes=payload, seconds=seconds,
                       latency=latency_summary(latencies, "send-to-ack"), config=settings.as_json(),
                       limits=limits, primary_limit="page_cache_write", extra=extra, notes=notes,
                       started_at=started_at)


def _probe(app: Appliance, settings: ProduceSettings, pool: np.ndarray) -> PageCacheProbe | None:
    """The page-cache probe of a run: its volume, its payload rows, the data directory; None without
    limits."""
    if not settings.measure_limits:
        return None
    return PageCacheProbe(app.data_dir, probe_volume_bytes(settings.records * settings.record_size), pool,
                          recycle=settings.recycle_pages)


def _probe_before(probe: PageCacheProbe | None, settings: ProduceSettings) -> None:
    """The probe right before the timed part; then ``os.sync()`` (and ``recycle_pages`` of the run's
    volume, as before each probe, when the settings say so): the run starts as the probe did."""
    if probe is not None:
        probe.measure()
        os.sync()
    if settings.recycle_pages:
        recycle_pages(settings.records * settings.record_size)


def _probe_after(probe: PageCacheProbe | None, settings: ProduceSettings) -> Limits | None:
    """The probe right after the timed part (after ``os.sync()``, as the others), then memcpy and
    ``sendfile``: the run's :class:`Limits`, page-cache write being the faster probe."""
    if probe is None:
        return None
    probe.measure()
    return limits_with_probe(probe, settings.records * settings.record_size)


def probe_report(limits: Limits, bytes_per_s: float, producer_cpu_ns: int, writer_cpu_ns: int,
                 payload_bytes: int) -> dict[str, Any]:
    """``extra.page_cache_probes`` of a run moving ``bytes_per_s`` (payload) between two probes: both
    samples (MB/s), the run's ratio to the faster (the headline ``ratios.page_cache_write``), to each and
    to their mean, the probes' CPU per byte, and ``cpu_bound_ratio``: the cheaper probe's CPU per byte over
    the costlier side's (producers' or writers') -- the ratio the run would reach with a core for each
    side and nothing else running, which others' load on a shared machine does not move."""
    samples = limits.page_cache_samples_bytes_per_s
    side_ns_per_byte = max(max(producer_cpu_ns, writer_cpu_ns) / max(payload_bytes, 1), 1e-9)
    report: dict[str, Any] = {
        "source": limits.page_cache_probe_source,
        "volume_bytes": limits.page_cache_probe_bytes,
        "samples_mb_per_s": [round(x / 1e6, 1) for x in samples],
        "cpu_ns_per_byte": [round(x, 3) for x in limits.page_cache_probe_cpu_ns_per_byte],
        "ratio_to_faster": round(bytes_per_s / max(samples), 4),
        "ratio_to_mean": round(bytes_per_s / (sum(samples) / len(samples)), 4),
        "cpu_bound_ratio": round(min(limits.page_cache_probe_cpu_ns_per_byte) / side_ns_per_byte, 4),
    }
    if len(samples) == 2:
        report["ratio_to_before"] = round(bytes_per_s / samples[0], 4)
        report["ratio_to_after"] = round(bytes_per_s / samples[1], 4)
    return report


def start_ready_processes(context: Any, target: Callable[..., None], arguments: Sequence[tuple[Any, ...]],
                          trailing: tuple[Any, ...], pipes: list[Any], processes: list[Any],
                          what: str) -> None:
    """Start one daemon process per tuple of ``arguments``, called as ``target(*arguments[i], child_end,
    *trailing)`` with the child end of a pipe, and wait until each sends ``("ready", _)`` on it.  The parent
    ends and the processes go into the caller's ``pipes`` and ``processes`` as they start, so the caller's
    clean-up reaches every one even when a later one fails.  ApplianceError names the one that failed while
    warming up."""
    for args in arguments:
        parent, child = context.Pipe()
        process = context.Process(target=target, args=(*args, child, *trailing), daemon=True)
        process.start()
        child.close()
        pipes.append(parent)
        processes.append(process)
    for index, pipe in enumerate(pipes):
        kind, payload = pipe.recv()
        if kind != "ready":
            raise ApplianceError(f"{what} {index} failed while warming up: {payload}")


def _run_processes(settings: ProduceSettings, topic: str, config: dict[str, object], pool: np.ndarray,
                   per_producer: Sequence[int], warmup: int, rate: float, batch_bytes: int,
                   progress: Progress, outcomes: list[ProducerOutcome], writer_pids: list[int],
                   probe: PageCacheProbe | None) -> int:
    """K producer processes: start and warm up each, probe, go, collect their outcomes; the writers' CPU
    time (ns) while they produced."""
    context = multiprocessing.get_context("fork")
    counters = context.RawArray("q", settings.producers)
    pipes: list[Any] = []
    processes: list[Any] = []
    try:
        start_ready_processes(context, _producer_process, [
            (config, topic, settings.partitions, pool, count, warmup, settings.api, rate, batch_bytes,
             counters, index) for index, count in enumerate(per_producer)
        ], (settings.profile,), pipes, processes, "producer process")
        _probe_before(probe, settings)
        writer_cpu = process_cpu_ns(writer_pids, missing_ok=True)
        progress.restart()
        for pipe in pipes:
            pipe.send("go")
        waiting = dict(enumerate(pipes))
        while waiting:
            for index, pipe in list(waiting.items()):
                if pipe.poll(0.05):
                    kind, payload = pipe.recv()
                    if kind != "done":
                        raise ApplianceError(f"producer process {index} failed: {payload}")
                    outcomes.append(payload)
                    del waiting[index]
            progress.update(sum(counters))
        return process_cpu_ns(writer_pids, missing_ok=True) - writer_cpu
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()
