"""The cleaner's key -> latest offset map: a fixed-size open-addressing hash table in numpy arrays.

Theory of operation
-------------------
Compaction keeps, of every key, the record with the largest offset.  Before it rewrites segments the cleaner
reads the *dirty* section of the log (what no clean has seen yet) and records, for every key there, the
largest offset at which it appears.  Kafka's ``SkimpyOffsetMap`` does it in a fixed buffer of
``log.cleaner.dedupe.buffer.size`` bytes, storing a 16-byte digest of each key (MD5) and an 8-byte offset;
this map does the same:

* **the key digest** is MurmurHash3 x64 128 (:func:`key_hash`), computed in numba over the key's bytes
  where they lie (a mapped segment, or a decompressed records section).  Two keys collide only if all 128
  bits agree (about 2**-64 for a billion keys), and the map compares all 128;
* **the table** is ``slots`` rows of 24 bytes, one ``(slots, 3)`` ``uint64`` array: the two digest words and
  the offset plus one (0 marks an empty slot, so a new table is all zeros and costs no writes); one row is
  one cache access.  ``slots = dedupe_buffer_bytes // 24``, or fewer when the caller knows that fewer keys
  can come (the records of the dirty section): a smaller table is faster to probe and the memory bound still
  holds.  A slot is found by linear probing from ``digest % slots`` (:func:`map_put`, :func:`map_get`:
  numba);
* **the load bound**: at most ``0.9 * slots`` keys go in (Kafka's ``log.cleaner.io.buffer.load.factor``),
  so every probe ends at an empty slot soon.  The caller fills the map batch by batch and stops *before* a
  batch whose records could pass the bound (:attr:`OffsetMap.room`): the map then covers a prefix of the
  dirty section, ending on a batch boundary, and the clean runs in several passes.

Nothing else is allocated per key: the memory is the two arrays, fixed when the map is made.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np

from storage.varint import read_varint, read_varlong

__all__ = [
    "BYTES_PER_ENTRY",
    "DEFAULT_DEDUPE_BUFFER_BYTES",
    "LOAD_FACTOR",
    "MALFORMED_RECORDS",
    "OffsetMap",
    "key_hash",
    "map_get",
    "map_put",
    "put_records",
]

BYTES_PER_ENTRY: Final = 24  # 16-byte key digest + 8-byte offset, as Kafka's SkimpyOffsetMap with MD5
LOAD_FACTOR: Final = 0.9  # Kafka's log.cleaner.io.buffer.load.factor
DEFAULT_DEDUPE_BUFFER_BYTES: Final = 128 * 1024 * 1024  # Kafka's log.cleaner.dedupe.buffer.size
MALFORMED_RECORDS: Final = -1  # put_records: a record's fields do not parse inside the records section
_EMPTY: Final = 0  # table[slot, 2] of an empty slot (it holds offset + 1)
_ONE = np.uint64(1)

_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_F1 = np.uint64(0xFF51AFD7ED558CCD)
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_A1 = np.uint64(0x52DCE729)
_A2 = np.uint64(0x38495AB5)
_FIVE = np.uint64(5)
_S33 = np.uint64(33)


@numba.njit(cache=True, inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(cache=True, inline="always")
def _fmix(k: np.uint64) -> np.uint64:
    k ^= k >> _S33
    k *= _F1
    k ^= k >> _S33
    k *= _F2
    k ^= k >> _S33
    return k


@numba.njit(cache=True, inline="always")
def _word(data: np.ndarray, at: int, count: int) -> np.uint64:
    """``count`` (<= 8) bytes at ``at`` as a little-endian word."""
    value = np.uint64(0)
    for k in range(count - 1, -1, -1):
        value = (value << np.uint64(8)) | np.uint64(data[at + k])
    return value


@numba.njit(cache=True)
def key_hash(data: np.ndarray, start: int, length: int) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64 128 (seed 0) of ``data[start:start + length]``: the two 64-bit halves."""
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    blocks = length // 16
    for b in range(blocks):
        at = start + b * 16
        k1 = _word(data, at, 8) * _C1
        k1 = _rotl(k1, 31) * _C2
        h1 ^= k1
        h1 = (_rotl(h1, 27) + h2) * _FIVE + _A1
        k2 = _word(data, at + 8, 8) * _C2
        k2 = _rotl(k2, 33) * _C1
        h2 ^= k2
        h2 = (_rotl(h2, 31) + h1) * _FIVE + _A2
    tail = start + blocks * 16
    rest = length & 15
    if rest > 8:
        k2 = _word(data, tail + 8, rest - 8) * _C2
        h2 ^= _rotl(k2, 33) * _C1
    if rest > 0:
        k1 = _word(data, tail, min(rest, 8)) * _C1
        h1 ^= _rotl(k1, 31) * _C2
    h1 ^= np.uint64(length)
    h2 ^= np.uint64(length)
    h1 += h2
    h2 += h1
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@numba.njit(cache=True, inline="always")
def map_put(table: np.ndarray, h1: np.uint64, h2: np.uint64, offset: int) -> int:
    """Record ``offset`` for the key whose digest is ``(h1, h2)``: 1 if the key is new, 0 if it was there
    (its offset is then replaced: the dirty section is read in offset order).  The caller keeps the table
    below its load bound, so an empty slot is always found."""
    slots = table.shape[0]
    slot: int = np.int64(h1 % np.uint64(slots))  # type: ignore[assignment]  # numba: an int64, never float
    stored = np.uint64(offset) + _ONE
    while True:
        if table[slot, 2] == _EMPTY:
            table[slot, 0] = h1
            table[slot, 1] = h2
            table[slot, 2] = stored
            return 1
        if table[slot, 0] == h1 and table[slot, 1] == h2:
            table[slot, 2] = stored
            return 0
        slot += 1
        if slot == slots:
            slot = 0


