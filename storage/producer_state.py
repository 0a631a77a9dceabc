"""Idempotent-producer state of one partition log: so that a batch sent again is appended only once.

Theory of operation
-------------------
An idempotent producer stamps every batch with ``(producerId, producerEpoch, baseSequence)``.  Sequences
count records per (producer, partition) from 0, wrap from 2**31-1 back to 0, and a batch covers
``baseSequence .. baseSequence + lastOffsetDelta`` (mod 2**31).  A producer keeps at most five batches in
flight per partition, so the broker remembers the last five batches it appended for each producer (their
sequence range, the offsets it assigned and their max timestamp).  For every batch a client hands in,
:meth:`check` returns one of these verdicts.  The rules follow Kafka's ``ProducerAppendInfo`` for client
appends, release 2.5 and later:

1. No producer id (``producerId < 0``): append.  No state is kept.
2. Producer id set but ``baseSequence < 0`` or ``producerEpoch < 0``: ``INVALID_RECORD`` (87).  (Kafka's
   validator refuses the sequence case.  Refusing a negative epoch as well is our addition: without it an
   epoch of -1 would pass every check as if the producer were unknown, for ever.)
3. The same epoch as the one we hold, and the same first *and* last sequence as one of the last five batches:
   a duplicate.  Nothing is appended.  The verdict carries the offsets assigned the first time, and the
   writer acknowledges with error 0 and those offsets, as Kafka does.
4. A lower epoch: ``INVALID_PRODUCER_EPOCH`` (47).  This is a zombie that an epoch bump has fenced off.
5. A higher epoch: the producer restarted its numbering, so the first sequence must be 0, otherwise
   ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (45).  Once appended, the new epoch replaces the old one and the
   remembered batches are forgotten.
6. The same epoch: the first sequence must be the last sequence + 1 (mod 2**31), otherwise
   ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (45).  That covers gaps, overlaps and retries of batches older than the
   last five (the producer should never send those).
7. Unknown producer (we hold no state for it: it never wrote here, or it expired): **accepted at any
   sequence**.  Since Kafka 2.5 (KIP-360) this is what brokers do, so that a producer whose state was removed
   by retention or by ``producer.id.expiration.ms`` keeps working.  Before 2.5 a sequence other than 0 got
   ``UNKNOWN_PRODUCER_ID`` (59), and clients reacted by resetting their sequence numbers and sending their
   buffer again.  Pass ``strict_unknown_producer=True`` to get that older behaviour.

Control batches (transaction markers) are refused with ``INVALID_RECORD`` (87), as Kafka refuses them from
clients.  Transactional batches are refused with ``INVALID_TXN_STATE`` (48), because this appliance has no
transaction coordinator.  :meth:`check` changes nothing.  :meth:`update` records an appended batch.

Drains of several batches
-------------------------
One ``writev`` can append several batches, some of them from the same producer.  The writer runs
``check`` and then ``update`` on each batch in order, *before* the write, so that each verdict sees the
batches ahead of it in the same drain.  A duplicate in that drain (a producer's retry that follows its own
original) is recognised this way too.  If the write then fails, or is only partly done, the state is ahead of
the log.  The writer repairs the log, which truncates it to its last valid batch, and then calls
:meth:`ProducerStateManager.truncate_to` with the new log end offset, which reloads the state from the latest
snapshot and the log.  There is no undo journal on the hot path.

Recovery and snapshots
----------------------
The state can be derived entirely from the log.  Every batch header carries its producer fields, so
:meth:`replay` (and :meth:`rebuild_from`, which starts from empty) rebuilds the state by reading headers only.
So that recovery reads only the tail of the log, :meth:`write_snapshot` stores the whole state as
``<20-digit offset>.snapshot`` in the partition directory, as Kafka does.  The offset is the log end offset
the state describes: every batch below it is included, none above it.  The writer should take one at each
segment roll (at the new segment's base offset) and at clean shutdown.  Only the two newest files are
kept.  Unlike Kafka's snapshot, ours keeps all five remembered batches of each producer, not only the last
one, so a retry after a restart is still recognised as a duplicate.

Snapshots can be thrown away.  A file that is corrupt, truncated or from another version is deleted (and a
warning logged), and the next older one is tried.  If no usable file remains, the state is rebuilt from the
start of the log.  A snapshot above the recovered log end offset describes batches the log no longer holds,
and is deleted too.

Producer expiry: :meth:`expire` forgets producers that have not appended for ``producer.id.expiration.ms``
(Kafka's default is 86400000 ms, one day).  After that they count as unknown (rule 7).  The time of a batch
replayed from the log is the ``append_time_ms`` the caller passes, normally the time of recovery, and not the
batch's own timestamp.  A client may stamp its batches with an old timestamp, and a batch that looked old
would otherwise expire its producer as soon as the log recovered, just when its retries arrive.

Producer ids come from the broker's ``storage.producer_ids.ProducerIdBlockAllocator``.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import crc32c as _crc32c

from storage.atomic_file import TMP_SUFFIX, write_atomically
from storage.batch_header import CONTROL_FLAG_MASK, NO_SEQUENCE, TRANSACTIONAL_FLAG_MASK, BatchHeader
from storage.disk_faults import DISK_FAULTS
from storage.errors import ApplianceError, ConfigError

__all__ = [
    "APPEND",
    "BATCHES_RETAINED",
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "DUPLICATE_SEQUENCE_NUMBER",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_RECORD",
    "INVALID_TXN_STATE",
    "NONE",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "SNAPSHOTS_RETAINED",
    "SNAPSHOT_BATCH",
    "SNAPSHOT_HEADER",
    "SNAPSHOT_PRODUCER",
    "UNKNOWN_PRODUCER_ID",
    "BatchMetadata",
    "ProducerEntry",
    "ProducerStateManager",
    "Verdict",
    "delete_snapshots_above",
    "list_snapshots",
    "snapshot_path",
]

_log = logging.getLogger(__name__)

# Kafka error codes (org.apache.kafka.common.protocol.Errors) a verdict can carry.
NONE = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46  # never sent to a client: a duplicate is acknowledged with NONE
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87

BATCHES_RETAINED = 5  # Kafka's NUM_BATCHES_TO_RETAIN, = max.in.flight.requests.per.connection for idempotence
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
SNAPSHOTS_RETAINED = 2
_SEQUENCE_MASK = 0x7FFFFFFF  # sequences are non-negative int32 and wrap from 2**31-1 to 0


class Verdict(NamedTuple):
    """What to do with one batch.  ``code`` is a Kafka error code.

    * ``NONE``: append the batch, then call :meth:`ProducerStateManager.update`.
    * ``DUPLICATE_SEQUENCE_NUMBER``: append nothing.  Acknowledge with error 0, ``base_offset`` (and
      ``max_timestamp_ms`` as the log append time), which are what the original append was given.
    * anything else: append nothing, and send that error code to the producer.
    """

    code: int
    base_offset: int = -1
    last_offset: int = -1
    max_timestamp_ms: int = -1

    @property
    def is_append(self) -> bool:
        return self.code == NONE

    @property
    def is_duplicate(self) -> bool:
        return self.code == DUPLICATE_SEQUENCE_NUMBER


APPEND = Verdict(NONE)
_OUT_OF_ORDER = Verdict(OUT_OF_ORDER_SEQUENCE_NUMBER)
_INVALID_EPOCH = Verdict(INVALID_PRODUCER_EPOCH)
_INVALID_TXN_STATE = Verdict(INVALID_TXN_STATE)
_UNKNOWN_PRODUCER = Verdict(UNKNOWN_PRODUCER_ID)
_INVALID_RECORD = Verdict(INVALID_RECORD)


class BatchMetadata(NamedTuple):
    """One appended batch of a producer, as far as deduplication needs it."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    max_timestamp_ms: int


