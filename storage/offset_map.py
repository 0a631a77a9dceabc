"""The cleaner's key -> latest offset map: an open-addressing hash table of digests and offsets, in numpy.

Theory of operation
-------------------
Compaction keeps, of every key, the record with the largest offset.  Before it rewrites segments the cleaner
reads the *dirty* section of the log (what no clean has seen yet) and records, for every key there, the
largest offset at which it appears.  Kafka's ``SkimpyOffsetMap`` does it in a fixed buffer of
``log.cleaner.dedupe.buffer.size`` bytes, an open-addressing table whose slots hold a 16-byte digest of a key
(MD5) and an 8-byte offset; this map has the same layout:

* **the key digest** is MurmurHash3 x64 128 (:func:`key_hash`), computed in numba over the key's bytes
  where they lie (a mapped segment, or a decompressed records section), eight bytes a load (the map
  kernel hashes from the key's address, :func:`hash_at`, not the array: numba would count a reference to
  the array at each call of an inlined function with a loop, an atomic instruction slower than the hash).
  Two keys collide only if all 128 bits agree (about 2**-64 for a billion keys), and the map compares all
  128;
* **the table** is ``slots`` slots of three ``uint64`` words, one after the other in a flat array: the
  digest's two halves and the key's latest offset plus one (0: the slot is empty).  A key's home slot is
  the digest's top 32 bits scaled to the table (``(h1 >> 32) * slots >> 32``), and a key is found by linear
  probing from there (:func:`map_put`, :func:`map_find`: numba), so a lookup reads one slot (24 bytes,
  rarely two cache lines) and compares the whole digest there.  The map pass hashes a run of records first,
  asking the CPU for each key's slot (``storage.prefetch``), and then puts them: a slot is a cache miss,
  and this way the misses of a run overlap instead of following one another.  :func:`put_batches` checks
  each batch's CRC just before it reads the batch's records, so the bytes come from memory once;
* **growth**: the table starts small and doubles when half full (:meth:`OffsetMap.grow`), each key moved
  to the bigger table; the last step goes from a quarter of ``max_slots`` to ``max_slots``, the slots that
  hold ``capacity`` keys at load 0.9 (Kafka's ``log.cleaner.io.buffer.load.factor``).  A table about twice
  the keys stays in the CPU's caches;
* **the latest-offset bitmap**: after the map pass, one walk of the table sets, in a bitmap over the
  pass's offsets (bit ``o - start_offset`` for offset ``o``; :func:`mark_latest`), the bit of every key's
  latest offset.  Every keyed record of ``[start_offset, end_offset)`` was read by the map pass, so its
  key's latest offset is its own or a later one: the record is its key's latest iff its bit is set, and the
  clean decides it with a bit test (:func:`is_latest`) instead of hashing its key and probing again.
  Records the bitmap does not cover (below ``start_offset``: already cleaned; past its bits) are hashed
  and looked up;
* **the record entries**: while it parses a batch's records, the map pass also writes one ``uint64`` entry
  per record (:func:`make_entry`: where the record starts in the segment, its ``offsetDelta``, whether it
  is a tombstone or has no key), the batch's first entry noted by the caller.  The selection then decides
  the batch's records from its entries and the bitmap without parsing them again (it reads only the kept
  records' bytes, to copy them).  The entries use what the buffer has left after the bitmap and the table
  at its bound (:attr:`OffsetMap.entry_capacity`): they never take room from the keys, so the map's
  capacity and the passes' boundaries do not depend on them, and the batches past the entries left (or
  whose records do not fit an entry: a ``offsetDelta`` past 30 bits) are parsed again as before;
* **the bound**: the arrays alive at once, ``max_slots * 24`` and, while the table grows to it, the
  previous table (at most a quarter of that), the bitmap and the record entries, stay within
  ``log.cleaner.dedupe.buffer.size``.  The bitmap has at most a quarter of the buffer (one bit an offset,
  at most as many as the caller says can come), the keys the rest (:data:`BYTES_PER_ENTRY` each), fewer
  when the caller knows that fewer keys can come.  The caller fills the map batch by batch and stops
  *before* a batch whose records could pass ``capacity`` (:attr:`OffsetMap.room`): the map then covers a
  prefix of the dirty section, ending on a batch boundary, and the clean runs in several passes.

Nothing else is allocated per key or per record: the memory is those arrays (the bitmap and the entries
fixed when the map is made, the table growing to its bound; pages of them never written are never
resident).
"""

