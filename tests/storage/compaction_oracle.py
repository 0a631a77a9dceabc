"""What a compacted log must hold, for the compaction tests: the records the log should read as, and the
helpers that read a log's records and batch headers from the start."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from storage.batch_header import parse_header
from storage.batch_reader import iter_batches, iter_records
from storage.cleaner import DELETE_HORIZON_FLAG_MASK


@dataclass
class Model:
    """The records a compacted log holds (offset -> (key, value)), each record's batch, and the delete
    horizon each batch got from the first clean that kept one of its tombstones."""

    records: dict[int, tuple[bytes | None, bytes | None]] = field(default_factory=dict)
    batch_of: dict[int, int] = field(default_factory=dict)  # record offset -> its batch's base offset
    horizons: dict[int, int] = field(default_factory=dict)  # batch base offset -> delete horizon (ms)

    def append(self, base: int, keys: list[bytes | None], values: list[bytes | None]) -> None:
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.records[base + i] = (key, value)
            self.batch_of[base + i] = base

    def clean(self, end: int, now_ms: int, delete_retention_ms: int) -> None:
        """A pass whose offset map ended at ``end`` (Kafka's rules, docs/storage.md "Compaction")."""
        latest: dict[bytes, int] = {}
        for offset in sorted(self.records):
            key = self.records[offset][0]
            if offset < end and key is not None:
                latest[key] = offset
        kept_tombstones: set[int] = set()
        for offset in sorted(self.records):
            if offset >= end:
                continue
            key, value = self.records[offset]
            horizon = self.horizons.get(self.batch_of[offset])
            drop = key is None or latest[key] > offset
            if value is None and horizon is not None and now_ms >= horizon:
                drop = True
            if drop:
                del self.records[offset]
            elif value is None:
                kept_tombstones.add(self.batch_of[offset])
        for base in kept_tombstones:
            self.horizons.setdefault(base, now_ms + delete_retention_ms)

    def latest_by_key(self) -> dict[bytes, tuple[int, bytes | None]]:
        out: dict[bytes, tuple[int, bytes | None]] = {}
        for offset in sorted(self.records):
            key, value = self.records[offset]
            if key is not None:
                out[key] = (offset, value)
        return out


def read_records(batches: Iterable[bytes]) -> dict[int, tuple[bytes | None, bytes | None]]:
    """offset -> (key, value) of every record in ``batches`` (CRCs checked)."""
    out: dict[int, tuple[bytes | None, bytes | None]] = {}
    for data in batches:
        for position, _ in iter_batches(data):
            for record in iter_records(data, position):
                out[record.offset] = (record.key, record.value)
    return out


def headers(batches: Iterable[bytes]) -> list:  # list[BatchHeader]
    return [parse_header(data) for data in batches]


def horizons(batches: Iterable[bytes]) -> dict[int, int]:
    """Batch base offset -> delete horizon, for the batches that carry one."""
    return {h.base_offset: h.base_timestamp for h in headers(batches)
            if h.attributes & DELETE_HORIZON_FLAG_MASK}


def producer_last_batches(batches: Iterable[bytes]) -> dict[int, tuple[int, int, int, int]]:
    """Producer id -> (base offset, last offset, epoch, base sequence) of its last batch."""
    return {h.producer_id: (h.base_offset, h.last_offset, h.producer_epoch, h.base_sequence)
            for h in headers(batches) if h.producer_id >= 0}
