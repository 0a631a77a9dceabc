"""Small text checkpoint files in Kafka's formats, written atomically, and the leader-epoch cache.

Both formats are Kafka's (``CheckpointFile``): a version line, a count line, then one entry per line::

    leader-epoch-checkpoint              recovery-point-offset-checkpoint (and log-start-offset-checkpoint)
    0                  <- version        0
    2                  <- entries        1
    0 0                <- epoch start    my-topic 3 1048576      <- topic partition offset
    4 1200

Kafka keeps one ``recovery-point-offset-checkpoint`` and one ``log-start-offset-checkpoint`` per log
*directory*, listing every partition; here each partition directory holds its own, with the one line of its
partition, so a log never writes a file another log's writer also writes.  A file is replaced whole and
durably (``storage.atomic_file.write_atomically``).  A malformed file raises
:class:`~storage.errors.CorruptRecordError` naming the file, the line and its content.

The leader-epoch cache (:class:`LeaderEpochCache`) maps each leader epoch to the first offset written in
it; replicas use :meth:`LeaderEpochCache.end_offset_for` (OffsetsForLeaderEpoch) to find where their log
diverges from the leader's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Final, NamedTuple

from storage.atomic_file import write_atomically
from storage.disk_faults import DISK_FAULTS
from storage.errors import CorruptRecordError

__all__ = [
    "CHECKPOINT_VERSION",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
    "read_checkpoint",
    "read_offset_checkpoint",
    "write_checkpoint",
    "write_offset_checkpoint",
]

CHECKPOINT_VERSION: Final = 0
UNDEFINED_EPOCH: Final = -1
UNDEFINED_EPOCH_OFFSET: Final = -1


def write_checkpoint(path: str, lines: Iterable[str]) -> None:
    """Kafka's checkpoint file: version, count, then the lines."""
    body = list(lines)
    if DISK_FAULTS.armed:
        DISK_FAULTS.check("checkpoint.write", path)
    write_atomically(path, "".join(f"{line}\n" for line in [str(CHECKPOINT_VERSION), str(len(body)), *body])
                     .encode())


def read_checkpoint(path: str, fields: int) -> list[list[str]] | None:
    """The entries of a checkpoint file, each split in ``fields`` fields; None if there is no file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()

    def bad(number: int, why: str) -> CorruptRecordError:
        content = lines[number - 1] if 0 < number <= len(lines) else "<end of file>"
        return CorruptRecordError(f"checkpoint file {path}: line {number} ({content!r}): {why}")

    if not lines or lines[0] != str(CHECKPOINT_VERSION):
        raise bad(1, f"expected version {CHECKPOINT_VERSION}")
    if len(lines) < 2 or not lines[1].isdigit():
        raise bad(2, "expected the entry count")
    count = int(lines[1])
    if len(lines) != count + 2:
        raise bad(min(len(lines), count + 2) + 1 if len(lines) < count + 2 else count + 3,
                  f"expected {count} entries, found {len(lines) - 2}")
    entries = []
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split(" ")
        if len(parts) != fields or not all(parts):
            raise bad(number, f"expected {fields} space-separated fields")
        entries.append(parts)
    return entries


def _int(path: str, text: str, what: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise CorruptRecordError(f"checkpoint file {path}: {what} {text!r} is not an integer") from None


def write_offset_checkpoint(path: str, offsets: dict[tuple[str, int], int]) -> None:
    """``topic partition offset`` lines (Kafka's recovery-point / log-start-offset checkpoint)."""
    write_checkpoint(path, (f"{topic} {partition} {offset}"
                            for (topic, partition), offset in offsets.items()))


def read_offset_checkpoint(path: str) -> dict[tuple[str, int], int] | None:
    entries = read_checkpoint(path, 3)
    if entries is None:
        return None
    return {(topic, _int(path, partition, "partition")): _int(path, offset, "offset")
            for topic, partition, offset in entries}


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Leader epoch -> first offset of that epoch, persisted in ``leader-epoch-checkpoint``.

    Entries strictly increase in both epoch and start offset.  Every change is written to the file
    atomically before the method returns.  Owned by the log's single writer; readers use :meth:`load`.
    ``latest_epoch`` is the last entry's epoch (``UNDEFINED_EPOCH`` with none), kept with the entries (the
    log's hot path compares it on every append).
    """

    def __init__(self, path: str, entries: list[EpochEntry] | None = None) -> None:
        self.path = path
        self.entries: list[EpochEntry] = list(entries or [])
        self.latest_epoch = self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    @classmethod
    def load(cls, path: str) -> LeaderEpochCache:
        """Read ``path`` (an absent file is an empty cache); malformed or non-monotonic raises."""
        rows = read_checkpoint(path, 2)
        entries = [EpochEntry(_int(path, e, "epoch"), _int(path, o, "start offset")) for e, o in rows or []]
        for before, after in itertools.pairwise(entries):
            if after.epoch <= before.epoch or after.start_offset < before.start_offset:
                raise CorruptRecordError(
                    f"checkpoint file {path}: entry {after} does not follow {before} (epochs and start "
                    "offsets must increase)"
                )
        return cls(path, entries)

    def _write(self) -> None:
        """After every change of :attr:`entries`: :attr:`latest_epoch` follows them, the file too."""
        self.latest_epoch = self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH
        write_checkpoint(self.path, (f"{e.epoch} {e.start_offset}" for e in self.entries))

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` (Kafka's rule); returns whether it changed.

        Nothing happens for an undefined epoch (< 0) or when ``epoch`` is already the latest with an equal
        or earlier start.  Otherwise entries that conflict (epoch >= ``epoch`` or start >= ``start_offset``)
        are removed first, so the cache stays monotonic.
        """
        if epoch < 0:
            return False
        if self.entries:
            latest = self.entries[-1]
            if latest.epoch == epoch and latest.start_offset <= start_offset:
                return False
        self.entries = [e for e in self.entries if e.epoch < epoch and e.start_offset < start_offset]
        self.entries.append(EpochEntry(epoch, start_offset))
        self._write()
        return True

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch in which ``offset`` was written, or UNDEFINED_EPOCH."""
        found = UNDEFINED_EPOCH
        for entry in self.entries:
            if entry.start_offset > offset:
                break
            found = entry.epoch
        return found

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: ``(epoch found, end offset)`` for a requested ``epoch`` (Kafka's rule).

        * undefined epoch, or one larger than any known: ``(-1, -1)``;
        * the latest epoch: ``(epoch, log_end_offset)``;
        * otherwise the largest known epoch <= ``epoch`` and the start offset of the next known epoch
          (which ends it); an epoch older than all known gives ``(epoch, first entry's start offset)``.
        """
        if epoch == UNDEFINED_EPOCH or not self.entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        higher = next((e for e in self.entries if e.epoch > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = [e for e in self.entries if e.epoch <= epoch]
        if not floor:
            return epoch, higher.start_offset
        return floor[-1].epoch, higher.start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: forget epochs that start at or after it."""
        kept = [e for e in self.entries if e.start_offset < end_offset]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to ``start_offset``: drop epochs wholly below it, clamp the one spanning it."""
        below = [e for e in self.entries if e.start_offset < start_offset]
        if not below:
            return
        above = [e for e in self.entries if e.start_offset >= start_offset]
        if above and above[0].start_offset == start_offset:
            kept = above
        else:
            kept = [EpochEntry(below[-1].epoch, start_offset), *above]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def clear(self) -> None:
        if self.entries:
            self.entries = []
            self._write()