@dataclass(slots=True)
class ProducerEntry:
    """What the partition knows of one producer."""

    epoch: int
    batches: deque[BatchMetadata]  # the last BATCHES_RETAINED appended in this epoch, oldest first
    last_timestamp_ms: int  # the time of its last append (for expiry)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.epoch, deque(self.batches, maxlen=BATCHES_RETAINED), self.last_timestamp_ms)


# ------------------------------------------------------------------------------------------------------------
# Snapshot file layout, declared once.  Big-endian, like everything Kafka writes.
#
#  <20-digit offset>.snapshot
#     0                   1                   2                   3
#     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#    +---------------------------------------------------------------+
#    |                   magic "APSS"                    @0          |  tells a snapshot from garbage
#    +-------------------------------+-------------------------------+
#    |     version (uint16) @4       |     reserved (uint16) @6      |  read before trusting the rest
#    +-------------------------------+-------------------------------+
#    |                   crc32c (uint32)                 @8          |  over bytes 12..end
#    +---------------------------------------------------------------+
#    |                   producer count (uint32)         @12         |
#    +---------------------------------------------------------------+
#    |                   snapshot offset (int64)         @16         |  = the offset in the file name
#    |                                                               |
#    +---------------------------------------------------------------+
#    |   producer entries ...                            @24         |
#
#  producer entry (24 bytes), followed by its `batch count` batch entries:
#    |                   producer id (int64)             @0          |
#    |                   last timestamp ms (int64)       @8          |
#    |  epoch (int16) @16            |  batch count (uint16) @18     |  0..5
#    |                   reserved (uint32)               @20         |
#
#  batch entry (32 bytes), oldest first:
#    |                   base offset (int64)             @0          |
#    |                   max timestamp ms (int64)        @8          |
#    |                   first sequence (int32)          @16         |
#    |                   last sequence (int32)           @20         |
#    |                   last offset delta (int32)       @24         |  last offset = base offset + delta
#    |                   reserved (uint32)               @28         |
#
# A snapshot is valid iff (1) it is at least a header long, (2) the magic matches, (3) the version matches and
# the header's reserved field (outside the CRC) is 0, (4) the stored CRC equals CRC-32C over bytes 12..end,
# (5) the snapshot offset equals the file name's, (6) the entries fill the file exactly (<= 5 batches each),
# and (7) ids, epochs, sequences and offsets are in range (offsets below the snapshot offset, no producer
# twice).  Anything else is ignored: a snapshot can always be rebuilt from the log.
SNAPSHOT_HEADER = struct.Struct(">4sHHIIq")
SNAPSHOT_PRODUCER = struct.Struct(">qqhHI")
SNAPSHOT_BATCH = struct.Struct(">qqiiiI")
_SNAPSHOT_MAGIC = b"APSS"
_SNAPSHOT_VERSION = 1
_SNAPSHOT_CRC_START = 12  # the CRC covers the count, the offset and the entries
assert (SNAPSHOT_HEADER.size, SNAPSHOT_PRODUCER.size, SNAPSHOT_BATCH.size) == (24, 24, 32)
_SNAPSHOT_NAME = re.compile(r"^(\d{20})\.snapshot$")
_SNAPSHOT_SUFFIX = ".snapshot"


