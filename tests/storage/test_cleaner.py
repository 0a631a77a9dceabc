"""The cleaner's pieces and its behaviour on single cases: the offset map and its hash, several passes,
offsets kept, codecs kept, producers' last batches, tombstone horizons, bad input, a failed swap step."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from compaction_oracle import headers, read_records

from storage.batch_builder import build_batch
from storage.batch_header import RECORDS_OFFSET, parse_header, validate_batch, write_crc
from storage.batch_rewrite import fill_crcs, output_bound, write_selected
from storage.clean_faults import CLEAN_FAULTS
from storage.cleaner import DELETE_HORIZON_FLAG_MASK, clean_log, first_dirty_offset
from storage.errors import ConfigError, CorruptRecordError
from storage.log import Log
from storage.log_config import LogConfig
from storage.offset_map import (
    BYTES_PER_ENTRY,
    OffsetMap,
    key_hash,
    map_find,
    map_put,
    put_batches,
    slot_offset,
)
from storage.record_filter import RESULT_COLUMNS, RecordMarks, select_batches

CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=100)


def _log(tmp_path: Path, batches: list[bytes]) -> Log:
    log = Log.open(str(tmp_path / "clean-0"), CONFIG)
    for data in batches:
        log.append(data, leader_epoch=0)
    log.roll()
    log.flush()  # the recovery point settled: a test compares the directory before and after
    return log


def _files(directory: str) -> dict[str, bytes]:
    return {name: Path(directory, name).read_bytes() for name in sorted(os.listdir(directory))
            if name != ".lock"}


_M64 = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        k ^= k >> 33
        k = (k * multiplier) & _M64
    return k ^ (k >> 33)


def _murmur3_x64_128(data: bytes) -> tuple[int, int]:
    """The reference: MurmurHash3 x64 128, seed 0, in Python integers."""
    c1, c2, h1, h2, n = 0x87C37B91114253D5, 0x4CF5AD432745937F, 0, 0, len(data)
    mix1 = lambda k: (_rotl((k * c1) & _M64, 31) * c2) & _M64  # noqa: E731
    mix2 = lambda k: (_rotl((k * c2) & _M64, 33) * c1) & _M64  # noqa: E731
    for i in range(0, n - n % 16, 16):
        h1 ^= mix1(int.from_bytes(data[i : i + 8], "little"))
        h1 = ((_rotl(h1, 27) + h2) * 5 + 0x52DCE729) & _M64
        h2 ^= mix2(int.from_bytes(data[i + 8 : i + 16], "little"))
        h2 = ((_rotl(h2, 31) + h1) * 5 + 0x38495AB5) & _M64
    tail = data[n - n % 16 :]
    if len(tail) > 8:
        h2 ^= mix2(int.from_bytes(tail[8:], "little"))
    if tail:
        h1 ^= mix1(int.from_bytes(tail[:8], "little"))
    h1, h2 = h1 ^ n, h2 ^ n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    return h1, (h2 + h1) & _M64


def test_key_hash_is_murmur3_x64_128() -> None:
    hello = np.frombuffer(b"hello", np.uint8)
    assert tuple(map(int, key_hash(hello, 0, 5))) == (0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19)
    data = np.random.default_rng(3).integers(0, 256, 300, dtype=np.uint8)
    for length in range(0, 40):
        assert tuple(map(int, key_hash(data, 5, length))) == _murmur3_x64_128(bytes(data[5 : 5 + length]))
        at = 300 - length  # a key that ends the array: its last words cannot be read eight bytes at a time
        assert tuple(map(int, key_hash(data, at, length))) == _murmur3_x64_128(bytes(data[at:]))
    assert len({key_hash(data, 0, n) for n in range(300)}) == 300


def test_offset_map_keeps_the_latest_offset_and_its_bound() -> None:
    omap = OffsetMap(10 * BYTES_PER_ENTRY)
    assert omap.capacity == 7 and omap.memory_bytes <= 10 * BYTES_PER_ENTRY
    data = np.frombuffer(b"k1k2", np.uint8)
    h = tuple(map(np.uint64, key_hash(data, 0, 2)))
    slot, new = map_put(omap.table, h[0], h[1], 5)
    assert new and map_put(omap.table, h[0], h[1], 9) == (slot, False)  # known: the same slot, not new
    assert map_find(omap.table, h[0], h[1]) == (slot, True) and slot_offset(omap.table, slot) == 9
    small = OffsetMap(1 << 20, max_keys=90)  # fewer keys to come: smaller arrays
    assert small.capacity == 90 and small.entry_capacity == 90
    assert small.memory_bytes < 90 * (BYTES_PER_ENTRY + 4 + 8)  # a key's table, bitmap and record entry
    assert omap.latest_offset(b"k1") == 9 and omap.latest_offset(b"k2") == -1
    with pytest.raises(ValueError, match=r"dedupe\.buffer\.size"):
        OffsetMap(BYTES_PER_ENTRY)


def test_offset_map_table_grows_to_its_bound_keeping_every_key() -> None:
    omap = OffsetMap(1 << 20)
    assert omap.slots < omap.max_slots and omap.memory_bytes <= 1 << 20
    data = np.frombuffer(b"".join(b"key-%06d" % i for i in range(omap.capacity)), np.uint8)
    for i in range(omap.capacity):
        if omap.size == omap.grow_at:
            omap.grow()
        h1, h2 = map(np.uint64, key_hash(data, 10 * i, 10))
        assert map_put(omap.table, h1, h2, 1000 + i)[1]  # a new key
        omap.size += 1
    assert omap.slots == omap.max_slots and omap.room == 0
    assert all(omap.latest_offset(b"key-%06d" % i) == 1000 + i for i in range(0, omap.capacity, 97))


def test_a_map_that_grows_during_its_pass_keeps_each_keys_last(tmp_path: Path) -> None:
    """9,000 keys in 15,000 records: the table grows while the map pass reads them, every key moving to
    the bigger table with its latest offset (the clean keeps each key's last)."""
    keys = [b"key-%05d" % ((i * 7919) % 9000) for i in range(15_000)]
    batches = [build_batch([b"v%d" % i for i in range(n, n + 500)], keys[n : n + 500], timestamp_ms=1000)
               for n in range(0, 15_000, 500)]
    with Log.open(str(tmp_path / "grow-0"), LogConfig(segment_bytes=1 << 20)) as log:
        for data in batches:
            log.append(data, leader_epoch=0)
        log.roll()
        omap = OffsetMap(1 << 27, max_keys=15_000)
        first_slots = omap.slots
        result = clean_log(log, upper_bound=log.log_end_offset, offset_map=omap)
        assert result.done and result.keys == 9000 and omap.slots > first_slots  # it grew
        found = read_records(log.batches())
    assert len(found) == 9000  # one record a key: its last
    assert {key: offset for offset, (key, _) in found.items()} == {key: i for i, key in enumerate(keys)}
    assert all(value == b"v%d" % offset for offset, (_, value) in found.items())


def test_records_past_the_latest_offset_bitmap_are_looked_up(tmp_path: Path) -> None:
    """A pass whose offsets outnumber its bitmap's bits (a small buffer, few keys, many records): the
    records past the bits are decided by looking their keys up, and each key still keeps its last."""
    keys = [b"k%d" % (i % 5) for i in range(1000)]
    batches = [build_batch([b"v%d" % i for i in range(n, n + 2)], keys[n : n + 2], timestamp_ms=1000)
               for n in range(0, 1000, 2)]  # 2 records a batch: 5 keys + 2 stay within the map's 7
    with Log.open(str(tmp_path / "bits-0"), LogConfig(segment_bytes=1 << 20)) as log:
        for data in batches:
            log.append(data, leader_epoch=0)
        log.roll()
        omap = OffsetMap(10 * BYTES_PER_ENTRY)
        assert omap.bitmap_words * 64 < 1000
        result = clean_log(log, upper_bound=log.log_end_offset, offset_map=omap)
        found = read_records(log.batches())
    assert result.done
    assert found == {offset: (b"k%d" % (offset % 5), b"v%d" % offset) for offset in range(995, 1000)}


def test_small_dedupe_buffer_cleans_in_passes_keeping_offsets(tmp_path: Path) -> None:
    keys = [[f"k{i % 30}".encode(), f"k{(i + 3) % 30}".encode()] for i in range(40)]
    batches = [build_batch([f"v{i}".encode()] * 2, keys[i], timestamp_ms=1000 + i) for i in range(40)]
    latest = {key: 2 * i + j for i in range(40) for j, key in enumerate(keys[i])}
    log = _log(tmp_path, batches)
    first = clean_log(log, upper_bound=log.log_end_offset, dedupe_buffer_bytes=12 * BYTES_PER_ENTRY)
    assert not first.done and 0 < first.end_offset < 80 and first_dirty_offset(log) == first.end_offset
    while not clean_log(log, upper_bound=log.log_end_offset, dedupe_buffer_bytes=12 * BYTES_PER_ENTRY).done:
        pass
    clean_log(log, upper_bound=log.log_end_offset)  # one pass over everything with a large map
    found = read_records(log.batches())
    assert {key: offset for offset, (key, _) in found.items()} == latest  # each key at its last offset
    log.close()


def test_codec_producer_batch_and_horizon(tmp_path: Path) -> None:
    producer = {"producer_id": 41, "producer_epoch": 3}
    batches = [
        build_batch([b"old", None], [b"a", b"t"], timestamp_ms=500, compression=4),
        build_batch([b"x"], [b"p"], timestamp_ms=501, base_sequence=0, **producer),
        build_batch([b"new", b"y"], [b"a", b"p"], timestamp_ms=502, compression=4),
        build_batch([b"z"], [b"a"], timestamp_ms=503, base_sequence=1, **producer),
        build_batch([b"final"], [b"a"], timestamp_ms=504),
    ]
    log = _log(tmp_path, batches)
    clean_log(log, upper_bound=log.log_end_offset, now_ms=10_000, delete_retention_ms=1_000)
    cleaned = list(log.batches())
    by_base = {h.base_offset: h for h in headers(cleaned)}
    assert sorted(by_base) == [0, 3, 5, 6]  # batch 2 keeps nothing: gone; offsets never renumbered
    first = by_base[0]
    assert first.compression == 4 and first.records_count == 1 and first.last_offset_delta == 1
    assert first.attributes & DELETE_HORIZON_FLAG_MASK and first.base_timestamp == 11_000
    assert by_base[3].compression == 4 and by_base[3].records_count == 1
    emptied = by_base[5]  # the producer's last batch: kept, empty, its sequence state intact
    assert (emptied.records_count, emptied.base_sequence, emptied.producer_epoch, emptied.last_offset_delta) \
        == (0, 1, 3, 0)
    assert read_records(cleaned) == {1: (b"t", None), 4: (b"p", b"y"), 6: (b"a", b"final")}
    for now_ms, tombstone_kept in ((10_500, True), (11_000, False)):
        log.append(build_batch([b"more"], [b"m"], timestamp_ms=600), leader_epoch=0)
        log.roll()
        clean_log(log, upper_bound=log.log_end_offset, now_ms=now_ms, delete_retention_ms=1_000)
        assert (1 in read_records(log.batches())) is tombstone_kept  # kept until its horizon
    log.close()


@pytest.mark.parametrize("later_in", ["the active segment", "a segment past the cleanable bound"])
def test_a_producers_emptied_batch_goes_when_its_later_batch_is_outside_the_pass(tmp_path: Path,
                                                                                later_in: str) -> None:
    """Only a producer's last batch in the whole log is kept empty: a later batch of the same producer in a
    segment the pass does not rewrite makes its emptied earlier batch disappear."""
    producer = {"producer_id": 41, "producer_epoch": 3}
    log = Log.open(str(tmp_path / "clean-0"), CONFIG)
    log.append(build_batch([b"x"], [b"a"], timestamp_ms=500, base_sequence=0, **producer), leader_epoch=0)
    log.append(build_batch([b"new"], [b"a"], timestamp_ms=501), leader_epoch=0)
    log.roll()
    log.append(build_batch([b"y"], [b"b"], timestamp_ms=502, base_sequence=1, **producer), leader_epoch=0)
    if later_in != "the active segment":
        log.roll()
    result = clean_log(log, upper_bound=2, now_ms=10_000)
    assert (result.start_offset, result.end_offset) == (0, 2)
    by_base = {h.base_offset: h for h in headers(list(log.batches()))}
    assert sorted(by_base) == [1, 2]  # batch 0 kept no record and is not producer 41's last: gone
    assert by_base[2].records_count == 1 and by_base[2].base_sequence == 1
    log.close()


def test_corrupt_batch_in_the_dirty_section_changes_nothing(tmp_path: Path) -> None:
    batches = [build_batch([b"v"] * 3, [b"a", b"b", b"a"], timestamp_ms=1000 + i) for i in range(20)]
    log = _log(tmp_path, batches)
    victim = log.segments[1]
    with open(victim.path, "r+b") as f:
        f.seek(RECORDS_OFFSET + 2)
        byte = f.read(1)
        f.seek(RECORDS_OFFSET + 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = _files(log.directory)
    with pytest.raises(CorruptRecordError, match=rf"{victim.path}: record batch at position 0 \(offsets"):
        clean_log(log, upper_bound=log.log_end_offset)
    assert _files(log.directory) == before
    log.close(clean=False)


def _flip_last_byte(path: str, batch_end: int) -> None:
    """Flip a bit of the batch's last byte (its CRC no longer matches)."""
    with open(path, "r+b") as f:
        f.seek(batch_end - 1)
        byte = f.read(1)[0]
        f.seek(batch_end - 1)
        f.write(bytes([byte ^ 1]))


def test_a_crc_mismatch_past_the_maps_end_stops_the_clean(tmp_path: Path) -> None:
    """The map fills in the middle of a segment: the batches after its end, which the pass copies, have
    their CRCs checked too, and a mismatch there stops the pass before anything changed."""
    batches = [build_batch([b"v"], [bytes([i])], timestamp_ms=1000 + i) for i in range(20)]
    log = _log(tmp_path, batches)
    segment = log.segments[0]
    assert segment.next_offset - segment.base_offset >= 6
    _flip_last_byte(segment.path, 6 * len(batches[0]))  # the sixth batch; the map holds 4 keys
    before = _files(log.directory)
    sixth = 5 * len(batches[0])
    expected = rf"{segment.path}: record batch at position {sixth} \(offsets 5\.\.5\): CRC mismatch"
    with pytest.raises(CorruptRecordError, match=expected + "; the log cannot be cleaned"):
        clean_log(log, upper_bound=log.log_end_offset, dedupe_buffer_bytes=4 * BYTES_PER_ENTRY + 52)
    assert _files(log.directory) == before
    log.close(clean=False)


def test_a_crc_mismatch_is_reported_before_records_that_do_not_parse(tmp_path: Path) -> None:
    """A segment with a batch whose records do not parse (its CRC right) and a later one whose CRC is
    wrong: the CRC mismatch is the error, as when every CRC of the segment is checked before its records
    are read."""
    good = build_batch([b"v"], [b"a"], timestamp_ms=999)
    bad = bytearray(build_batch([b"v"], [b"b"], timestamp_ms=1000))
    bad[RECORDS_OFFSET] = 0x7F  # the record's length runs past the section
    write_crc(bad, 0, len(bad))
    log = _log(tmp_path, [good, bytes(bad), good])
    segment = log.segments[0]
    assert segment.next_offset == 3
    _flip_last_byte(segment.path, 2 * len(good) + len(bad))
    with pytest.raises(CorruptRecordError, match=r"\(offsets 2\.\.2\): CRC mismatch"):
        clean_log(log, upper_bound=log.log_end_offset)
    log.close(clean=False)


def test_records_that_do_not_parse_stop_the_clean(tmp_path: Path) -> None:
    bad = bytearray(build_batch([b"v", b"w"], [b"a", b"b"], timestamp_ms=1000))
    bad[RECORDS_OFFSET] = 0x7F  # the first record's length runs past the section
    write_crc(bad, 0, len(bad))
    log = _log(tmp_path, [build_batch([b"v"], [b"a"], timestamp_ms=999), bytes(bad)])
    before = _files(log.directory)
    with pytest.raises(CorruptRecordError,
                       match=r"position \d+ \(offsets 1\.\.2\): its records do not parse"):
        clean_log(log, upper_bound=log.log_end_offset)
    assert _files(log.directory) == before
    log.close(clean=False)


def test_a_batch_larger_than_the_map_is_a_config_error(tmp_path: Path) -> None:
    log = _log(tmp_path, [build_batch([b"v"] * 20, [bytes([i]) for i in range(20)], timestamp_ms=1)])
    with pytest.raises(ConfigError, match=r"log\.cleaner\.dedupe\.buffer\.size"):
        clean_log(log, upper_bound=log.log_end_offset, dedupe_buffer_bytes=10 * BYTES_PER_ENTRY)
    log.close()


@pytest.mark.parametrize("point", ["clean.write", "clean.cleaned", "clean.deleted", "clean.indexes",
                                   "clean.swap", "clean.committed", "clean.unlinked"])
def test_a_failed_step_leaves_a_log_that_reads_the_same(tmp_path: Path, point: str) -> None:
    batches = [build_batch([f"v{i}".encode()], [b"k%d" % (i % 3)], timestamp_ms=1000 + i) for i in range(30)]
    log = _log(tmp_path, batches)
    before = read_records(log.batches())
    CLEAN_FAULTS.arm(point, "error")
    try:
        with pytest.raises(OSError, match=f"fault point {point}"):
            clean_log(log, upper_bound=log.log_end_offset)
    finally:
        CLEAN_FAULTS.disarm()
    during = read_records(log.batches())
    assert set(during) <= set(before) and all(before[o] == during[o] for o in during)
    assert not [n for n in os.listdir(log.directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
    log.close()
    with Log.open(str(tmp_path / "clean-0"), CONFIG) as again:
        assert read_records(again.batches()) == during
        clean_log(again, upper_bound=again.log_end_offset)
        assert sorted(read_records(again.batches())) == [27, 28, 29]


def test_a_key_in_the_cleaned_section_reappearing_later(tmp_path: Path) -> None:
    log = _log(tmp_path, [build_batch([b"1"], [b"a"], timestamp_ms=1),
                          build_batch([b"2"], [b"b"], timestamp_ms=2)])
    clean_log(log, upper_bound=log.log_end_offset)
    log.append(build_batch([b"3"], [b"a"], timestamp_ms=3), leader_epoch=0)
    log.roll()
    clean_log(log, upper_bound=log.log_end_offset)
    assert read_records(log.batches()) == {1: (b"b", b"2"), 2: (b"a", b"3")}
    assert parse_header(next(iter(log.batches()))).base_offset == 1
    log.close()


def test_write_selected_matches_its_python_twin(tmp_path: Path) -> None:
    """``write_selected`` (numba) and its ``py_func`` write the same bytes for a run with every action:
    copies, rewrites (a tombstone's delete horizon, LogAppendTime), a keyless record, a dropped batch and
    an idempotent producer's last batch kept empty."""
    batches = [
        build_batch([b"1", b"2", None], [b"a", b"b", b"t"], timestamp_ms=100),
        build_batch([b"3"], [b"c"], timestamp_ms=101, base_sequence=0, producer_id=7, producer_epoch=1),
        build_batch([b"4", b"k"], [b"a", None], timestamp_ms=102, timestamp_type=1),
        build_batch([b"5"], [b"c"], timestamp_ms=103),
        build_batch([b"6", b"7"], [b"b", b"d"], timestamp_ms=104),
    ]
    directory = tmp_path / "clean-0"
    with Log.open(str(directory), LogConfig(segment_bytes=1 << 20)) as log:
        for data in batches:
            log.append(data, leader_epoch=0)
        segment = log.segments[0]
    sizes = np.array([len(b) for b in batches], np.int64)
    positions = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    mapped_bytes = np.frombuffer(Path(segment.path).read_bytes()[: int(sizes.sum())], np.uint8)
    omap = OffsetMap(1 << 16)
    omap.clear(0)
    batch_entries = np.full(len(batches), -1, np.int64)
    index, omap.size, code, omap.entry_count = put_batches(
        mapped_bytes, positions, sizes, 0, omap.table, omap.size, omap.grow_at, omap.entries,
        omap.entry_count, batch_entries)
    assert (index, code) == (len(batches), 0) and (batch_entries >= 0).all()
    omap.mark_latest()
    marks = RecordMarks.make(64)
    results = np.empty((64, RESULT_COLUMNS), np.int64)
    index, code = select_batches(mapped_bytes, positions, sizes, 0, 2_000, 9, omap.table, omap.latest_bits,
                                 0, omap.entries, batch_entries, *marks, results)
    assert (index, code) == (len(batches), 0)
    producer_last = np.array([3], np.int64)  # the last offset of producer 7's last batch
    written = []
    for kernel in (write_selected, write_selected.py_func):
        out = np.zeros(output_bound(sizes, 0, len(batches), results), np.uint8)
        spans = np.zeros((len(batches), 2), np.int64)
        end, count = kernel(mapped_bytes, positions, sizes, 0, len(batches), results, *marks, 5_000,
                            producer_last, out, spans)
        fill_crcs(out, spans[:count])
        written.append(out[:end].tobytes())
    assert written[0] == written[1]
    cleaned = [written[0][h : h + 12 + int.from_bytes(written[0][h + 8 : h + 12], "big")]
               for h in _batch_starts(written[0])]
    assert read_records(cleaned) == {2: (b"t", None), 4: (b"a", b"4"), 6: (b"c", b"5"), 7: (b"b", b"6"),
                                     8: (b"d", b"7")}
    by_base = {h.base_offset: h for h in headers(cleaned)}
    assert sorted(by_base) == [0, 3, 4, 6, 7]
    assert by_base[0].base_timestamp == 5_000 and by_base[0].attributes & DELETE_HORIZON_FLAG_MASK
    assert by_base[3].records_count == 0 and by_base[3].base_sequence == 0  # producer 7's last batch
    assert by_base[4].records_count == 1  # the keyless record dropped; LogAppendTime's max timestamp kept:
    assert by_base[4].max_timestamp == parse_header(mapped_bytes.tobytes(), int(positions[2])).max_timestamp
    for data in cleaned:
        validate_batch(data)  # magic, length, CRC


def _batch_starts(data: bytes) -> list[int]:
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += 12 + int.from_bytes(data[at + 8 : at + 12], "big")
    return starts
