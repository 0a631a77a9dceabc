"""``appliance bench consume``: kafka-consumer-perf-test for the appliance.

A run fills a fresh topic with ``--records`` records (``send_many``, untimed; or consumes ``--topic`` as it is
with ``--reuse``), then one ``appliance.Consumer`` assigned every partition reads them all from the start with
``poll_batch`` (the array API: every batch's CRC checked, every record decoded into offsets, timestamps and
key/value positions; the values are views of the memory-mapped segments on the local path, of the Fetch
response on the TCP path), touching each value's length, until it has seen every record.

* ``--transport shm`` (default): the local path, segment files memory-mapped read-only, read up to the high
  watermark in the partition state page.  Held against memcpy: the extra figure ``mapped_copy_mb_per_s`` is
  the least any reader of these very files can cost (copying them out of the page cache).
* ``--transport tcp`` / ``--bootstrap-server``: Fetch requests to the broker, whose answers leave with
  ``sendfile``.  Held against loopback sendfile.

Latency here is the time each ``poll_batch`` call took (kind ``poll``).

With ``--compression CODEC`` the topic is filled with batches of that codec, and after the timed read the
run decompresses every batch of the topic's segment files once more on its own (``storage.compression``,
nothing else: no CRC, no record decoding), timed: ``decompress_s`` and ``decompress_share`` (that time over
the timed read's) say how much of a compressed read is the codec, and ``compression_ratio`` the bytes the
records section took before and after.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import replace
from typing import Any, NamedTuple

from bench.harness import Appliance
from bench.limits import Limits, mapped_copy_bytes_per_s, measure_limits
from bench.produce import ProduceSettings, payload_pool, produce_into, producer_settings
from bench.stats import Progress, latency_summary, make_result, profiled
from storage.batch_header import HEADER_SIZE
from storage.batch_reader import iter_batches
from storage.compression import decompress
from storage.errors import ApplianceError, ConfigError

__all__ = ["Consumed", "consume_all", "fill_topic", "run_consume"]

IDLE_TIMEOUT_S = 10.0  # no record for this long: the topic has fewer records than asked for


class Consumed(NamedTuple):
    """What :func:`consume_all` read: records, value bytes, seconds, and each ``poll_batch`` call's time."""

    records: int
    value_bytes: int
    seconds: float
    poll_latencies_ns: list[int]


class Probed(NamedTuple):
    """The limits measured before a consume run (None with ``--no-limits``) and the memory-mapped copy of
    its segment files (bytes per second)."""

    limits: Limits | None
    mapped_copy_bytes_per_s: float | None


def fill_topic(app: Appliance, settings: ProduceSettings, topic: str) -> None:
    """Produce ``settings.records`` records into ``topic`` (send_many, acks=1, untimed)."""
    from appliance.client.producer import Producer

    local = replace(settings, transport="shm", acks="1", api="send_many")
    config = producer_settings(local, app, None)
    batch_bytes = settings.batch_size or 1_048_576
    pool = payload_pool(local, batch_bytes)
    with Producer(config) as producer:
        produce_into(producer, topic, pool, settings.records, api="send_many",
                     batch_bytes=batch_bytes)


def consume_all(consumer: Any, records: int, progress: Progress | None = None) -> Consumed:
    """Poll until ``records`` records were seen, touching each value's length as a reader would."""
    clock = time.monotonic_ns
    seen = 0
    value_bytes = 0
    latencies: list[int] = []
    start = clock()
    last_data = start
    while seen < records:
        before = clock()
        chunks = consumer.poll_batch(timeout_ms=200)
        after = clock()
        latencies.append(after - before)
        if not chunks:
            if after - last_data > IDLE_TIMEOUT_S * 1e9:
                raise ApplianceError(f"consume: only {seen:,} of {records:,} records arrived; none for "
                                     f"{IDLE_TIMEOUT_S:.0f} s")
            continue
        last_data = after
        for chunk in chunks:
            seen += len(chunk)
            value_bytes += int(chunk.value_lengths.sum())  # touch what a reader would use
        if progress is not None:
            progress.update(seen)
    return Consumed(seen, value_bytes, (clock() - start) / 1e9, latencies)


