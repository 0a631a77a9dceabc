"""A leader's rules for the timestamps of the batches it appends: Kafka's ``message.timestamp.*`` settings.

Two rules, one per ``message.timestamp.type``:

* **LogAppendTime**: :func:`stamp_log_append_time` sets the batch's timestamp-type attribute bit (bit 3) and
  its ``maxTimestamp`` to the append time, in place, then recomputes the CRC, which covers both (the CRC
  runs from ``attributes`` to the end of the batch; ``storage.batch_header``).  That is what Kafka's broker
  does to a batch it keeps as it came (``DefaultRecordBatch.setMaxTimestamp``): ``baseTimestamp`` and the
  records' timestamp deltas stay as the producer wrote them, and every reader gives each record of a
  LogAppendTime batch the batch's ``maxTimestamp`` (``storage.batch_reader``).  The time index then holds
  the append time, since it is built from ``maxTimestamp``.  Only a leader stamps: a follower copies the
  stamped bytes as they are.
* **CreateTime**: the producer's timestamps stay, but a record whose timestamp is more than
  ``message.timestamp.before.max.ms`` before the broker's clock or more than
  ``message.timestamp.after.max.ms`` after it makes the whole batch refused (Kafka's INVALID_TIMESTAMP;
  nothing of it is appended); a record without a timestamp (-1) is not checked, as in Kafka.
  :func:`effective_limits` folds in the older ``message.timestamp.difference.max.ms`` as Kafka 3.6
  does: each of before/after left at its default takes the difference's value.
  :func:`timestamp_out_of_range` checks a batch; with both limits at their default (the usual case) it
  reads nothing, otherwise it reads the header and, where the header's first and max timestamps do not
  settle it, every record (decompressing a compressed batch).

**The batch's maxTimestamp is the records'.**  As Kafka's ``LogValidator`` does for every batch a leader
appends (``setMaxTimestamp(CREATE_TIME, the largest record timestamp)``, for compressed batches kept in
place and uncompressed ones alike), a CreateTime batch's header ``maxTimestamp`` is not trusted: the
largest of its records' timestamps (``baseTimestamp`` plus each ``timestampDelta``; -1 when the records
carry none) is computed (:func:`records_max_timestamp`, one pass over the records section, decompressed
when the batch is compressed) and, where the producer's header says otherwise, written over it and the CRC
recomputed (:func:`set_max_timestamp`).  Kafka answers nothing for it: the batch is appended with the
corrected header, so the time index, ListOffsets by time and ``retention.ms`` see the records' real
timestamps.  A batch whose records cannot be read (the CRC is good: a producer's bug), or whose largest
record timestamp lies past the int64 range (Kafka's Java sum would wrap), is refused CORRUPT_MESSAGE,
nothing of it appended.
The partition writer walks the uncompressed CreateTime batches of a whole ring chunk in one call
(:func:`records_max_timestamps`: the same record walk, positions in, one int64 answer per frame out) and
hands each answer to :func:`apply_timestamp_rules`, which then does exactly what it does when it walks the
batch itself.

A producer's batch that arrives with the LogAppendTime bit already set follows Kafka's ``LogValidator``
(:func:`apply_timestamp_rules`).  Kafka reads every record of such a batch as having the batch's
``maxTimestamp`` (``DefaultRecordBatch``'s iterator), so:

1. to a **LogAppendTime** topic, or with ``maxTimestamp`` -1 (no timestamp) to a CreateTime topic, it is
   refused with INVALID_TIMESTAMP ("Producer should not set timestamp type to LogAppendTime"), nothing of it
   appended;
2. to a **CreateTime** topic it is checked against the before/after limits with ``maxTimestamp`` as every
   record's timestamp, then stored as a CreateTime batch whose ``maxTimestamp`` is the largest record
   timestamp Kafka read, which is that same ``maxTimestamp``: the bit is cleared and the CRC recomputed
   (:func:`store_as_create_time`; Kafka's ``setMaxTimestamp(CREATE_TIME, max)``, for compressed batches
   kept in place and uncompressed ones alike).  Its records then read as ``baseTimestamp`` plus their deltas.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import crc32c as _crc32c
import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    BATCH_LENGTH_OFFSET,
    COMPRESSION_CODEC_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
)
from storage.batch_reader import iter_records, records_data
from storage.batch_scan import read_be
from storage.errors import CorruptRecordError
from storage.log_config import LONG_MAX, LogConfig
from storage.varint import read_varint, read_varlong

__all__ = [
    "LOG_APPEND_TIME",
    "NOT_WALKED",
    "TimestampLimits",
    "TimestampRefusal",
    "TimestampVerdict",
    "apply_timestamp_rules",
    "effective_limits",
    "limits_of",
    "records_max_timestamp",
    "records_max_timestamps",
    "set_max_timestamp",
    "stamp_log_append_time",
    "store_as_create_time",
    "timestamp_out_of_range",
]

LOG_APPEND_TIME: Final = "LogAppendTime"
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp: the run from the first stamped field to the last
_STAMP_RUN: Final = struct.Struct(">hiqq").pack_into
_CRC: Final = struct.Struct(">I").pack_into
_ATTRIBUTES: Final = struct.Struct(">h").pack_into
_MAX_TIMESTAMP: Final = struct.Struct(">q").pack_into
NO_TIMESTAMP: Final = -1  # a batch's maxTimestamp when its records carry none
NOT_WALKED: Final = -(1 << 63)  # records_max_timestamps: a frame left to the per-batch path
_INT64_MAX: Final = (1 << 63) - 1
assert (ATTRIBUTES_OFFSET, LAST_OFFSET_DELTA_OFFSET, BASE_TIMESTAMP_OFFSET, MAX_TIMESTAMP_OFFSET) == (
    ATTRIBUTES_OFFSET, ATTRIBUTES_OFFSET + 2, ATTRIBUTES_OFFSET + 6, ATTRIBUTES_OFFSET + 14)
assert ATTRIBUTES_OFFSET > CRC_OFFSET  # both stamped fields lie under the CRC
_ATTRIBUTES_FIELD: Final = BatchHeader._fields.index("attributes")
_DELTA_FIELD: Final = BatchHeader._fields.index("last_offset_delta")
_BASE_TIMESTAMP_FIELD: Final = BatchHeader._fields.index("base_timestamp")
_LENGTH_FIELD: Final = BatchHeader._fields.index("batch_length")


class TimestampLimits(NamedTuple):
    """How far a CreateTime record's timestamp may lie from the broker's clock, in milliseconds."""

    before_max_ms: int
    after_max_ms: int

    @property
    def unlimited(self) -> bool:
        return self.before_max_ms == LONG_MAX and self.after_max_ms == LONG_MAX


def effective_limits(difference_max_ms: int, before_max_ms: int, after_max_ms: int) -> TimestampLimits:
    """The before/after limits Kafka 3.6 applies: each one left at its default (``LONG_MAX``) takes the
    deprecated ``message.timestamp.difference.max.ms``."""
    return TimestampLimits(difference_max_ms if before_max_ms == LONG_MAX else before_max_ms,
                           difference_max_ms if after_max_ms == LONG_MAX else after_max_ms)


def limits_of(config: LogConfig) -> TimestampLimits | None:
    """The limits a leader checks CreateTime batches against, or None: a LogAppendTime log (its leader
    stamps the time) or no limit set."""
    if config.message_timestamp_type == LOG_APPEND_TIME:
        return None
    limits = effective_limits(config.message_timestamp_difference_max_ms,
                              config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms)
    return None if limits.unlimited else limits


def stamp_log_append_time(view: memoryview, position: int, header: BatchHeader, append_time_ms: int) -> None:
    """Make the batch at ``position`` of ``view`` (writable), whose header is ``header``, a LogAppendTime
    batch stamped ``append_time_ms``: the attribute bit and ``maxTimestamp`` (one write of the run from
    ``attributes`` to ``maxTimestamp``, the two fields between them rewritten with their own values), then
    the CRC over attributes..end."""
    _STAMP_RUN(view, position + ATTRIBUTES_OFFSET, header[_ATTRIBUTES_FIELD] | TIMESTAMP_TYPE_MASK,
               header[_DELTA_FIELD], header[_BASE_TIMESTAMP_FIELD], append_time_ms)
    _CRC(view, position + CRC_OFFSET,
         _crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + header[_LENGTH_FIELD] + LOG_OVERHEAD]))


def store_as_create_time(view: memoryview, position: int, header: BatchHeader) -> BatchHeader:
    """Clear the LogAppendTime bit of the batch at ``position`` of ``view`` (writable), whose header is
    ``header``, keeping its ``maxTimestamp``; recompute the CRC.  The batch's header as it now is."""
    attributes = header[_ATTRIBUTES_FIELD] & ~TIMESTAMP_TYPE_MASK
    _ATTRIBUTES(view, position + ATTRIBUTES_OFFSET, attributes)
    crc = _crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + header[_LENGTH_FIELD] + LOG_OVERHEAD])
    _CRC(view, position + CRC_OFFSET, crc)
    return header._replace(attributes=attributes, crc=crc)