from __future__ import annotations

import sys
from typing import Final

import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    RECORDS_COUNT_OFFSET,
)
from storage.batch_scan import read_be
from storage.crc32c_kernel import batch_crc_ok
from storage.llvm_arrays import address_of, load_word_at
from storage.prefetch import prefetch
from storage.varint import read_varint_quick, read_varlong_call

__all__ = [
    "BYTES_PER_ENTRY",
    "CRC_MISMATCH",
    "DEFAULT_DEDUPE_BUFFER_BYTES",
    "ENTRY_KEYLESS",
    "ENTRY_TOMBSTONE",
    "GROW",
    "LOAD_FACTOR",
    "MALFORMED_RECORDS",
    "SLOT_WORDS",
    "STOPPED",
    "OffsetMap",
    "entry_offset_delta",
    "entry_position",
    "hash_at",
    "home_slot",
    "is_latest",
    "key_hash",
    "make_entry",
    "map_find",
    "map_put",
    "mark_latest",
    "put_batches",
    "put_records",
    "slot_offset",
]

SLOT_BYTES: Final = 24  # 16-byte key digest + 8-byte offset, as Kafka's SkimpyOffsetMap with MD5
SLOT_WORDS: Final = 3  # a slot's uint64 words: the digest's two halves, the offset + 1
_RESERVED_PER_OFFSET: Final = 4  # bytes of the buffer set aside per offset of the pass, up to a quarter of it
LOAD_FACTOR: Final = 0.9  # Kafka's log.cleaner.io.buffer.load.factor
_LAST_STEP: Final = 4  # the table before the last growth has max_slots // _LAST_STEP slots
BYTES_PER_ENTRY: Final = 34  # a key's share of the table and of its growth at LOAD_FACTOR (30 / 0.9 < 34)
DEFAULT_DEDUPE_BUFFER_BYTES: Final = 128 * 1024 * 1024  # Kafka's log.cleaner.dedupe.buffer.size
MALFORMED_RECORDS: Final = -1  # a record's fields do not parse inside the records section
GROW: Final = -2  # put_batches: the next batch's keys could pass the table's growth point
STOPPED: Final = -3  # put_batches: stopped before a compressed batch (the caller decompresses it)
CRC_MISMATCH: Final = -4  # put_batches: the batch's stored CRC is not the CRC of its bytes
ENTRY_TOMBSTONE: Final = 1 << 62  # a record entry's flag: the record's value is null
ENTRY_KEYLESS: Final = 1 << 63  # a record entry's flag: the record has no key
_ENTRY_BYTES: Final = 8
_ENTRY_POSITION_BITS: Final = 32
_ENTRY_DELTA_LIMIT: Final = 1 << 30  # offsetDelta below it fits an entry
_ENTRY_POSITION_LIMIT: Final = 1 << _ENTRY_POSITION_BITS  # a record starting below it fits an entry
_POSITION_MASK = np.uint64((1 << _ENTRY_POSITION_BITS) - 1)
_DELTA_MASK = np.uint64(_ENTRY_DELTA_LIMIT - 1)
_TOMBSTONE_BIT = np.uint64(ENTRY_TOMBSTONE)
_KEYLESS_BIT = np.uint64(ENTRY_KEYLESS)
_MIN_SLOTS: Final = 1 << 12
_RUN: Final = 256  # records hashed (their slots prefetched) before they are put
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
_EMPTY = np.uint64(0)
_ONE = np.uint64(1)
_S32 = np.uint64(32)

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
def _word_by_bytes(data: np.ndarray, at: int, count: int) -> np.uint64:
    """``count`` (<= 8) bytes at ``at`` as a little-endian word, a byte at a time."""
    value = np.uint64(0)
    for k in range(count - 1, -1, -1):
        value = (value << np.uint64(8)) | np.uint64(data[at + k])
    return value


