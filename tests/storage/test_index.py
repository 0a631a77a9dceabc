"""Offset and time indexes: real files, real mmaps, lookups against a bisect oracle, kernels and twins."""

from __future__ import annotations

import bisect
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.index_file import NOT_FOUND, count_used_entries, index_search, index_search_many, read_key
from storage.offset_index import OFFSET_INDEX_ENTRY, OffsetIndex
from storage.time_index import TIME_INDEX_ENTRY, TimeIndex

BASE = 1_000


def _entries(draw_offsets: list[int]) -> list[tuple[int, int]]:
    """Strictly increasing (offset, position) pairs with positions > 0."""
    offsets = sorted(set(draw_offsets))
    return [(BASE + o, 100 * (i + 1)) for i, o in enumerate(offsets)]


def _oracle(entries: list[tuple[int, int]], target: int) -> tuple[int, int] | None:
    keys = [o for o, _ in entries]
    i = bisect.bisect_right(keys, target) - 1
    return None if i < 0 else entries[i]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 2), max_size=200), st.lists(st.integers(-10, 2**31 + 5), max_size=30))
def test_offset_index_lookup_matches_bisect(tmp_path_factory: pytest.TempPathFactory, raw: list[int],
                                            targets: list[int]) -> None:
    path = str(tmp_path_factory.mktemp("idx") / "00000000000000001000.index")
    entries = _entries(raw)
    index = OffsetIndex.open_active(path, BASE, max_bytes=8 * (len(entries) + 3))
    for offset, position in entries:
        index.append(offset, position)
    try:
        for target in [*targets, *(o for o, _ in entries[:20])]:
            found = index.lookup(BASE + target)
            expected = _oracle(entries, BASE + target)
            assert (None if found is None else tuple(found)) == expected
        slots = index.lookup_many(np.array([BASE + t for t in targets], dtype=np.int64))
        for target, slot in zip(targets, slots.tolist(), strict=True):
            expected = _oracle(entries, BASE + target)
            assert (NOT_FOUND if expected is None else entries.index(expected)) == slot
    finally:
        index.close()


def test_offset_index_file_is_big_endian_kafka_layout(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "00000000000000001000.index")
    index = OffsetIndex.open_active(path, BASE, max_bytes=1024)
    index.append(BASE + 7, 4242)
    index.append(BASE + 300, 90000)
    index.trim()
    index.close()
    with open(path, "rb") as f:
        data = f.read()
    assert data == struct.pack(">iiii", 7, 4242, 300, 90000)


def test_preallocated_then_trimmed_and_reopened(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "00000000000000001000.index")
    index = OffsetIndex.open_active(path, BASE, max_bytes=800)
    assert os.path.getsize(path) == 800  # preallocated
    for i in range(1, 11):
        index.append(BASE + i, i * 10)
    index.trim()
    assert os.path.getsize(path) == 80
    assert index.lookup(BASE + 5) == (BASE + 5, 50)
    index.close()
    again = OffsetIndex.open_active(path, BASE, max_bytes=800, entries=10)
    assert os.path.getsize(path) == 800
    assert again.lookup(BASE + 100) == (BASE + 10, 100)
    again.append(BASE + 11, 110)
    assert again.entries == 11
    again.close()


def test_truncate_zeroes_dropped_entries_and_keeps_file_size(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "00000000000000001000.index")
    index = OffsetIndex.open_active(path, BASE, max_bytes=160)
    for i in range(1, 11):
        index.append(BASE + 10 * i, 100 * i)
    index.truncate_to(BASE + 55)  # drops entries for offsets >= 55
    assert index.entries == 5
    assert index.lookup(BASE + 1000) == (BASE + 50, 500)
    assert os.path.getsize(path) == 160
    index.close()
    with open(path, "rb") as f:
        data = f.read()
    assert data[40:] == bytes(120)  # zero tail: a reader's count_used_entries sees 5
    view = OffsetIndex.open_view(path, BASE)
    assert view.entries == 5
    view.close()


def test_full_index(tmp_path: os.PathLike[str]) -> None:
    index = OffsetIndex.open_active(os.path.join(tmp_path, "0.index"), 0, max_bytes=20)
    assert index.file.max_entries == 2  # rounded down to whole entries
    index.append(1, 10)
    assert not index.is_full()
    index.append(2, 20)
    assert index.is_full()
    index.close()