def set_max_timestamp(view: memoryview, position: int, header: BatchHeader,
                      max_timestamp: int) -> BatchHeader:
    """Write ``max_timestamp`` as the ``maxTimestamp`` of the batch at ``position`` of ``view`` (writable),
    whose header is ``header``, and recompute the CRC.  The batch's header as it now is."""
    _MAX_TIMESTAMP(view, position + MAX_TIMESTAMP_OFFSET, max_timestamp)
    crc = _crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + header[_LENGTH_FIELD] + LOG_OVERHEAD])
    _CRC(view, position + CRC_OFFSET, crc)
    return header._replace(max_timestamp=max_timestamp, crc=crc)


@numba.njit(cache=True, inline="always")
def _skip_bytes(data: np.ndarray, at: int, limit: int) -> int:
    """Past a nullable length-prefixed field at ``at`` (-1 when it does not fit in ``limit``)."""
    length, after = read_varint(data, at, limit)
    if after < 0 or length < -1 or after + max(length, 0) > limit:
        return -1
    return after + max(length, 0)


@numba.njit(cache=True, nogil=True)
def _max_timestamp_delta(data: np.ndarray, begin: int, end: int, count: int) -> tuple[int, int]:
    """``(where, largest timestampDelta)`` of the ``count`` records of the records section
    ``data[begin:end]``, each read whole as Kafka's ``DefaultRecord.readFrom`` reads it (length,
    attributes, timestampDelta, offsetDelta, key, value, headers, exactly filling the length): ``where`` is
    -1 when they all read, else the byte position in the section of the record that does not."""
    at = begin
    largest = -(1 << 63)
    for _ in range(count):
        length, after = read_varint(data, at, end)
        record_end = after + length
        if after < 0 or length < 2 or record_end > end:
            return at - begin, 0
        delta, p = read_varlong(data, after + 1, record_end)  # after the attributes byte
        if p >= 0:
            _, p = read_varint(data, p, record_end)  # offsetDelta
        if p >= 0:
            p = _skip_bytes(data, p, record_end)  # key
        if p >= 0:
            p = _skip_bytes(data, p, record_end)  # value
        headers = -1
        if p >= 0:
            headers, p = read_varint(data, p, record_end)
        if p < 0 or headers < 0:
            return at - begin, 0
        for _ in range(headers):
            name_length, p = read_varint(data, p, record_end)
            if p < 0 or name_length < 0 or p + name_length > record_end:
                return at - begin, 0
            p = _skip_bytes(data, p + name_length, record_end)
            if p < 0:
                return at - begin, 0
        if p != record_end:
            return at - begin, 0
        largest = max(largest, delta)
        at = record_end
    if at != end:
        return at - begin, 0
    return -1, largest