def snapshot_path(directory: str | os.PathLike[str], offset: int) -> Path:
    """``<directory>/<offset as 20 digits>.snapshot``."""
    return Path(directory) / f"{offset:020d}{_SNAPSHOT_SUFFIX}"


def list_snapshots(directory: str | os.PathLike[str]) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending.  Temporary leftovers are not listed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_SNAPSHOT_NAME.match, names) if m is not None)


def delete_snapshots_above(directory: str | os.PathLike[str], offset: int) -> list[int]:
    """Delete the snapshots with an offset above ``offset`` (the log was truncated there); return them."""
    doomed = [o for o in list_snapshots(directory) if o > offset]
    for o in doomed:
        _unlink_quietly(snapshot_path(directory, o))
    return doomed


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class ProducerStateManager:
    """The idempotent-producer state of one partition, keyed by producer id.

    ``partition`` only names the partition in messages.  ``producer_id_expiration_ms`` is Kafka's
    ``producer.id.expiration.ms``.  ``strict_unknown_producer`` chooses the pre-2.5 answer, error 59, for an
    unknown producer whose first sequence is not 0 (see the module's rule 7).  Not thread-safe: it belongs
    to the one partition writer (one log, one writer).
    """

    def __init__(
        self,
        partition: str = "?",
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        strict_unknown_producer: bool = False,
    ) -> None:
        if producer_id_expiration_ms <= 0:
            raise ConfigError(
                f"{partition}: producer.id.expiration.ms must be positive, got {producer_id_expiration_ms}"
            )
        self.partition = partition
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.strict_unknown_producer = strict_unknown_producer
        self._entries: dict[int, ProducerEntry] = {}

    # -- the hot path ---------------------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> Verdict:
        """Decide what to do with a batch a client sent.  Changes nothing.  See the module's rules 1-7."""
        attributes = header.attributes
        if attributes & CONTROL_FLAG_MASK:
            return _INVALID_RECORD
        if attributes & TRANSACTIONAL_FLAG_MASK:
            return _INVALID_TXN_STATE
        producer_id = header.producer_id
        if producer_id < 0:
            return APPEND
        epoch = header.producer_epoch
        first_seq = header.base_sequence
        if epoch < 0 or first_seq < 0:
            return _INVALID_RECORD
        entry = self._entries.get(producer_id)
        if entry is None:
            if first_seq != 0 and self.strict_unknown_producer:
                return _UNKNOWN_PRODUCER
            return APPEND
        if epoch == entry.epoch:
            batches = entry.batches
            last_seq = (first_seq + header.last_offset_delta) & _SEQUENCE_MASK
            for batch in batches:
                if batch.first_seq == first_seq and batch.last_seq == last_seq:
                    return Verdict(
                        DUPLICATE_SEQUENCE_NUMBER,
                        batch.base_offset,
                        batch.last_offset,
                        batch.max_timestamp_ms,
                    )
            expected = (batches[-1].last_seq + 1) & _SEQUENCE_MASK if batches else 0
            return APPEND if first_seq == expected else _OUT_OF_ORDER
        if epoch < entry.epoch:
            return _INVALID_EPOCH
        return APPEND if first_seq == 0 else _OUT_OF_ORDER

    def update(self, header: BatchHeader, assigned_base_offset: int, append_time_ms: int) -> None:
        """Record a batch appended at ``assigned_base_offset``.  Do not validate it.

        Call this for every batch appended, in log order, with the header as written (its own
        ``base_offset`` is ignored).  Batches without a producer id, control batches and batches without
        a sequence leave no state.
        """
        producer_id = header.producer_id
        first_seq = header.base_sequence
        epoch = header.producer_epoch
        if producer_id < 0 or first_seq < 0 or epoch < 0 or header.attributes & CONTROL_FLAG_MASK:
            return
        delta = header.last_offset_delta
        batch = BatchMetadata(
            first_seq,
            (first_seq + delta) & _SEQUENCE_MASK,
            assigned_base_offset,
            assigned_base_offset + delta,
            header.max_timestamp,
        )
        entry = self._entries.get(producer_id)
        if entry is None:
            self._entries[producer_id] = ProducerEntry(
                epoch, deque((batch,), maxlen=BATCHES_RETAINED), append_time_ms
            )
            return
        if epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        entry.batches.append(batch)  # the deque's maxlen drops the oldest
        if append_time_ms > entry.last_timestamp_ms:
            entry.last_timestamp_ms = append_time_ms

    # -- inspection ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        """A copy of what is known of ``producer_id``, or ``None``."""
        entry = self._entries.get(producer_id)
        return None if entry is None else entry.copy()

    def producers(self) -> dict[int, ProducerEntry]:
        """A copy of the whole state (for tests, metrics and comparisons)."""
        return {pid: entry.copy() for pid, entry in self._entries.items()}

    def describe(self, header: BatchHeader, verdict: Verdict) -> str:
        """One line for a log or an error message: the producer, what it sent and what was expected."""
        sent = (
            f"producer {header.producer_id} epoch {header.producer_epoch} sequences "
            f"{header.base_sequence}..{header.last_sequence}"
        )
        entry = self._entries.get(header.producer_id)
        if entry is None:
            known = "no state for this producer"
        else:
            expected = (entry.last_seq + 1) & _SEQUENCE_MASK if entry.batches else 0
            known = f"known epoch {entry.epoch}, next sequence {expected}"
        if verdict.code == DUPLICATE_SEQUENCE_NUMBER:
            outcome = f"duplicate of the batch at offsets {verdict.base_offset}..{verdict.last_offset}"
        else:
            outcome = f"error {verdict.code}"
        return f"{self.partition}: {sent}: {outcome} ({known})"

    # -- recovery ------------------------------------------------------------------------------------------

    def clear(self) -> None:
        self._entries.clear()

    def replay(self, headers: Iterable[BatchHeader], *, append_time_ms: int) -> int:
        """Apply batches read from the log (stamped with their offsets), in order, on top of the state.

        Nothing is validated: the log is the truth.  Each batch counts as appended at ``append_time_ms``
        (normally the time of recovery).  Returns the number of batches read.
        """
        update = self.update
        count = 0
        for header in headers:
            update(header, header.base_offset, append_time_ms)
            count += 1
        return count

    def rebuild_from(self, headers: Iterable[BatchHeader], *, append_time_ms: int) -> int:
        """Forget everything, then :meth:`replay` ``headers`` (the whole log, from its start)."""
        self._entries.clear()
        return self.replay(headers, append_time_ms=append_time_ms)

    def recover(
        self,
        snapshot_dir: str | os.PathLike[str] | None,
        *,
        log_end_offset: int,
        headers_from: Callable[[int], Iterable[BatchHeader]],
        append_time_ms: int,
    ) -> int:
        """Load the state for a log whose end is ``log_end_offset``: the latest usable snapshot + the tail.

        ``headers_from(offset)`` must yield, in order, the headers of the log's batches from the one at
        ``offset`` onwards (from the log start if ``offset`` is below it).  Batches that end at or above
        ``log_end_offset`` are not applied.  Snapshots above ``log_end_offset`` are deleted.  Returns the
        offset replay started from.
        """
        start = 0
        if snapshot_dir is None:
            self._entries.clear()
        else:
            loaded = self.load_latest_snapshot(snapshot_dir, log_end_offset=log_end_offset)
            start = 0 if loaded is None else loaded
        update = self.update
        for header in headers_from(start):
            if header.base_offset + header.last_offset_delta >= log_end_offset:
                break
            update(header, header.base_offset, append_time_ms)
        return start

    def truncate_to(
        self,
        offset: int,
        snapshot_dir: str | os.PathLike[str] | None,
        *,
        headers_from: Callable[[int], Iterable[BatchHeader]],
        append_time_ms: int,
    ) -> None:
        """Forget every batch at or above ``offset``, after the log was truncated there (or a write failed).

        Deletes the snapshots above ``offset`` and reloads the rest, like :meth:`recover`.  The batches
        a producer sent before its last five cannot be recovered from memory alone.
        """
        if snapshot_dir is not None:
            delete_snapshots_above(snapshot_dir, offset)
        self.recover(
            snapshot_dir, log_end_offset=offset, headers_from=headers_from, append_time_ms=append_time_ms
        )

    def expire(self, now_ms: int) -> list[int]:
        """Forget producers idle for at least ``producer_id_expiration_ms``; return their ids."""
        horizon_ms = now_ms - self.producer_id_expiration_ms
        expired = [pid for pid, entry in self._entries.items() if entry.last_timestamp_ms <= horizon_ms]
        for pid in expired:
            del self._entries[pid]
        return expired

    # -- snapshots -----------------------------------------------------------------------------------------

    def snapshot_bytes(self, offset: int) -> bytes:
        """The state as a snapshot file's contents for ``offset`` (see the layout above).

        Raises :class:`ApplianceError` if the state holds a batch at or above ``offset``: such a snapshot
        would not describe the log below ``offset`` (a caller's mistake; loading would reject the file).
        """
        parts = [bytes(SNAPSHOT_HEADER.size)]
        pack_producer = SNAPSHOT_PRODUCER.pack
        pack_batch = SNAPSHOT_BATCH.pack
        for pid, entry in self._entries.items():
            if entry.batches and entry.batches[-1].last_offset >= offset:
                raise ApplianceError(
                    f"{self.partition}: snapshot at offset {offset} requested, but producer {pid} has a "
                    f"batch at offsets {entry.batches[-1].base_offset}..{entry.batches[-1].last_offset}"
                )
            parts.append(pack_producer(pid, entry.last_timestamp_ms, entry.epoch, len(entry.batches), 0))
            for b in entry.batches:
                parts.append(
                    pack_batch(
                        b.base_offset,
                        b.max_timestamp_ms,
                        b.first_seq,
                        b.last_seq,
                        b.last_offset - b.base_offset,
                        0,
                    )
                )
        data = bytearray().join(parts)
        SNAPSHOT_HEADER.pack_into(
            data, 0, _SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, 0, 0, len(self._entries), offset
        )
        crc = _crc32c.crc32c(memoryview(data)[_SNAPSHOT_CRC_START:])
        struct.pack_into(">I", data, 8, crc)
        return bytes(data)

    def write_snapshot(self, directory: str | os.PathLike[str], offset: int, *, durable: bool = True) -> Path:
        """Store the state as it is at log end offset ``offset``; keep the newest two snapshots.

        ``durable=False`` does not wait for the disk (``storage.atomic_file``): a power cut may then lose or
        tear this snapshot, which loading detects (CRC) and answers with an older one or the log."""
        directory = Path(directory)
        path = snapshot_path(directory, offset)
        if DISK_FAULTS.armed:
            DISK_FAULTS.check("snapshot.write", str(path))
        write_atomically(path, self.snapshot_bytes(offset), durable=durable)
        for old in list_snapshots(directory)[:-SNAPSHOTS_RETAINED]:
            _unlink_quietly(snapshot_path(directory, old))
        return path

    def load_latest_snapshot(
        self, directory: str | os.PathLike[str], *, log_end_offset: int | None = None
    ) -> int | None:
        """Replace the state with the newest usable snapshot in ``directory``; return its offset, or None.

        Snapshots above ``log_end_offset`` (the recovered log's end, when given) and unusable ones are
        deleted.  With ``None`` returned the state is empty: rebuild it from the start of the log.
        """
        directory = Path(directory)
        self._entries.clear()
        if not directory.is_dir():
            return None
        for name in os.listdir(directory):
            if name.endswith(_SNAPSHOT_SUFFIX + TMP_SUFFIX):
                _unlink_quietly(directory / name)  # a crash during write_snapshot
        for offset in reversed(list_snapshots(directory)):
            path = snapshot_path(directory, offset)
            if log_end_offset is not None and offset > log_end_offset:
                _log.warning(
                    "%s: %s is above the log end offset %d: deleted", self.partition, path, log_end_offset
                )
                _unlink_quietly(path)
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            entries_or_reason = _parse_snapshot(data, offset)
            if isinstance(entries_or_reason, str):
                _log.warning("%s: %s ignored and deleted: %s", self.partition, path, entries_or_reason)
                _unlink_quietly(path)
                continue
            self._entries = entries_or_reason
            return offset
        return None


