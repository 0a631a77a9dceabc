"""What a Produce's partition batch must be before the broker hands it to the partition's writer.

Kafka's broker checks, before an append: the records are exactly one RecordBatch v2 (Produce v3+ allows no
more, and magic 0/1 is refused) whose magic, length and CRC are right (``storage.batch_header``); it is not
larger than the topic's ``max.message.bytes``; it is not transactional (transactions are not implemented
here); to a compacted topic every record has a key, else INVALID_RECORD with Produce v8's ``record_errors``
naming the keyless records' batch indexes (``storage.record_checks``).  :func:`check_batch` applies them in
that order and answers the first failure; the partition's existence and ``acks``/ISR rules stay with the
caller (``appliance.broker.produce``).
"""

from __future__ import annotations

from typing import NamedTuple

from ipc.kafka import BatchIndexAndErrorMessage, ErrorCode
from storage.batch_header import (
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    validate_batch,
)
from storage.errors import CorruptRecordError
from storage.record_checks import keyless_records, refusal, requires_keys

__all__ = ["BatchCheck", "check_batch"]


class BatchCheck(NamedTuple):
    """The outcome: NONE with the batch's header, or the error, its message and any per-record errors."""

    code: ErrorCode
    message: str | None = None
    header: BatchHeader | None = None
    record_errors: list[BatchIndexAndErrorMessage] | None = None


def check_batch(records: memoryview, topic: str, index: int, *, max_message_bytes: int,
                cleanup_policy: tuple[str, ...]) -> BatchCheck:
    """Check one partition's records of a Produce (module docstring)."""
    if len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] != MAGIC:
        return BatchCheck(ErrorCode.INVALID_RECORD, f"record batch magic {records[MAGIC_OFFSET]}: only v2 is "
                                                    "accepted")
    where = f"produce to {topic}-{index}"
    try:
        header = validate_batch(records, 0, where=where)
    except CorruptRecordError as e:
        return BatchCheck(ErrorCode.CORRUPT_MESSAGE, str(e))
    size = header.batch_length + LOG_OVERHEAD
    if size != len(records):
        return BatchCheck(ErrorCode.INVALID_RECORD, f"{where}: {len(records)} bytes of records, the "
                          f"first batch has {size}: a Produce request carries exactly one record batch per "
                          "partition")
    if size > max_message_bytes:
        return BatchCheck(ErrorCode.MESSAGE_TOO_LARGE,
                          f"{where}: batch of {size} bytes, max.message.bytes is {max_message_bytes}")
    if header.attributes & TRANSACTIONAL_FLAG_MASK:
        return BatchCheck(ErrorCode.INVALID_RECORD, f"{where}: transactional batches are not supported")
    if requires_keys(cleanup_policy):
        try:
            keyless = keyless_records(records, where=where)
        except CorruptRecordError as e:
            return BatchCheck(ErrorCode.CORRUPT_MESSAGE, str(e))
        if keyless.size:
            refused = refusal(f"{topic}-{index}", keyless)
            pairs = zip(refused.indexes, refused.record_messages, strict=True)
            return BatchCheck(ErrorCode.INVALID_RECORD, refused.message,
                              record_errors=[BatchIndexAndErrorMessage(i, m) for i, m in pairs])
    return BatchCheck(ErrorCode.NONE, header=header)
