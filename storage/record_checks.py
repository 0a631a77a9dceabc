"""Record-level rules a topic's settings impose on a batch before it is appended, and the refusal they give.

Kafka validates some rules per record, not per batch, and refuses the whole batch when any record breaks
one, naming the records (Produce v8's ``record_errors``, KIP-467: each bad record's index in the batch and
a message).  The appliance has one such rule so far:

* **A compacted topic needs keys** (``cleanup.policy`` contains ``compact``): compaction keeps the latest
  record of each key, so a record without a key has no place in the log.  Kafka refuses it with
  INVALID_RECORD; so does the appliance, and nothing of the batch is appended.

:func:`keyless_records` finds the keyless records of one validated batch (decompressing it when compressed,
through ``storage.batch_reader``), :func:`keyless_columns` those of records about to be built into one
(``storage.batch_builder``'s columns); :func:`refusal` words the answer: the record indexes and one message
per record, as Produce v8 carries them, plus the top-level message.  The broker applies it to a Produce
request's batch, the local producer to the records it is about to send, so both report the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from storage.batch_builder import RecordColumns, Records
from storage.batch_reader import Bytes, decode_batch

__all__ = ["RecordRefusal", "keyless_columns", "keyless_records", "refusal", "requires_keys"]

_SHOWN_INDEXES = 10  # the top-level message lists at most this many indexes


class RecordRefusal(NamedTuple):
    """Why a batch was refused for some of its records (Kafka's INVALID_RECORD)."""

    indexes: tuple[int, ...]  # the bad records' positions in the batch (0 = its first record)
    record_messages: tuple[str, ...]  # one per index: what is wrong with that record and what to do
    message: str  # the whole batch's error message


def requires_keys(cleanup_policy: Sequence[str] | str) -> bool:
    """Whether a topic with this ``cleanup.policy`` (a list, or Kafka's comma-separated string) needs keys."""
    items = cleanup_policy.split(",") if isinstance(cleanup_policy, str) else cleanup_policy
    return any(item.strip() == "compact" for item in items)


def keyless_records(buf: Bytes, position: int = 0, *, where: str = "buffer") -> np.ndarray:
    """The indexes (int64, ascending) of the records without a key in the batch at ``position``.

    The batch must have been validated (its CRC is not checked again); CorruptRecordError for records
    that cannot be decoded."""
    batch = decode_batch(buf, position, where=where, verify_crc=False)
    return np.flatnonzero(batch.key_lengths < 0)


def keyless_columns(records: Records) -> np.ndarray:
    """The indexes (int64, ascending) of the records without a key among ``records`` before they are built
    into a batch (the producer's check): a list of values has no keys at all."""
    if not isinstance(records, RecordColumns):
        return np.arange(len(records), dtype=np.int64)
    keys = records.keys
    if keys is None:
        return np.arange(records.values.item_count, dtype=np.int64)
    if keys.nulls is None:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(keys.nulls).astype(np.int64)


def refusal(partition: str, indexes: Sequence[int] | np.ndarray) -> RecordRefusal:
    """The refusal of a batch to the compacted ``partition`` (``topic-N``) whose records at ``indexes`` have
    no key."""
    found = tuple(int(i) for i in indexes)
    what = ("compaction keeps the latest record of each key; give every record a key, or produce to a "
            "topic whose cleanup.policy is delete")
    records = tuple(f"compacted topic {partition}: record at batch index {i} has no key; {what}"
                    for i in found)
    shown = ", ".join(str(i) for i in found[:_SHOWN_INDEXES])
    if len(found) > _SHOWN_INDEXES:
        shown += ", ..."
    message = (f"compacted topic {partition}: {len(found)} record(s) without a key (batch index {shown}); "
               f"the batch was not appended; {what}")
    return RecordRefusal(found, records, message)