def _parse_snapshot(data: bytes, offset: int) -> dict[int, ProducerEntry] | str:
    """The entries of a snapshot, or the reason it is unusable (validity rules (1)-(7) above)."""
    size = len(data)
    if size < SNAPSHOT_HEADER.size:
        return f"{size} bytes, need at least {SNAPSHOT_HEADER.size}"
    magic, version, reserved, stored_crc, count, stored_offset = SNAPSHOT_HEADER.unpack_from(data, 0)
    if magic != _SNAPSHOT_MAGIC:
        return f"magic {magic!r}, expected {_SNAPSHOT_MAGIC!r}"
    if version != _SNAPSHOT_VERSION or reserved != 0:
        return f"version {version} (reserved {reserved}), expected {_SNAPSHOT_VERSION} (reserved 0)"
    computed_crc = _crc32c.crc32c(memoryview(data)[_SNAPSHOT_CRC_START:])
    if computed_crc != stored_crc:
        return f"stored CRC {stored_crc:#010x}, computed {computed_crc:#010x}"
    if stored_offset != offset:
        return f"holds offset {stored_offset}, its name says {offset}"
    entries: dict[int, ProducerEntry] = {}
    position = SNAPSHOT_HEADER.size
    for _ in range(count):
        if position + SNAPSHOT_PRODUCER.size > size:
            return f"producer entry at position {position} runs past the end ({size} bytes)"
        pid, last_timestamp_ms, epoch, batch_count, _reserved = SNAPSHOT_PRODUCER.unpack_from(data, position)
        position += SNAPSHOT_PRODUCER.size
        if pid < 0 or epoch < 0 or batch_count > BATCHES_RETAINED or pid in entries:
            return (
                f"producer entry {pid} epoch {epoch} with {batch_count} batches is out of range or repeated"
            )
        if position + batch_count * SNAPSHOT_BATCH.size > size:
            return f"batches of producer {pid} at position {position} run past the end ({size} bytes)"
        batches: deque[BatchMetadata] = deque(maxlen=BATCHES_RETAINED)
        for _ in range(batch_count):
            base, max_ts, first_seq, last_seq, delta, _reserved = SNAPSHOT_BATCH.unpack_from(data, position)
            position += SNAPSHOT_BATCH.size
            if not (0 <= base and 0 <= delta and base + delta < offset and first_seq >= 0 and last_seq >= 0):
                return f"batch of producer {pid} at offset {base} (+{delta}) is out of range"
            batches.append(BatchMetadata(first_seq, last_seq, base, base + delta, max_ts))
        entries[pid] = ProducerEntry(epoch, batches, last_timestamp_ms)
    if position != size:
        return f"{size - position} trailing bytes after {count} producers"
    return entries