@numba.njit(cache=True, inline="always")
def map_get(table: np.ndarray, h1: np.uint64, h2: np.uint64) -> int:
    """The latest offset recorded for the key whose digest is ``(h1, h2)``, or -1."""
    slots = table.shape[0]
    slot: int = np.int64(h1 % np.uint64(slots))  # type: ignore[assignment]  # numba: an int64, never float
    while True:
        stored = table[slot, 2]
        if stored == _EMPTY:
            return -1
        if table[slot, 0] == h1 and table[slot, 1] == h2:
            return np.int64(stored - _ONE)  # type: ignore[return-value]  # numba: an int64
        slot += 1
        if slot == slots:
            slot = 0


@numba.njit(cache=True)
def put_records(data: np.ndarray, start: int, end: int, count: int, base_offset: int,
                table: np.ndarray) -> int:
    """Put the key of each of the ``count`` records in ``data[start:end]`` (a batch's records section) with
    its offset; returns the number of new keys, or :data:`MALFORMED_RECORDS`.  Records without a key are
    skipped (the clean drops them)."""
    new = 0
    at = start
    for _ in range(count):
        length, after = read_varint(data, at, end)
        if after < 0 or length <= 0 or after + length > end:
            return MALFORMED_RECORDS
        record_end = after + length
        _, p = read_varlong(data, after + 1, record_end)  # after the attributes byte: timestampDelta
        if p < 0:
            return MALFORMED_RECORDS
        offset_delta, p = read_varint(data, p, record_end)
        if p < 0:
            return MALFORMED_RECORDS
        key_length, p = read_varint(data, p, record_end)
        if p < 0 or key_length < -1 or p + key_length > record_end:
            return MALFORMED_RECORDS
        if key_length >= 0:
            h1, h2 = key_hash(data, p, key_length)
            new += map_put(table, h1, h2, base_offset + offset_delta)
        at = record_end
    if at != end:
        return MALFORMED_RECORDS
    return new


class OffsetMap:
    """The table (see the module docstring), ``(slots, 3)`` uint64.

    ``size`` counts the keys in it; the map covers ``[start_offset, end_offset)``.  ``max_keys``: at most
    that many keys will be put (the table is then smaller than the buffer allows).
    """

    def __init__(self, dedupe_buffer_bytes: int, *, max_keys: int | None = None) -> None:
        slots = dedupe_buffer_bytes // BYTES_PER_ENTRY
        if slots < 2:
            raise ValueError(f"log.cleaner.dedupe.buffer.size {dedupe_buffer_bytes} holds no key "
                             f"({BYTES_PER_ENTRY} bytes per key)")
        if max_keys is not None:
            slots = min(slots, max(2, int(max_keys / LOAD_FACTOR) + 2))
        self.table = np.zeros((slots, 3), dtype=np.uint64)
        self.capacity = max(1, int(slots * LOAD_FACTOR))
        self.size = 0
        self.start_offset = -1
        self.end_offset = -1

    @property
    def slots(self) -> int:
        return int(self.table.shape[0])

    @property
    def memory_bytes(self) -> int:
        return int(self.table.nbytes)

    @property
    def room(self) -> int:
        """Keys that may still go in."""
        return self.capacity - self.size

    def clear(self, start_offset: int) -> None:
        """Empty the map for a pass that starts at ``start_offset``."""
        if self.size:
            self.table.fill(_EMPTY)
        self.size = 0
        self.start_offset = self.end_offset = start_offset

    def latest_offset(self, key: bytes) -> int:
        """The latest offset recorded for ``key``, or -1 (tests, tools; the clean looks up in numba)."""
        data = np.frombuffer(key, dtype=np.uint8)
        h1, h2 = key_hash(data, 0, len(key))
        return int(map_get(self.table, h1, h2))
