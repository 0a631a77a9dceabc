"""Streaming reads: per-partition offsets that Spark checkpoints, admission control, Trigger.AvailableNow.

Theory of operation
-------------------
Spark drives a micro-batch stream through one long-lived reader on the driver: ``initialOffset()`` once for
a new query, then per trigger ``latestOffset(start, limit)`` (how far the next batch goes),
``partitions(start, end)`` (its tasks) and ``commit(end)``.  Spark writes each batch's end offset to the
query's checkpoint *before* running it, and after a crash replays the last planned batch with the same
``start`` and ``end``: a batch is a pure function of its two offsets, and :func:`split_ranges` is
deterministic, so the replay reads exactly the same records.

**The offset** is ``{"topic": {"partition": offset, ...}, ...}``: the next offset to read per partition,
topics sorted by name, partitions by number, keys as strings.  Spark compares offsets as JSON *text*, so the
order must never vary (:func:`encode_offsets` is the only place that builds one).

**Admission control.**  ``latestOffset`` caps the batch at ``maxOffsetsPerTrigger`` records and about
``maxBytesPerTrigger`` key and value bytes (the bytes per record of each partition are estimated once from
a sample of its records), shared between partitions in proportion to what each has waiting: largest
remainders first, so the total is exactly the limit, and at least one record while any is waiting.  Spark
passes ``ReadAllAvailable`` where a trigger must see everything (then the options do not apply).  With
``Trigger.AvailableNow`` Spark first calls :meth:`prepareForTriggerAvailableNow`: the high watermarks at
that moment become the target, and batches (still limited) stop there.

**Waiting for a minimum** (``minOffsetsPerTrigger``, ``maxTriggerDelay``), as Spark's Kafka source does it:
a trigger that finds fewer records waiting than the minimum returns ``start`` again (Spark runs no batch)
unless ``maxTriggerDelay`` has passed since the last trigger that did go ahead; the first trigger of a
reader always goes ahead.  PySpark's Python data source API has no composite read limit and its
``ReadMinRows`` carries no delay, so the reader keeps both from its options and applies them itself
whenever Spark passes a limit other than ``ReadAllAvailable``.  Under ``Trigger.AvailableNow`` it does not
wait (the query ends at its target instead of idling).

**Partitions come and go.**  Each ``latestOffset`` lists the subscribed topics again (``subscribePattern``
picks up new topics), so a partition that appears is in the next ``end`` offset and is read from its log
start offset.  A partition that disappears (its topic deleted), or whose records below the start offset were
deleted by retention before the batch ran, is data loss: with ``failOnDataLoss=true`` (the default) planning
fails with a message naming the partition and the lost offsets; with ``false`` the batch skips what is gone.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from appliance.spark.batch_reader import read_range
from appliance.spark.options import EARLIEST, LATEST, SourceOptions
from appliance.spark.planning import ClusterView, OffsetRange, TopicPartitionKey, resolve, split_ranges, task
from ipc.kafka_client import BrokerConnectionError
from storage.errors import ConfigError, OffsetOutOfRangeError

__all__ = ["ApplianceStreamReader", "decode_offsets", "encode_offsets", "prorate"]

Offsets = dict[TopicPartitionKey, int]


def encode_offsets(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Spark's offset: topics by name, partitions by number, string keys -- always the same order."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def decode_offsets(offset: Mapping[str, Any]) -> Offsets:
    """An offset Spark hands back (from :func:`encode_offsets`, maybe through a checkpoint file)."""
    try:
        return {(topic, int(p)): int(o) for topic, parts in offset.items() for p, o in parts.items()}
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(f"appliance data source: the checkpointed offset {json.dumps(offset)} is not "
                          '{"topic": {"partition": offset}}: was the checkpoint written by another '
                          "source?") from None


def prorate(waiting: Mapping[TopicPartitionKey, int], limit: int) -> dict[TopicPartitionKey, int]:
    """How many of each partition's ``waiting`` records to take so that the total is ``min(limit, all)``:
    shares in proportion to what waits, remainders to the largest fractions (ties in partition order)."""
    total = sum(waiting.values())
    if total <= limit:
        return dict(waiting)
    taken = {tp: n * limit // total for tp, n in waiting.items()}
    left = limit - sum(taken.values())
    by_fraction = sorted(waiting, key=lambda tp: (-(waiting[tp] * limit % total), tp))
    for tp in by_fraction[:left]:
        taken[tp] += 1
    return taken


class ApplianceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("appliance")``; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._view: ClusterView | None = None  # opened on first use, on the driver only
        self._target: Offsets | None = None  # Trigger.AvailableNow: stop here
        self._latest: Offsets | None = None
        self._bytes_per_record: dict[TopicPartitionKey, float] = {}
        self._last_trigger_ms = float("-inf")  # minOffsetsPerTrigger: when a trigger last went ahead

    # -- the broker ----------------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        """A ClusterView call, reconnecting up to ``fetchOffset.numRetries`` times (``retryIntervalMs``
        apart) if the broker went away between triggers."""
        attempts = self.options.fetch_offset_retries + 1
        for attempt in range(attempts):
            if self._view is None:
                self._view = ClusterView(self.options.bootstrap_servers)
            try:
                return getattr(self._view, method)(*args)
            except BrokerConnectionError:
                self._view.close()
                self._view = None
                if attempt == attempts - 1:
                    raise
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    def _partitions_now(self) -> tuple[list[TopicPartitionKey], Offsets, Offsets]:
        tps: list[TopicPartitionKey] = self._call("read_partitions", self.options)
        return tps, self._call("offsets", tps, EARLIEST), self._call("offsets", tps, LATEST)

    # -- offsets -------------------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, dict[str, int]]:
        spec = self.options.starting_offsets
        assert spec is not None
        tps, earliest, latest = self._partitions_now()
        times = functools.partial(self._call, "offsets_for_times")
        starts = resolve(spec, tps, earliest, latest, times, self.options.starting_strategy)
        for tp, offset in starts.items():
            if offset > latest[tp]:
                raise OffsetOutOfRangeError(
                    f"appliance data source: option {spec.option}: partition {tp[0]}-{tp[1]} offset "
                    f"{offset} is past the end of the partition (log start offset {earliest[tp]}, high "
                    f"watermark {latest[tp]})")
            if offset < earliest[tp] and self.options.fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"appliance data source: option {spec.option}: partition {tp[0]}-{tp[1]} offset "
                    f"{offset} is below the log start offset {earliest[tp]} (records deleted by retention); "
                    f"set failOnDataLoss=false to start at {earliest[tp]}")
        return encode_offsets(starts)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._partitions_now()[2]

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = decode_offsets(start)
        _, earliest, latest = self._partitions_now()
        if self._target is not None:
            target = self._target
            latest = {tp: min(offset, target[tp]) for tp, offset in latest.items() if tp in target}
        self._latest = dict(latest)
        for tp in latest:
            if tp not in begin:
                begin[tp] = earliest[tp]  # a new partition is read from its start
        waiting = {tp: max(0, latest[tp] - max(begin[tp], earliest[tp])) for tp in latest}
        if self._wait_for_more(sum(waiting.values()), limit):
            return encode_offsets(decode_offsets(start))
        take = self._admit(begin, earliest, waiting, limit)
        end = {tp: max(begin[tp], earliest[tp]) + take[tp] if take[tp] else begin[tp] for tp in latest}
        for tp, offset in decode_offsets(start).items():
            end.setdefault(tp, offset)  # a vanished partition: partitions() decides about the loss
        return encode_offsets(end)

    def _wait_for_more(self, waiting: int, limit: ReadLimit) -> bool:
        """minOffsetsPerTrigger: True to skip this trigger (fewer records wait, maxTriggerDelay not over)."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or isinstance(limit, ReadAllAvailable) or self._target is not None:
            return False
        now = time.monotonic() * 1000
        if now - self._last_trigger_ms < self.options.max_trigger_delay_ms and waiting < minimum:
            return True
        self._last_trigger_ms = now
        return False

    def _admit(self, begin: Offsets, earliest: Offsets, waiting: Offsets, limit: ReadLimit) -> Offsets:
        if isinstance(limit, ReadAllAvailable):
            return waiting
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_offsets_per_trigger
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes_per_trigger
        allowed = dict(waiting)
        if max_bytes is not None:
            sizes = {tp: self._record_bytes(tp, max(begin[tp], earliest[tp]))
                     for tp, n in waiting.items() if n}
            waiting_bytes = {tp: int(n * sizes[tp]) for tp, n in waiting.items() if n}
            share = prorate(waiting_bytes, max_bytes)
            allowed = {tp: min(n, int(share.get(tp, 0) / sizes[tp])) if n else 0 for tp, n in waiting.items()}
        if max_rows is not None:
            allowed = prorate(allowed, max_rows)
        if not any(allowed.values()) and any(waiting.values()):
            first = min(tp for tp, n in waiting.items() if n)  # always make progress
            allowed[first] = 1
        return allowed

    def _record_bytes(self, tp: TopicPartitionKey, offset: int) -> float:
        size = self._bytes_per_record.get(tp)
        if size is None:
            size = self._call("payload_bytes_per_record", tp[0], tp[1], offset) or 1.0
            self._bytes_per_record[tp] = size
        return size

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else encode_offsets(self._latest)

    # -- tasks ---------------------------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = decode_offsets(start), decode_offsets(end)
        if begin == finish:
            return []
        tps, earliest, _ = self._partitions_now()
        now_read = set(tps)
        ranges = []
        for tp, until in finish.items():
            name = f"partition {tp[0]}-{tp[1]}"
            if tp not in now_read:
                self._data_loss(f"{name} no longer exists (was its topic deleted?); offsets from "
                                f"{begin.get(tp, 0)} on cannot be read")
                continue
            first = begin.get(tp, earliest[tp])
            if first < earliest[tp]:
                self._data_loss(f"{name}: offsets {first}..{min(earliest[tp], until) - 1} were deleted by "
                                f"retention before this micro-batch read them (log start offset "
                                f"{earliest[tp]})")
                first = earliest[tp]
            if until < first:
                self._data_loss(f"{name}: the end offset {until} is below the start offset {first} (was the "
                                "topic deleted and created again?)")
                continue
            ranges.append(task(self.options, tp, first, until))
        return list(split_ranges(ranges, self.options.min_partitions, self.options.max_records_per_partition))

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise OffsetOutOfRangeError(f"appliance data source: data loss: {message}; set "
                                        "failOnDataLoss=false to skip what is gone")

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark's stand-in task when there are no ranges
        return read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint is Spark's (no consumer group offsets are committed)."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