@numba.njit(cache=True, inline="always")
def _low_bytes(word: np.uint64, count: int) -> np.uint64:
    """The ``count`` (1 to 8) low bytes of ``word``."""
    if count < 8:
        return word & ((_ONE << np.uint64(8 * count)) - _ONE)
    return word


@numba.njit(cache=True, inline="always")
def _mix(h1: np.uint64, h2: np.uint64, k1: np.uint64, k2: np.uint64) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64 128's step over one 16-byte block (``k1``, ``k2``: its little-endian halves)."""
    h1 ^= _rotl(k1 * _C1, 31) * _C2
    h1 = (_rotl(h1, 27) + h2) * _FIVE + _A1
    h2 ^= _rotl(k2 * _C2, 33) * _C1
    h2 = (_rotl(h2, 31) + h1) * _FIVE + _A2
    return h1, h2


@numba.njit(cache=True, inline="always")
def _finish(h1: np.uint64, h2: np.uint64, k1: np.uint64, k2: np.uint64,
            length: int) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64 128's end: the tail's words (``k1``, ``k2``: its bytes, zero-padded; zero when it
    has none) and the key's length mixed in."""
    h2 ^= _rotl(k2 * _C2, 33) * _C1
    h1 ^= _rotl(k1 * _C1, 31) * _C2
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
def hash_at(address: int, length: int) -> tuple[np.uint64, np.uint64]:
    """:func:`key_hash` of the ``length`` bytes at ``address`` (``storage.llvm_arrays.address_of``), eight
    bytes a load: the tail's loads reach up to seven bytes past the key (masked off), so the caller keeps
    ``length + 8`` bytes from ``address`` inside the array, on a little-endian CPU.  The map kernels call it
    once a record (an address, not the array: see ``storage.llvm_arrays``)."""
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    tail = address + (length & ~15)
    at = address
    while at < tail:
        h1, h2 = _mix(h1, h2, load_word_at(at), load_word_at(at + 8))  # type: ignore[call-arg]  # numba
        at += 16
    rest = length & 15
    k1 = k2 = np.uint64(0)
    if rest > 8:
        k2 = _low_bytes(load_word_at(tail + 8), rest - 8)  # type: ignore[call-arg]  # numba: typing context
    if rest > 0:
        k1 = _low_bytes(load_word_at(tail), min(rest, 8))  # type: ignore[call-arg]  # numba: typing context
    return _finish(h1, h2, k1, k2, length)


@numba.njit(cache=True)
def _key_hash_by_bytes(data: np.ndarray, start: int, length: int) -> tuple[np.uint64, np.uint64]:
    """:func:`key_hash` a byte at a time (a big-endian CPU, or a key near the end of ``data``)."""
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    tail = start + (length & ~15)
    for at in range(start, tail, 16):
        h1, h2 = _mix(h1, h2, _word_by_bytes(data, at, 8), _word_by_bytes(data, at + 8, 8))
    rest = length & 15
    k1 = k2 = np.uint64(0)
    if rest > 8:
        k2 = _word_by_bytes(data, tail + 8, rest - 8)
    if rest > 0:
        k1 = _word_by_bytes(data, tail, min(rest, 8))
    return _finish(h1, h2, k1, k2, length)