def records_max_timestamp(view: memoryview, header: BatchHeader, *,
                          where: str = "produced batch") -> int | CorruptRecordError:
    """The largest timestamp of the CreateTime batch in ``view`` (one whole batch, its CRC checked) as Kafka
    computes it over the records (``NO_TIMESTAMP`` when none carries one), or why its records cannot be
    read."""
    if header.records_count <= 0:
        return NO_TIMESTAMP
    if header.compression == 0:
        data = np.frombuffer(view, np.uint8, header.size - HEADER_SIZE, HEADER_SIZE)
    else:
        try:
            data = records_data(view, 0, header, where=where)
        except CorruptRecordError as exc:
            return exc
    stop, delta = _max_timestamp_delta(data, 0, data.size, header.records_count)
    if stop >= 0:
        return _unreadable(header, stop, where)
    largest = header.base_timestamp + delta
    if largest > _INT64_MAX:
        return CorruptRecordError(f"{where}: a record's timestamp (baseTimestamp {header.base_timestamp} "
                                  f"plus timestampDelta {delta}) lies past the int64 range; send records "
                                  "stamped in milliseconds since the epoch")
    return max(NO_TIMESTAMP, largest)


def _unreadable(header: BatchHeader, stop: int, where: str) -> CorruptRecordError:
    return CorruptRecordError(f"{where}: its records section ({header.records_count} records) does not "
                              f"read at byte {stop}")