def test_sanity_problems_are_named(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "00000000000000001000.index")
    with open(path, "wb") as f:
        f.write(struct.pack(">iiii", 5, 100, 3, 200))
    index = OffsetIndex.open_closed(path, BASE)
    assert "strictly increase" in (index.sanity_problem(log_size_bytes=1000, next_offset_limit=None) or "")
    index.close()
    with open(path, "wb") as f:
        f.write(struct.pack(">iiii", 5, 100, 6, 2000))
    index = OffsetIndex.open_closed(path, BASE)
    assert "not inside" in (index.sanity_problem(log_size_bytes=1000, next_offset_limit=None) or "")
    assert index.sanity_problem(log_size_bytes=5000, next_offset_limit=None) is None
    assert "not below" in (index.sanity_problem(log_size_bytes=5000, next_offset_limit=BASE + 6) or "")
    index.close()
    with open(path, "wb") as f:
        f.write(b"\x00" * 13)
    index = OffsetIndex.open_closed(path, BASE)
    assert "multiple of 8" in (index.sanity_problem(log_size_bytes=5000, next_offset_limit=None) or "")
    index.close()


def test_time_index_appends_only_growing_timestamps_and_reserves_last_slot(
        tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "00000000000000001000.timeindex")
    index = TimeIndex.open_active(path, BASE, max_bytes=12 * 3)
    assert index.maybe_append(500, BASE + 1)
    assert not index.maybe_append(500, BASE + 2)  # not larger
    assert not index.maybe_append(400, BASE + 3)
    assert index.maybe_append(600, BASE + 4)
    assert index.is_full()  # one slot left, reserved for roll/close
    assert not index.maybe_append(700, BASE + 5)
    assert index.maybe_append(700, BASE + 5, final=True)
    assert [tuple(index.entry(i)) for i in range(3)] == [(500, BASE + 1), (600, BASE + 4), (700, BASE + 5)]
    assert index.lookup(499) is None
    assert index.lookup(650) == (600, BASE + 4)
    assert index.lookup(10**15) == (700, BASE + 5)
    index.truncate_to(BASE + 4)
    assert index.entries == 1
    index.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**62), max_size=100), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20))
def test_time_index_lookup_matches_bisect(tmp_path_factory: pytest.TempPathFactory, raw: list[int],
                                          targets: list[int]) -> None:
    path = str(tmp_path_factory.mktemp("tidx") / "00000000000000001000.timeindex")
    stamps = sorted(set(raw))
    index = TimeIndex.open_active(path, BASE, max_bytes=12 * (len(stamps) + 2))
    for i, ts in enumerate(stamps):
        assert index.maybe_append(ts, BASE + i)
    try:
        for target in [*targets, *stamps[:10]]:
            i = bisect.bisect_right(stamps, target) - 1
            found = index.lookup(target)
            assert (None if found is None else tuple(found)) == (None if i < 0 else (stamps[i], BASE + i))
    finally:
        index.close()


# --- kernels and their pure-Python twins -------------------------------------------------------------
def _buffer(keys: list[int], entry: struct.Struct) -> np.ndarray:
    data = b"".join(entry.pack(k, 0) if entry is TIME_INDEX_ENTRY else entry.pack(k, 1) for k in keys)
    return np.frombuffer(data + bytes(entry.size * 3), dtype=np.uint8)


@pytest.mark.parametrize("twin", [False, True], ids=["numba", "py_func"])
@pytest.mark.parametrize("entry", [OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY], ids=["offset", "time"])
def test_kernels_and_twins(twin: bool, entry: struct.Struct) -> None:
    size = 4 if entry is OFFSET_INDEX_ENTRY else 8
    low = 0 if size == 4 else -(2**40)
    keys = [low, 3, 10, 11, 2**31 - 1] if size == 4 else [low, -1, 3, 10, 2**62]
    buf = _buffer(keys, entry)
    search = index_search.py_func if twin else index_search
    many = index_search_many.py_func if twin else index_search_many
    count = count_used_entries.py_func if twin else count_used_entries
    key = read_key.py_func if twin else read_key
    assert [key(buf, i * entry.size, size) for i in range(len(keys))] == keys
    for target in [low - 1, low, -1, 2, 3, 4, 10, 11, 12, 2**31 - 1, 2**31, 2**62, 2**62 + 1]:
        want = bisect.bisect_right(keys, target) - 1
        assert search(buf, len(keys), entry.size, 0, size, target) == want
    assert search(buf, 0, entry.size, 0, size, 5) == NOT_FOUND
    targets = np.array([low - 1, 3, 10**6], dtype=np.int64)
    out = np.empty(3, dtype=np.int64)
    assert many(buf, len(keys), entry.size, 0, size, targets, out) == 3
    assert out.tolist() == [search(buf, len(keys), entry.size, 0, size, int(t)) for t in targets]
    if entry is OFFSET_INDEX_ENTRY:  # every offset-index entry has position 1 here, so none is all-zero
        assert count(buf, len(keys) + 3, entry.size) == len(keys)
    assert count(np.zeros(24, dtype=np.uint8), 2, 12) == 0