@numba.njit(cache=True)
def key_hash(data: np.ndarray, start: int, length: int) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64 128 (seed 0) of ``data[start:start + length]``: the two 64-bit halves."""
    if _LITTLE_ENDIAN and start + length + 8 <= data.shape[0]:
        return hash_at(address_of(data, start), length)  # type: ignore[call-arg]  # numba: typing context
    return _key_hash_by_bytes(data, start, length)


@numba.njit(cache=True, inline="always")
def home_slot(h1: np.uint64, slots: int) -> int:
    """The slot where the probe for the digest whose first half is ``h1`` starts (its top 32 bits scaled to
    ``slots``, which stays below 2**32)."""
    return np.int64(((h1 >> _S32) * np.uint64(slots)) >> _S32)  # type: ignore[return-value]  # numba: int64


@numba.njit(cache=True, inline="always")
def map_find(table: np.ndarray, h1: np.uint64, h2: np.uint64) -> tuple[int, bool]:
    """``(slot, found)``: the slot of the key whose digest is ``(h1, h2)``, or the empty slot where it would
    go when it is not there.  The table is never full, so an empty slot ends every probe."""
    slots = table.shape[0] // SLOT_WORDS
    slot = home_slot(h1, slots)
    while True:
        at = SLOT_WORDS * slot
        if table[at + 2] == _EMPTY:
            return slot, False
        if table[at] == h1 and table[at + 1] == h2:
            return slot, True
        slot += 1
        if slot == slots:
            slot = 0


@numba.njit(cache=True, inline="always")
def slot_offset(table: np.ndarray, slot: int) -> int:
    """The latest offset held in ``slot`` (-1: empty)."""
    return np.int64(table[SLOT_WORDS * slot + 2]) - 1  # type: ignore[return-value]  # numba: an int64


@numba.njit(cache=True, inline="always")
def map_put(table: np.ndarray, h1: np.uint64, h2: np.uint64, offset: int) -> tuple[int, bool]:
    """Record ``offset`` for the key whose digest is ``(h1, h2)``; returns ``(slot, new)``: ``new`` when the
    key was not there (the caller counts it).  The dirty section is read in offset order, so ``offset``
    replaces what the key had.  The caller keeps the keys below the table's load bound."""
    slot, found = map_find(table, h1, h2)
    at = SLOT_WORDS * slot
    if not found:
        table[at] = h1
        table[at + 1] = h2
    table[at + 2] = np.uint64(offset + 1)
    return slot, not found


@numba.njit(cache=True)
def _find_key(table: np.ndarray, key: np.ndarray) -> int:
    """The latest offset of ``key`` (its bytes), or -1: hashed and found in numba, where the digest stays
    uint64."""
    h1, h2 = key_hash(key, 0, key.shape[0])
    slot, found = map_find(table, h1, h2)
    return slot_offset(table, slot) if found else -1