@numba.njit(cache=True, nogil=True)
def records_max_timestamps(view: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                           out: np.ndarray) -> None:
    """:func:`records_max_timestamp` for every uncompressed CreateTime batch among the frames of one ring
    chunk, in one call: frame ``i`` is ``view[starts[i] : starts[i] + lengths[i]]`` and ``out[i]`` gets

    * the records' largest timestamp (``NO_TIMESTAMP`` or more) for a frame whose bytes read as one whole
      uncompressed batch (magic 2, ``batchLength`` filling the frame) without the LogAppendTime bit;
    * ``-2 - p`` when its records section does not read at byte ``p`` (:func:`_max_timestamp_delta`);
    * ``NOT_WALKED`` for any other frame (compressed, LogAppendTime bit, not one batch, or a largest
      timestamp past the int64 range), which the per-batch path handles.

    It reads header fields straight from the bytes, before the CRC is checked: its answer is used only for
    a frame ``check_batch`` then accepts, whose header is those same bytes."""
    for i in range(starts.size):
        start = starts[i]
        length = lengths[i]
        out[i] = NOT_WALKED
        if length < HEADER_SIZE or view[start + MAGIC_OFFSET] != MAGIC:
            continue
        if read_be(view, start + BATCH_LENGTH_OFFSET, 4) + LOG_OVERHEAD != length:
            continue
        if read_be(view, start + ATTRIBUTES_OFFSET, 2) & (COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK):
            continue
        count = read_be(view, start + RECORDS_COUNT_OFFSET, 4)
        if count <= 0:
            out[i] = NO_TIMESTAMP
            continue
        stop, delta = _max_timestamp_delta(view, start + HEADER_SIZE, start + length, count)
        if stop >= 0:
            out[i] = -2 - stop
            continue
        base = read_be(view, start + BASE_TIMESTAMP_OFFSET, 8)
        if delta > 0 and base > _INT64_MAX - delta:
            continue
        if delta < 0 and base < NOT_WALKED - delta:
            out[i] = NO_TIMESTAMP
        else:
            out[i] = max(NO_TIMESTAMP, base + delta)


class TimestampRefusal(NamedTuple):
    """Why a batch is refused: a record out of range, or (``corrupt``) records that cannot be read
    though the batch's CRC is good (a producer's bug: Kafka's CORRUPT_MESSAGE, not INVALID_TIMESTAMP)."""

    reason: str
    corrupt: bool = False


