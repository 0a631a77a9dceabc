"""Helpers of the Producer's tests: an appliance's topics, a producer on it, its log read back."""

from __future__ import annotations

import time
from typing import Any

from appliance.client.producer import Producer
from storage.batch_reader import Record, iter_records
from support.harness import Appliance

TOPICS = ("topics.rt.partitions=3", "topics.one.partitions=1", "topics.bulk.partitions=4",
          "topics.acks.partitions=1", "topics.dup.partitions=1", "topics.threads.partitions=2",
          "topics.raw.partitions=1", "topics.mix.partitions=1", "topics.race.partitions=1",
          "topics.linger.partitions=2", "topics.burst.partitions=1",
          "topics.stream.partitions=1")  # fmt: skip


def make_producer(serve: Appliance, **settings: Any) -> Producer:
    return Producer({"appliance.control.socket": str(serve.socket_path)}, **settings)


def log_records(serve: Appliance, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    for data in serve.batches(topic, partition):
        records += iter_records(data)
    return records


def wait_for_records(serve: Appliance, topic: str, partition: int, count: int) -> list[Record]:
    deadline = time.monotonic() + 10
    while len(records := log_records(serve, topic, partition)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return records


def by_offset(serve: Appliance, topic: str, partition: int) -> dict[int, Record]:
    return {record.offset: record for record in log_records(serve, topic, partition)}