@numba.njit(cache=True)
def _move(old: np.ndarray, new: np.ndarray) -> None:
    """Put every key of the table ``old`` into the empty table ``new``."""
    for slot in range(old.shape[0] // SLOT_WORDS):
        at = SLOT_WORDS * slot
        if old[at + 2] == _EMPTY:
            continue
        moved, _ = map_find(new, old[at], old[at + 1])
        to = SLOT_WORDS * moved
        new[to] = old[at]
        new[to + 1] = old[at + 1]
        new[to + 2] = old[at + 2]


@numba.njit(cache=True, nogil=True)
def mark_latest(table: np.ndarray, bits: np.ndarray, base: int) -> None:
    """Set, in ``bits`` (``uint64`` words, bit ``d & 63`` of word ``d >> 6`` for offset ``base + d``), the
    bit of every key's latest offset held in ``table`` that lies inside the bitmap: one walk of the table."""
    limit = bits.shape[0] * 64
    for slot in range(table.shape[0] // SLOT_WORDS):
        stored = table[SLOT_WORDS * slot + 2]
        if stored == _EMPTY:
            continue
        d = np.int64(stored) - 1 - base
        if 0 <= d < limit:
            bits[d >> 6] |= _ONE << np.uint64(d & 63)


@numba.njit(cache=True, inline="always")
def is_latest(bits: np.ndarray, base: int, offset: int) -> int:
    """1 when ``offset``'s bit is set in ``bits`` (:func:`mark_latest`), 0 when it is not, -1 when the
    bitmap does not cover ``offset``."""
    d = offset - base
    if d < 0 or d >= bits.shape[0] * 64:
        return -1
    return np.int64((bits[d >> 6] >> np.uint64(d & 63)) & _ONE)  # type: ignore[return-value]  # numba: int64


@numba.njit(cache=True, inline="always")
def make_entry(position: int, offset_delta: int, tombstone: bool, keyless: bool) -> np.uint64:
    """A record entry: ``position`` (where the record's length varint starts) in the low 32 bits, its
    ``offsetDelta`` (below 2**30) in the next 30, :data:`ENTRY_TOMBSTONE` and :data:`ENTRY_KEYLESS`."""
    entry = np.uint64(position) | (np.uint64(offset_delta) << np.uint64(_ENTRY_POSITION_BITS))
    if tombstone:
        entry |= _TOMBSTONE_BIT
    if keyless:
        entry |= _KEYLESS_BIT
    return entry


@numba.njit(cache=True, inline="always")
def entry_position(entry: np.uint64) -> int:
    """Where the record of ``entry`` starts (:func:`make_entry`)."""
    return np.int64(entry & _POSITION_MASK)  # type: ignore[return-value]  # numba: an int64


@numba.njit(cache=True, inline="always")
def entry_offset_delta(entry: np.uint64) -> int:
    """The ``offsetDelta`` of the record of ``entry`` (:func:`make_entry`)."""
    return np.int64((entry >> np.uint64(_ENTRY_POSITION_BITS)) & _DELTA_MASK)  # type: ignore[return-value]


@numba.njit(cache=True)
def _put_run(data: np.ndarray, at: int, end: int, run: int, base_offset: int, table: np.ndarray, size: int,
             scratch: np.ndarray, entries: np.ndarray, entry_at: int) -> tuple[int, int, bool]:
    """:func:`put_records` for the next ``run`` (<= ``len(scratch)``) records from ``at``, in two steps:
    parse and hash them all, asking for each key's home slot (:func:`storage.prefetch.prefetch`), then put
    them in order, so the table's cache misses overlap.  ``scratch``: ``(run, 4)`` uint64 words (the
    digest's two, the offset, 1 if the record has a key).  With ``entry_at`` >= 0 each record's entry
    (:func:`make_entry`) goes to ``entries`` from there.  Returns ``(keys, position after the run, every
    record fitted an entry)``, or ``MALFORMED_RECORDS`` as the keys."""
    slots = table.shape[0] // SLOT_WORDS
    base_address: int = address_of(data, 0)  # type: ignore[call-arg]  # numba: typing context
    fitted = True
    for n in range(run):
        length, after = read_varint_quick(data, at, end)
        if after < 0 or length <= 0 or after + length > end:
            return MALFORMED_RECORDS, at, False
        record_end = after + length
        p = read_varint_quick(data, after + 1, record_end)[1]  # after the attributes byte: timestampDelta
        if p < 0:  # or a varlong too long for a varint
            p = read_varlong_call(data, after + 1, record_end)[1]
            if p < 0:
                return MALFORMED_RECORDS, at, False
        offset_delta, p = read_varint_quick(data, p, record_end)
        if p < 0:
            return MALFORMED_RECORDS, at, False
        key_length, p = read_varint_quick(data, p, record_end)
        if p < 0 or key_length < -1 or p + key_length > record_end:
            return MALFORMED_RECORDS, at, False
        scratch[n, 3] = key_length >= 0
        if key_length >= 0:
            if _LITTLE_ENDIAN and p + key_length + 8 <= data.shape[0]:
                h1, h2 = hash_at(base_address + p, key_length)
            else:
                h1, h2 = key_hash(data, p, key_length)
            home = SLOT_WORDS * home_slot(h1, slots)
            prefetch(table, home)
            prefetch(table, home + 2)  # the slot's last word: on the next cache line for some slots
            scratch[n, 0] = h1
            scratch[n, 1] = h2
            scratch[n, 2] = np.uint64(base_offset + offset_delta)
        if entry_at >= 0:
            if 0 <= offset_delta < _ENTRY_DELTA_LIMIT and at < _ENTRY_POSITION_LIMIT:
                value_length, _ = read_varint_quick(data, p + max(key_length, 0), record_end)
                entries[entry_at + n] = make_entry(at, offset_delta, value_length < 0, key_length < 0)
            else:
                fitted = False
        at = record_end
    for n in range(run):
        if scratch[n, 3]:
            offset: int = np.int64(scratch[n, 2])
            _, new = map_put(table, scratch[n, 0], scratch[n, 1], offset)
            if new:
                size += 1
    return size, at, fitted


@numba.njit(cache=True)
def _put_section(data: np.ndarray, start: int, end: int, count: int, base_offset: int, table: np.ndarray,
                 size: int, scratch: np.ndarray, entries: np.ndarray, entry_at: int) -> tuple[int, bool]:
    """:func:`put_records` with the caller's ``scratch`` (:func:`_put_run`), run after run; with
    ``entry_at`` >= 0 the records' entries from there.  Returns ``(keys, every record fitted an entry)``."""
    at = start
    done = 0
    fitted = True
    while done < count:
        run = min(scratch.shape[0], count - done)
        size, at, run_fitted = _put_run(data, at, end, run, base_offset, table, size, scratch, entries,
                                        entry_at + done if entry_at >= 0 else -1)
        if size == MALFORMED_RECORDS:
            return MALFORMED_RECORDS, False
        fitted = fitted and run_fitted
        done += run
    if at != end:
        return MALFORMED_RECORDS, False
    return size, fitted


@numba.njit(cache=True, nogil=True)
def put_records(data: np.ndarray, start: int, end: int, count: int, base_offset: int, table: np.ndarray,
                size: int) -> int:
    """Put the key of each of the ``count`` records in ``data[start:end]`` (a batch's records section) with
    its offset; returns the keys in the map after them, or ``MALFORMED_RECORDS``.  Records without a key
    are not put (the clean drops them)."""
    scratch = np.empty((_RUN, 4), np.uint64)
    no_entries = np.empty(0, np.uint64)
    return _put_section(data, start, end, count, base_offset, table, size, scratch, no_entries, -1)[0]


@numba.njit(cache=True, nogil=True)
def put_batches(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, first: int, table: np.ndarray,
                size: int, grow_at: int, entries: np.ndarray, entry_count: int,
                batch_entries: np.ndarray) -> tuple[int, int, int, int]:
    """Put the keys of the batches at ``positions[first:]`` of a segment (``data``: all of it), as
    :func:`put_records`, skipping control batches, and their records' entries in ``entries`` from
    ``entry_count`` on while they fit: ``batch_entries[i]`` gets the first entry of batch ``i`` (the
    caller fills it with -1: no entries).  Each batch's CRC is checked before anything else is read of it
    (``storage.crc32c_kernel.batch_crc_ok``).  Returns ``(batch index, keys, code, entries used)``: code 0
    when all were put; else the batch at the index was not: :data:`CRC_MISMATCH`, :data:`GROW` (its
    records could take the keys past ``grow_at``), :data:`STOPPED` (it is compressed) or
    :data:`MALFORMED_RECORDS`; the batches before it, and it unless the code is :data:`CRC_MISMATCH`, had
    their CRCs checked."""
    scratch = np.empty((_RUN, 4), np.uint64)
    for i in range(first, positions.shape[0]):
        position = positions[i]
        if not batch_crc_ok(data, position, sizes[i]):
            return i, size, CRC_MISMATCH, entry_count
        attributes = read_be(data, position + ATTRIBUTES_OFFSET, 2)
        if attributes & CONTROL_FLAG_MASK:
            continue
        count = read_be(data, position + RECORDS_COUNT_OFFSET, 4)
        if size + count > grow_at:
            return i, size, GROW, entry_count
        if attributes & COMPRESSION_CODEC_MASK:
            return i, size, STOPPED, entry_count
        base_offset = read_be(data, position + BASE_OFFSET_OFFSET, 8)
        entry_at = entry_count if entry_count + count <= entries.shape[0] else -1
        put, fitted = _put_section(data, position + HEADER_SIZE, position + sizes[i], count, base_offset,
                                   table, size, scratch, entries, entry_at)
        if put == MALFORMED_RECORDS:
            return i, size, MALFORMED_RECORDS, entry_count
        size = put
        if entry_at >= 0 and fitted:
            batch_entries[i] = entry_at
            entry_count += count
    return positions.shape[0], size, 0, entry_count


def _slots_for(capacity: int) -> int:
    """The table's bound for ``capacity`` keys: load at most :data:`LOAD_FACTOR`, never full."""
    return int(capacity / LOAD_FACTOR) + 1


def _peak_table_bytes(max_slots: int) -> int:
    """The tables alive at once at the last growth: the bound and the table before it."""
    return (max_slots + max_slots // _LAST_STEP) * SLOT_BYTES


class OffsetMap:
    """The arrays of the module docstring.

    ``size`` counts the keys in it; the map covers ``[start_offset, end_offset)``; ``latest_bits`` is the
    bitmap over the offsets from ``start_offset`` (:meth:`mark_latest` fills it when the map is complete).
    ``max_keys``: at most that many keys (and offsets) will be put (the arrays are then smaller than the
    buffer allows).  ``entries[:entry_count]`` are the record entries of the pass (module docstring), at
    most ``entry_capacity``.
    """

    def __init__(self, dedupe_buffer_bytes: int, *, max_keys: int | None = None) -> None:
        limit = max(1, max_keys) if max_keys is not None else dedupe_buffer_bytes
        reserved = min(limit, dedupe_buffer_bytes // 4 // _RESERVED_PER_OFFSET) * _RESERVED_PER_OFFSET
        budget = dedupe_buffer_bytes - reserved
        capacity = min(limit, budget // BYTES_PER_ENTRY)
        while capacity >= 1 and _peak_table_bytes(_slots_for(capacity)) > budget:  # small maps: rounding
            capacity -= 1
        if capacity < 1:
            raise ValueError(f"log.cleaner.dedupe.buffer.size {dedupe_buffer_bytes} holds no key "
                             f"({BYTES_PER_ENTRY} bytes per key)")
        self.capacity = capacity
        self.max_slots = _slots_for(capacity)
        self.bitmap_words = min(limit + 63, 8 * reserved) // 64
        spare = dedupe_buffer_bytes - 8 * self.bitmap_words - _peak_table_bytes(self.max_slots)
        self.entry_capacity = max(0, min(limit, spare // _ENTRY_BYTES))
        self.entries = np.empty(self.entry_capacity, dtype=np.uint64)
        self.entry_count = 0
        self.latest_bits = np.zeros(0, dtype=np.uint64)
        self.table = np.zeros(0, dtype=np.uint64)
        self.size = 0
        self.start_offset = -1
        self.end_offset = -1
        self.clear(-1)

    @property
    def slots(self) -> int:
        return int(self.table.shape[0]) // SLOT_WORDS

    @property
    def memory_bytes(self) -> int:
        """The bytes of the arrays at their bound: the bitmap, the record entries, the table at
        ``max_slots`` and, while it grows to it, the one before."""
        return 8 * self.bitmap_words + _ENTRY_BYTES * self.entry_capacity + _peak_table_bytes(self.max_slots)

    @property
    def room(self) -> int:
        """Keys that may still go in."""
        return self.capacity - self.size

    @property
    def grow_at(self) -> int:
        """The keys the table takes before :meth:`grow`: half its slots, or ``capacity`` at its bound."""
        return self.capacity if self.slots >= self.max_slots else self.slots // 2

    def clear(self, start_offset: int) -> None:
        """Empty the map for a pass that starts at ``start_offset``: the smallest table (a quarter of
        ``max_slots`` halved while it stays above the smallest size; ``max_slots`` for a small map)."""
        slots = self.max_slots // _LAST_STEP
        if slots < _MIN_SLOTS:
            slots = self.max_slots
        while slots // 2 >= _MIN_SLOTS:
            slots //= 2
        self.table = np.zeros(0, dtype=np.uint64)  # dropped before the new one is made
        self.latest_bits = np.zeros(0, dtype=np.uint64)
        self.table = np.zeros(slots * SLOT_WORDS, dtype=np.uint64)
        self.size = 0
        self.entry_count = 0
        self.start_offset = self.end_offset = start_offset

    def grow(self) -> None:
        """Double the table, or take it from a quarter of ``max_slots`` to ``max_slots``: every key moved."""
        slots = self.max_slots if 2 * self.slots > self.max_slots // _LAST_STEP else 2 * self.slots
        old = self.table
        self.table = np.zeros(slots * SLOT_WORDS, dtype=np.uint64)
        _move(old, self.table)

    def mark_latest(self) -> None:
        """Fill ``latest_bits`` from the table, once the map pass is over (module docstring)."""
        self.latest_bits = np.zeros(self.bitmap_words, dtype=np.uint64)
        mark_latest(self.table, self.latest_bits, self.start_offset)

    def latest_offset(self, key: bytes) -> int:
        """The latest offset recorded for ``key``, or -1 (tests, tools; the clean looks up in numba)."""
        return int(_find_key(self.table, np.frombuffer(key, dtype=np.uint8)))
