"""Compressed batches for the codec tests (no tests here): records with headers and null keys, the Kafka
clients producing them with each codec, and a batch whose CRC is valid but whose compressed records are
garbage, sent to a running broker as any producer would send it."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ipc.kafka import ApiKey, ErrorCode
from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, write_crc
from storage.batch_reader import iter_batches
from support.wire import WireClient, answers, produce

CODECS = ("gzip", "snappy", "lz4", "zstd")
Headers = tuple[tuple[str, bytes | None], ...]


class Sent(NamedTuple):
    key: bytes | None
    value: bytes
    headers: Headers


Sending = Callable[[str, list[Sent], int], None]  # (topic, records, partition): produce and flush

def log_records(count: int, *, large: bool, tag: str) -> list[Sent]:
    """Log-like records: every fourth key null, two headers (one empty) on two of three; ``large`` values
    of 1-3 KiB (a batch then spans several LZ4 blocks and xerial chunks), else about 100 bytes."""
    out = []
    for i in range(count):
        line = b"2026-11-27T10:%02d:%02d INFO %s worker-%d handled request %d in %d ms" % (
            i // 60 % 60, i % 60, tag.encode(), i % 5, i, i % 97)
        value = line * (10 + i % 20) if large else line
        key = None if i % 4 == 0 else b"key-%d" % (i % 9)
        headers: Headers = (("trace", b"%08x" % i), ("empty", b"")) if i % 3 else ()
        out.append(Sent(key, value, headers))
    return out


@contextmanager
def confluent_producer(bootstrap: str, codec: str, *, linger_ms: int) -> Iterator[Sending]:
    """An idempotent confluent-kafka producer compressing with ``codec``, as a function that produces
    records to a partition and flushes them.  One producer serves many sends: each new idempotent producer
    waits about 0.5 s for its producer id (librdkafka's retry timer), so a test makes few."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                                         "linger.ms": linger_ms, "enable.idempotence": True,
                                         "batch.size": 1 << 20})

    def send(topic: str, records: list[Sent], partition: int = 0) -> None:
        for r in records:
            producer.produce(topic, value=r.value, key=r.key, headers=list(r.headers), partition=partition)
        assert producer.flush(30) == 0

    yield send


def produce_confluent(bootstrap: str, topic: str, codec: str, records: list[Sent], *, linger_ms: int,
                      partition: int = 0, flush_every: int | None = None) -> None:
    """Produce ``records`` with one confluent-kafka producer, flushing after every ``flush_every`` of them
    (with ``linger_ms=0`` each flush is a batch of those records), else once at the end."""
    step = flush_every or max(len(records), 1)
    with confluent_producer(bootstrap, codec, linger_ms=linger_ms) as send:
        for i in range(0, len(records), step):
            send(topic, records[i : i + step], partition)


def produce_kafka_python(bootstrap: str, topic: str, codec: str, records: list[Sent], *,
                         linger_ms: int, partition: int = 0, flush_every: int | None = None) -> None:
    """As :func:`produce_confluent`, with one kafka-python producer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=linger_ms,
                                 batch_size=1 << 20, max_request_size=4 << 20)
    step = flush_every or max(len(records), 1)
    try:
        for i in range(0, len(records), step):
            futures = [producer.send(topic, value=r.value, key=r.key, headers=list(r.headers),
                                     partition=partition) for r in records[i : i + step]]
            producer.flush(30)
            for future in futures:
                future.get(10)
    finally:
        producer.close()


def garbage_batch(codec: int, count: int) -> bytes:
    """A batch of ``count`` records whose header says ``codec`` and whose records section is bytes that no
    codec reads (a zstd magic and an LZ4 magic among them, so each decoder gets past its first check); the
    CRC is right, so only decompressing finds the fault."""
    records = (b"\x28\xb5\x2f\xfd\x04\x22\x4d\x18\x82SNAPPY\x00\x1f\x8b" + b"\xff\xfe not compressed " * 8)
    batch = bytearray(HEADER_SIZE + len(records))
    now = int(time.time() * 1000)
    BATCH_HEADER.pack_into(batch, 0, 0, len(batch) - LOG_OVERHEAD, -1, 2, 0, codec, count - 1, now, now,
                           -1, -1, -1, count)
    batch[HEADER_SIZE:] = records
    write_crc(batch, 0, len(batch))
    return bytes(batch)


def send_batch(bootstrap: str, topic: str, partition: int, batch: bytes) -> int:
    """Produce ``batch`` as it is (acks=1); its base offset."""
    host, port = bootstrap.rsplit(":", 1)
    wire = WireClient((host, int(port)))
    try:
        response = wire.call(ApiKey.PRODUCE, 8, produce(1, (topic, partition, batch)))
    finally:
        wire.close()
    error, base_offset = answers(response)[(topic, partition)]
    assert error == ErrorCode.NONE, error
    return base_offset


def codecs_on_disk(partition_dir: Path) -> set[int]:
    """The codec of every batch in a partition's segment files."""
    found = set()
    for path in sorted(partition_dir.glob("*.log")):
        data = path.read_bytes()
        found |= {header.compression for _, header in iter_batches(data, allow_truncated_tail=True)}
    return found


def as_sent(records: list[Any]) -> list[Sent]:
    """Consumer records (anything with key, value, headers) as :class:`Sent`."""
    return [Sent(r.key, r.value, tuple(r.headers)) for r in records]