def timestamp_out_of_range(view: memoryview, header: BatchHeader, now_ms: int,
                           limits: TimestampLimits) -> TimestampRefusal | None:
    """Why the CreateTime batch in ``view`` (one whole batch, its CRC already checked) breaks ``limits``
    at ``now_ms``, or None when every record's timestamp is within them."""
    if limits.unlimited:
        return None
    low = now_ms - limits.before_max_ms
    high = now_ms + limits.after_max_ms
    if header.max_timestamp > high:
        return _describe(header.max_timestamp, "its max timestamp", low, high, limits)
    if header.base_timestamp != NO_TIMESTAMP and header.base_timestamp < low:
        return _describe(header.base_timestamp, "its first record", low, high, limits)
    try:
        for index, record in enumerate(iter_records(view, 0, where="produced batch", verify_crc=False)):
            if record.timestamp != NO_TIMESTAMP and not low <= record.timestamp <= high:
                return _describe(record.timestamp, f"record {index} of the batch", low, high, limits)
    except CorruptRecordError as exc:
        return TimestampRefusal(f"its records cannot be read to check their timestamps: {exc}", corrupt=True)
    return None


def _describe(timestamp: int, which: str, low: int, high: int, limits: TimestampLimits) -> TimestampRefusal:
    return TimestampRefusal(
        f"timestamp {timestamp} of {which} is out of range: with message.timestamp.before.max.ms "
        f"{limits.before_max_ms} and message.timestamp.after.max.ms {limits.after_max_ms} it must lie "
        f"in [{low}, {high}]; send records stamped near the broker's clock, or raise the limits")


class TimestampVerdict(NamedTuple):
    """What :func:`apply_timestamp_rules` made of a batch: its header as it now is, and why it is refused
    (None: append it)."""

    header: BatchHeader
    refusal: TimestampRefusal | None


def apply_timestamp_rules(view: memoryview, header: BatchHeader, now_ms: int, limits: TimestampLimits | None,
                          *, log_append_time: bool, walked: int = NOT_WALKED) -> TimestampVerdict:
    """A leader's timestamp rules for the producer's batch in ``view`` (one whole batch, writable, its CRC
    checked) of a topic whose ``message.timestamp.type`` is LogAppendTime (``log_append_time``) or
    CreateTime with ``limits`` (None: none set): the module's rules, a CreateTime batch's ``maxTimestamp``
    set to its records' and a batch the producer marked LogAppendTime rewritten in place as Kafka stores it.
    The LogAppendTime stamp itself is the log's, at the append.  ``walked`` is this batch's answer from
    :func:`records_max_timestamps`, when the caller walked its chunk (else its records are walked here)."""
    if not header.attributes & TIMESTAMP_TYPE_MASK:
        if log_append_time:
            return TimestampVerdict(header, None)
        largest: int | CorruptRecordError
        if walked == NOT_WALKED:
            largest = records_max_timestamp(view, header)
        else:
            largest = walked if walked >= NO_TIMESTAMP else _unreadable(header, -2 - walked, "produced batch")
        if isinstance(largest, CorruptRecordError):
            return TimestampVerdict(header, TimestampRefusal(
                f"its records cannot be read to take their timestamps: {largest}", corrupt=True))
        if largest != header.max_timestamp:  # Kafka's LogValidator: the records' timestamps, not the header's
            header = set_max_timestamp(view, 0, header, largest)
        if limits is None:
            return TimestampVerdict(header, None)
        return TimestampVerdict(header, timestamp_out_of_range(view, header, now_ms, limits))
    stamped = header.max_timestamp
    if log_append_time or stamped == NO_TIMESTAMP:
        return TimestampVerdict(header, TimestampRefusal(
            f"its timestamp type is LogAppendTime (attribute bit 3) with max timestamp {stamped}: a producer "
            "must not set the LogAppendTime type (Kafka's INVALID_TIMESTAMP); send CreateTime batches, the "
            "broker stamps the append time where the topic's message.timestamp.type is LogAppendTime"))
    if limits is not None:
        low, high = now_ms - limits.before_max_ms, now_ms + limits.after_max_ms
        if not low <= stamped <= high:
            which = "its records (a LogAppendTime batch: each record's is the max timestamp)"
            return TimestampVerdict(header, _describe(stamped, which, low, high, limits))
    return TimestampVerdict(store_as_create_time(view, 0, header), None)
