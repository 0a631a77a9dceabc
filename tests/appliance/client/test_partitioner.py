"""Kafka's default partitioner: murmur2 against Kafka's own vectors and an independent implementation
(kafka-python's), the column kernel and its Python twin, sticky switching."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.partitioner import (
    KeyPartitioner,
    StickyPartitioner,
    murmur2,
    murmur2_column,
    partition_for_hash,
    to_positive,
)
from storage.batch_builder import ByteColumn

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # kafka-python warns about its own deprecations at import
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2

# Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java (testMurmur2) and
# librdkafka's rdmurmur2.c unit test: key -> Utils.murmur2(key) as a signed 32-bit int.
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"kafka", -798503068),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected
    assert murmur2(bytearray(key)) == expected and murmur2(memoryview(key)) == expected


def test_to_positive_clears_the_sign_bit_like_kafka_not_abs() -> None:
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java; Kafka maps it to 0
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(-973932308) == 1173551340
    assert to_positive(479470107) == 479470107
    assert partition_for_hash(-973932308, 10) == 1173551340 % 10
    assert partition_for_hash(-973932308 & 0xFFFFFFFF, 10) == 1173551340 % 10  # unsigned form too


def test_the_empty_key_and_every_tail_length() -> None:
    for length in range(0, 9):
        key = bytes(range(1, length + 1))
        assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_murmur2_equals_kafka_pythons_implementation(key: bytes) -> None:
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=32), st.integers(1, 64))
def test_key_partitioner_agrees_with_kafka_pythons_default_partitioner(key: bytes, partitions: int) -> None:
    expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions  # kafka-python DefaultPartitioner
    partitioner = KeyPartitioner(partitions)
    assert partitioner.partition(key) == expected
    assert partitioner.partition(key) == expected  # from the memo this time


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(1, 50))
def test_murmur2_column_and_its_twin_match_one_key_at_a_time(keys: list[bytes], partitions: int) -> None:
    data = np.frombuffer(b"".join(keys), np.uint8)
    offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(k) for k in keys], out=offsets[1:])
    expected = [to_positive(murmur2(k)) % partitions for k in keys]
    for kernel in (murmur2_column, murmur2_column.py_func):
        out = np.full(len(keys), -1, np.int32)
        assert kernel(data, offsets, partitions, out) == len(keys)
        assert out.tolist() == expected


@pytest.mark.parametrize("kernel", [murmur2_column, murmur2_column.py_func], ids=["numba", "python"])
def test_murmur2_column_names_the_first_bad_offset(kernel: object) -> None:
    data = np.frombuffer(b"abcdef", np.uint8)
    out = np.empty(3, np.int32)
    assert kernel(data, np.array([0, 2, 1, 6]), 4, out) == -1 - 1  # type: ignore[operator]
    assert kernel(data, np.array([0, 2, 4, 7]), 4, out) == -1 - 2  # type: ignore[operator]
    assert kernel(data, np.array([-1, 2, 4, 6]), 4, out) == -1 - 0  # type: ignore[operator]


def test_sticky_partitioner_moves_only_when_its_own_batch_is_sealed() -> None:
    sticky = StickyPartitioner(5, random.Random(7))
    seen = set()
    for _ in range(200):
        current = sticky.current
        other = (current + 1) % 5
        assert sticky.switch(other) == current, "sealing another partition's batch keeps the sticky one"
        after = sticky.switch(current)
        assert after != current and 0 <= after < 5
        seen.add(after)
    assert seen == set(range(5)), "every partition gets its turn"
    single = StickyPartitioner(1)
    assert single.switch(0) == 0


def test_partitioners_refuse_a_topic_without_partitions() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        KeyPartitioner(0)
    with pytest.raises(ValueError, match="at least one partition"):
        StickyPartitioner(0)


def test_key_column_helper_agrees_with_storage_columns() -> None:
    column = ByteColumn.from_list([b"k1", b"k22", b""])
    out = np.empty(3, np.int32)
    assert murmur2_column(column.data, column.offsets, 7, out) == 3
    assert out.tolist() == [KeyPartitioner(7).partition(k) for k in (b"k1", b"k22", b"")]