def run_consume(app: Appliance, settings: ProduceSettings, *, progress: bool = False,
                bootstrap: str | None = None, keep_topic: bool = False, reuse: bool = False,
                fetch_max_bytes: int | None = None) -> dict[str, Any]:
    """One consume run against ``app`` (see the module doc); the JSON result (``bench.stats``).
    ``reuse``: consume ``settings.topic`` as it is; ``fetch_max_bytes``: ``max.partition.fetch.bytes``."""
    notes: list[str] = []
    started_at = time.time()
    address = app.require_bootstrap(bootstrap) if settings.transport == "tcp" else None
    if reuse and settings.topic is None:
        raise ConfigError("--reuse needs --topic (the topic to consume as it is)")
    topic = settings.topic or f"perf-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    if not reuse:
        app.create_topic(topic, settings.partitions)
    try:
        partitions = app.topic(topic).partition_count
        if not reuse:
            fill_topic(app, settings, topic)
        records = min(settings.records, sum(app.end_offsets(topic))) if reuse else settings.records
        segment_paths = _segments(app, topic)
        log_bytes = sum(os.path.getsize(p) for p in segment_paths)
        probed = _probe(app, settings, records, segment_paths)
        try:
            config = _consumer_config(app, settings, address, fetch_max_bytes, notes)
            consumed = _read(config, [(topic, p) for p in range(partitions)], records, settings, progress)
            codec = _decompression(segment_paths) if settings.compression != "none" else None
        finally:
            if probed.limits is not None:
                probed.limits.remove_probe_files()
    finally:
        if settings.topic is None and not keep_topic:
            app.delete_topic(topic)
    extra: dict[str, Any] = {"topic": topic, "partitions": partitions, "log_bytes": log_bytes,
                             "log_mb_per_s": round(log_bytes * consumed.records / max(records, 1)
                                                   / consumed.seconds / 1e6, 2),
                             "value_bytes": consumed.value_bytes}
    if codec is not None:
        extra["compression_ratio"] = round(codec.plain_bytes / max(codec.packed_bytes, 1), 2)
        extra["decompress_s"] = round(codec.seconds, 4)
        extra["decompress_share"] = round(codec.seconds / consumed.seconds, 3)
        notes.append(f"{settings.compression}: records sections {extra['compression_ratio']}x smaller; "
                     f"decompressing every batch alone took {codec.seconds:.3f} s, "
                     f"{extra['decompress_share']:.0%} of the timed read")
    mapped_copy = probed.mapped_copy_bytes_per_s
    if mapped_copy is not None:
        extra["mapped_copy_mb_per_s"] = round(mapped_copy / 1e6, 1)
        extra["log_ratio_to_mapped_copy"] = round(extra["log_mb_per_s"] * 1e6 / mapped_copy, 4)
    primary = "loopback_sendfile" if settings.transport == "tcp" else "memcpy"
    return make_result("consume", records=consumed.records, payload_bytes=consumed.value_bytes,
                       seconds=consumed.seconds, latency=latency_summary(consumed.poll_latencies_ns, "poll"),
                       config=settings.as_json(), limits=probed.limits, primary_limit=primary, extra=extra,
                       notes=notes, started_at=started_at)


def _probe(app: Appliance, settings: ProduceSettings, records: int, segment_paths: list[str]) -> Probed:
    """The limits of a run reading ``records`` records, and the mapped copy of its segment files."""
    if not settings.measure_limits:
        return Probed(None, None)
    limits = measure_limits(app.data_dir, records * settings.record_size)
    try:
        return Probed(limits, mapped_copy_bytes_per_s(segment_paths))
    except BaseException:
        limits.remove_probe_files()
        raise


def _consumer_config(app: Appliance, settings: ProduceSettings, address: str | None,
                     fetch_max_bytes: int | None, notes: list[str]) -> dict[str, Any]:
    """The consumer's configuration: over TCP to ``address`` (noted), else the local path."""
    config: dict[str, Any] = {"auto.offset.reset": "earliest", "client.id": "appliance-bench"}
    if settings.transport == "tcp":
        config["bootstrap.servers"] = address
        notes.append(f"read over TCP from the broker at {address} (Fetch, sendfile)")
    else:
        config["appliance.data.dir"] = str(app.data_dir)
    if fetch_max_bytes is not None:
        config["max.partition.fetch.bytes"] = fetch_max_bytes
    return config


def _read(config: dict[str, Any], assignment: list[tuple[str, int]], records: int, settings: ProduceSettings,
          progress: bool) -> Consumed:
    """A consumer assigned every partition, warmed up (maps, connection, kernels), then timed reading
    ``records`` records from the start."""
    from appliance.client.consumer import Consumer

    consumer = Consumer(config)
    try:
        consumer.assign(assignment)
        consumer.poll_batch(timeout_ms=1000, max_records=1)  # maps, connects, loads the kernels
        consumer.seek_to_beginning(*assignment)
        line = Progress(records, settings.record_size, enabled=progress)
        with profiled(settings.profile):
            consumed = consume_all(consumer, records, line)
        line.finish()
        return consumed
    finally:
        consumer.close()


class Decompressed(NamedTuple):
    """Every compressed records section of a topic decompressed once: bytes in and out, seconds."""

    packed_bytes: int
    plain_bytes: int
    seconds: float


def _decompression(segment_paths: list[str]) -> Decompressed:
    """Decompress every compressed batch of the segment files (in the page cache), timing only that."""
    clock = time.perf_counter
    packed = plain = 0
    seconds = 0.0
    for path in segment_paths:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                continue
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                for position, header in iter_batches(view, verify_crc=False, allow_truncated_tail=True):
                    if not header.compression:
                        continue
                    section = view[position + HEADER_SIZE : position + header.size]
                    start = clock()
                    out = decompress(header.compression, section, where=path)
                    seconds += clock() - start
                    packed += len(section)
                    plain += len(out)
                    del section
                del view
    return Decompressed(packed, plain, seconds)


def _segments(app: Appliance, topic: str) -> list[str]:
    paths: list[str] = []
    for part in app.topic(topic).partitions:
        for entry in sorted(os.scandir(part.directory), key=lambda e: e.name):
            if entry.name.endswith(".log"):
                paths.append(entry.path)
    return paths
