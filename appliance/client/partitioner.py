"""Kafka's default partitioner: murmur2 of the key for keyed records, a sticky partition for the others.

Theory of operation
-------------------
**Keyed records** go to ``toPositive(murmur2(key)) % partitions``, exactly as Kafka's producer computes it
(``Utils.murmur2`` and ``Utils.toPositive`` in Kafka's clients), so a key lands on the same partition whether
a Kafka client or this appliance's producer sent it.  murmur2 here is MurmurHash2 with Kafka's seed
``0x9747b28c``, little-endian 4-byte blocks, the tail folded in from its highest byte down, and the hash read
as a signed 32-bit int; ``toPositive`` clears the sign bit (``h & 0x7fffffff``), which is not ``abs``.

Two ways in: :func:`murmur2` hashes one key (a numba kernel; a memo of recent keys in
:class:`KeyPartitioner` spares repeated keys the call), :func:`murmur2_column` hashes a whole column of keys
(``send_many``) in one kernel call.

**Records without a key** stick to one partition until the batch they fill is sealed, then the topic moves
to another partition chosen at random (Kafka's sticky partitioner, KIP-480): whole batches instead of one
record per partition per batch.  Kafka 3.3 (KIP-794) also weighs partitions by queue length; with one ring
per partition and back-pressure on each, the random choice is enough here.
"""

from __future__ import annotations

import random

import numba
import numpy as np

__all__ = [
    "MURMUR2_SEED",
    "KeyPartitioner",
    "StickyPartitioner",
    "murmur2",
    "murmur2_column",
    "partition_for_hash",
    "to_positive",
]

MURMUR2_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF
_KEY_MEMO_ENTRIES = 1 << 16  # keys remembered per topic before the memo starts again


@numba.njit(cache=True, inline="always")
def _murmur2_range(data: np.ndarray | bytes, start: int, end: int) -> int:
    """MurmurHash2 (Kafka's variant) of ``data[start:end]`` as an unsigned 32-bit value in an int64."""
    length = end - start
    h = (MURMUR2_SEED ^ length) & _MASK32
    block_end = start + (length & ~3)
    for j in range(start, block_end, 4):
        k = int(data[j]) | (int(data[j + 1]) << 8) | (int(data[j + 2]) << 16) | (int(data[j + 3]) << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail == 3:
        h ^= int(data[block_end + 2]) << 16
    if tail >= 2:
        h ^= int(data[block_end + 1]) << 8
    if tail >= 1:
        h ^= int(data[block_end])
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


@numba.njit(cache=True)
def _murmur2_bytes(data: bytes) -> int:
    return _murmur2_range(data, 0, len(data))


def murmur2(key: bytes | bytearray | memoryview) -> int:
    """Kafka's ``Utils.murmur2(key)``: a signed 32-bit int (``murmur2(b"21") == -973932308``)."""
    h = int(_murmur2_bytes(bytes(key)))
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: the sign bit cleared (so ``-2**31`` maps to 0, unlike ``abs``)."""
    return number & 0x7FFFFFFF


def partition_for_hash(hash32: int, partitions: int) -> int:
    """``toPositive(hash) % partitions`` for a murmur2 value (signed or unsigned 32-bit)."""
    return (hash32 & 0x7FFFFFFF) % partitions


@numba.njit(cache=True)
def murmur2_column(data: np.ndarray, offsets: np.ndarray, partitions: int, out: np.ndarray) -> int:
    """Partition of every key of a column: ``out[i] = toPositive(murmur2(data[offsets[i]:offsets[i+1]]))
    % partitions``.  Returns the number of keys, or -1 - i when offsets entry ``i + 1`` is bad
    (decreasing, or past the end of ``data``).  Null keys are the caller's business (they have no hash)."""
    count = offsets.shape[0] - 1
    for i in range(count):
        start = offsets[i]
        end = offsets[i + 1]
        if start < 0 or end < start or end > data.shape[0]:
            return -1 - i
        out[i] = (_murmur2_range(data, start, end) & 0x7FFFFFFF) % partitions
    return count


class KeyPartitioner:
    """Partition of a key for one topic, with a memo of recent keys (keys repeat: users, devices, orders)."""

    __slots__ = ("_memo", "partitions")

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"a topic needs at least one partition, got {partitions}")
        self.partitions = partitions
        self._memo: dict[bytes, int] = {}

    def partition(self, key: bytes) -> int:
        memo = self._memo
        hit = memo.get(key)
        if hit is not None:
            return hit
        if len(memo) >= _KEY_MEMO_ENTRIES:
            memo.clear()
        partition = (_murmur2_bytes(key) & 0x7FFFFFFF) % self.partitions
        memo[key] = partition
        return partition


class StickyPartitioner:
    """The partition records without a key go to, per topic: kept until :meth:`switch` (a batch sealed)."""

    __slots__ = ("_random", "current", "partitions")

    def __init__(self, partitions: int, rng: random.Random | None = None) -> None:
        if partitions < 1:
            raise ValueError(f"a topic needs at least one partition, got {partitions}")
        self.partitions = partitions
        self._random = rng or random.Random()
        self.current = self._random.randrange(partitions)

    def switch(self, sealed_partition: int) -> int:
        """A batch of ``sealed_partition`` was sealed: move to another partition (if that was the current
        one and there is another); return the current partition."""
        if sealed_partition == self.current and self.partitions > 1:
            step = self._random.randrange(1, self.partitions)
            self.current = (self.current + step) % self.partitions
        return self.current
