"""The map pass's record entries and the selection that reads them (``storage.offset_map.put_batches``,
``storage.record_filter.select_entries``), against a Python oracle of compaction's rule: random batches
(keys from a few, tombstones, keyless records, delete horizons, a pass starting past the first batch, maps
too small for every key, for every offset's bit or for every record's entry)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_builder import build_batch
from storage.batch_header import ATTRIBUTES_OFFSET, HEADER_SIZE, RECORDS_COUNT_OFFSET, write_crc
from storage.offset_map import (
    BYTES_PER_ENTRY,
    GROW,
    OffsetMap,
    entry_offset_delta,
    entry_position,
    put_batches,
)
from storage.record_filter import DELETE_HORIZON_FLAG_MASK, RESULT_COLUMNS, RecordMarks, select_batches
from storage.varint import parse_varint

NOW_MS = 5_000
_record = st.tuples(st.sampled_from([b"a", b"b", b"c", b"dd", b"e" * 20, None]),  # key (None: keyless)
                    st.sampled_from([b"v", b"", None]),  # value (None: a tombstone)
                    st.integers(0, 300))  # timestamp delta
_batch = st.tuples(st.lists(_record, min_size=1, max_size=8),
                   st.integers(0, 3),  # gap before its base offset
                   st.booleans())  # delete horizon passed (tombstones dropped)


class _Segment:
    """Batches one after the other in one array, and what the oracle needs of each record."""

    def __init__(self, batches: list[tuple[list[tuple[bytes | None, bytes | None, int]], int, bool]]) -> None:
        parts: list[bytes] = []
        self.records: list[tuple[int, bytes | None, bool, int]] = []  # offset, key, tombstone, timestamp
        self.drop_tombstones: list[bool] = []
        offset = 0
        for records, gap, horizon_passed in batches:
            offset += gap
            data = bytearray(build_batch([value for _, value, _ in records], [key for key, _, _ in records],
                                         timestamps=[1_000 + delta for _, _, delta in records],
                                         base_offset=offset))
            if horizon_passed:  # a delete horizon set by an earlier clean, and passed: its tombstones go
                data[ATTRIBUTES_OFFSET + 1] |= DELETE_HORIZON_FLAG_MASK
                write_crc(data, 0, len(data))
            parts.append(bytes(data))
            self.drop_tombstones.append(horizon_passed)
            for n, (key, value, delta) in enumerate(records):
                self.records.append((offset + n, key, value is None, 1_000 + delta))
            offset += len(records)
        self.sizes = np.array([len(part) for part in parts], np.int64)
        self.positions = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.data = np.frombuffer(b"".join(parts), np.uint8)
        self.base_offsets = [int.from_bytes(part[:8], "big") for part in parts]
        self.counts = [int.from_bytes(part[RECORDS_COUNT_OFFSET : RECORDS_COUNT_OFFSET + 4], "big")
                       for part in parts]


def _fill(segment: _Segment, omap: OffsetMap, first: int) -> np.ndarray:
    """The map pass from batch ``first`` (growing the table, stopping when the keys could pass the map's
    room), as ``storage.cleaner`` runs it; returns each batch's first record entry (-1: none)."""
    omap.clear(segment.base_offsets[first])
    batch_entries = np.full(len(segment.positions), -1, np.int64)
    while True:
        i, omap.size, code, omap.entry_count = put_batches(
            segment.data, segment.positions, segment.sizes, first, omap.table, omap.size, omap.grow_at,
            omap.entries, omap.entry_count, batch_entries)
        done = i == len(segment.positions)
        omap.end_offset = segment.records[-1][0] + 1 if done else segment.base_offsets[i]
        if code == 0 or segment.counts[i] > omap.room:
            break
        assert code == GROW
        omap.grow()
        first = i
    omap.mark_latest()
    return batch_entries


def _oracle(segment: _Segment, omap: OffsetMap) -> list[bool]:
    """Compaction's rule over every record: past the map's end, kept; else a key, not superseded by a
    later record of the map's range, and not a tombstone whose batch's horizon passed."""
    latest = {key: offset for offset, key, _, _ in segment.records
              if key is not None and omap.start_offset <= offset < omap.end_offset}
    drop = [segment.drop_tombstones[b] for b, count in enumerate(segment.counts) for _ in range(count)]
    return [offset >= omap.end_offset
            or (key is not None and offset >= latest.get(key, offset) and not (tombstone and drop[n]))
            for n, (offset, key, tombstone, _) in enumerate(segment.records)]


def _kept(segment: _Segment, omap: OffsetMap, results: np.ndarray, marks: RecordMarks) -> list[bool]:
    """Whether each record survives, as the selection says: a batch from the map's end on is copied
    unread, the others' records are marked from ``results``' mark position."""
    kept: list[bool] = []
    for b, count in enumerate(segment.counts):
        if segment.base_offsets[b] >= omap.end_offset:
            kept += [True] * count
        else:
            kept += marks.keep[results[b, 5] : results[b, 5] + count].tolist()
    return kept


def _select(segment: _Segment, omap: OffsetMap, batch_entries: np.ndarray) -> tuple[np.ndarray, RecordMarks]:
    marks = RecordMarks.make(len(segment.records))
    results = np.zeros((len(segment.positions), RESULT_COLUMNS), np.int64)
    index, code = select_batches(segment.data, segment.positions, segment.sizes, 0, NOW_MS, omap.end_offset,
                                 omap.table, omap.latest_bits, omap.start_offset, omap.entries, batch_entries,
                                 *marks, results)
    assert (index, code) == (len(segment.positions), 0)
    return results, marks


@settings(max_examples=25, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=12), st.data(),
       st.sampled_from([1 << 16, 6 * BYTES_PER_ENTRY, 12 * BYTES_PER_ENTRY]))
def test_selection_from_entries_is_the_oracle_and_the_parsed_selection(
        batches: list[tuple[list[tuple[bytes | None, bytes | None, int]], int, bool]], data: st.DataObject,
        buffer_bytes: int) -> None:
    segment = _Segment(batches)
    first = data.draw(st.integers(0, len(batches) - 1), label="the pass's first batch")
    omap = OffsetMap(buffer_bytes)
    batch_entries = _fill(segment, omap, first)
    described = [b for b in range(len(batches)) if batch_entries[b] >= 0]
    for b in described:  # each entry names its record's start and offset delta
        at = int(segment.positions[b]) + HEADER_SIZE
        for n in range(segment.counts[b]):
            entry = omap.entries[batch_entries[b] + n]
            assert (entry_position(entry), entry_offset_delta(entry)) == (at, n)
            length, after = parse_varint(segment.data.tobytes(), at, len(segment.data))
            at = after + length
    results, marks = _select(segment, omap, batch_entries)
    parsed_results, parsed_marks = _select(segment, omap, np.empty(0, np.int64))
    assert _kept(segment, omap, results, marks) == _oracle(segment, omap)
    assert (results == parsed_results).all()  # actions, kept, tombstones, max timestamps, keyless counts
    kept = marks.keep
    assert (marks.keep == parsed_marks.keep).all()
    for ours, parsed in zip(marks[1:], parsed_marks[1:], strict=True):  # where each kept record lies
        assert (ours[kept] == parsed[kept]).all()
