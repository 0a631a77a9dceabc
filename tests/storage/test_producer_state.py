"""Idempotent-producer state: verdicts against an oracle, snapshots, recovery, expiry."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_header import (
    BATCH_HEADER,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    parse_header,
)
from storage.errors import ApplianceError, ConfigError
from storage.producer_state import (
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    INVALID_TXN_STATE,
    NONE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    SNAPSHOT_HEADER,
    UNKNOWN_PRODUCER_ID,
    BatchMetadata,
    ProducerStateManager,
    list_snapshots,
    snapshot_path,
)

SEQ_MODULUS = 2**31
DAY_MS = 86_400_000


# -- batch headers, built as bytes and parsed back, as the writer and recovery see them


def make_header(
    producer_id: int,
    epoch: int,
    first_seq: int,
    count: int = 1,
    *,
    base_offset: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
    attributes: int = 0,
) -> BatchHeader:
    raw = BATCH_HEADER.pack(
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        -1,
        MAGIC,
        0,
        attributes,
        count - 1,
        timestamp_ms,
        timestamp_ms,
        producer_id,
        epoch,
        first_seq,
        count,
    )
    return parse_header(raw)


def stamped(header: BatchHeader, base_offset: int) -> BatchHeader:
    return header._replace(base_offset=base_offset)


class HeaderLog:
    """A real file of stamped batch headers, walked the way recovery walks a segment."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"")
        self.end_offset = 0

    def append(self, header: BatchHeader) -> BatchHeader:
        header = stamped(header, self.end_offset)
        with self.path.open("ab") as f:
            f.write(BATCH_HEADER.pack(*header))
        self.end_offset = header.next_offset
        return header

    def headers_from(self, offset: int) -> Iterator[BatchHeader]:
        data = self.path.read_bytes()
        for position in range(0, len(data), HEADER_SIZE):
            header = parse_header(data, position)
            if header.last_offset >= offset:
                yield header


def dedup_view(manager: ProducerStateManager) -> dict[int, tuple[int, tuple[BatchMetadata, ...]]]:
    """What deduplication depends on: epoch and remembered batches (not the expiry clock)."""
    return {pid: (e.epoch, tuple(e.batches)) for pid, e in manager.producers().items()}


# -- the oracle: every appended batch in a list, the rules written from Kafka's documented behaviour


@dataclass
class Appended:
    epoch: int
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass
class Oracle:
    expiration_ms: int = DAY_MS
    history: dict[int, list[Appended]] = field(default_factory=dict)
    last_append_ms: dict[int, int] = field(default_factory=dict)

    def verdict(self, h: BatchHeader) -> tuple[int, int]:
        """(error code, original base offset for a duplicate else -1)."""
        if h.producer_id < 0:
            return NONE, -1
        first, last = h.base_sequence, (h.base_sequence + h.last_offset_delta) % SEQ_MODULUS
        appended = self.history.get(h.producer_id)
        if not appended:
            return NONE, -1  # unknown producers are accepted at any sequence (Kafka >= 2.5)
        epoch = appended[-1].epoch
        if h.producer_epoch == epoch:
            window = [a for a in appended if a.epoch == epoch][-5:]
            for a in window:
                if (a.first_seq, a.last_seq) == (first, last):
                    return DUPLICATE_SEQUENCE_NUMBER, a.base_offset
            if first == (appended[-1].last_seq + 1) % SEQ_MODULUS:
                return NONE, -1
            return OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        if h.producer_epoch < epoch:
            return INVALID_PRODUCER_EPOCH, -1
        return (NONE, -1) if first == 0 else (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)

    def append(self, h: BatchHeader, base_offset: int, now_ms: int) -> None:
        if h.producer_id < 0:
            return
        last_seq = (h.base_sequence + h.last_offset_delta) % SEQ_MODULUS
        self.history.setdefault(h.producer_id, []).append(
            Appended(
                h.producer_epoch, h.base_sequence, last_seq, base_offset, base_offset + h.last_offset_delta
            )
        )
        self.last_append_ms[h.producer_id] = now_ms

    def expire(self, now_ms: int) -> set[int]:
        gone = {pid for pid, t in self.last_append_ms.items() if now_ms - t >= self.expiration_ms}
        for pid in gone:
            del self.history[pid]
            del self.last_append_ms[pid]
        return gone

    def expected_seq(self, pid: int, epoch: int, start: int) -> int:
        appended = self.history.get(pid)
        if not appended:
            return start
        if appended[-1].epoch != epoch:
            return 0
        return (appended[-1].last_seq + 1) % SEQ_MODULUS


PIDS = st.sampled_from([0, 1, 7])
COUNTS = st.integers(1, 4)
SEND_OPS = st.one_of(
    st.tuples(st.just("next"), PIDS, COUNTS),
    st.tuples(st.just("next"), PIDS, COUNTS),
    st.tuples(st.just("next"), PIDS, COUNTS),
    st.tuples(st.just("retry"), PIDS, st.integers(0, 8)),
    st.tuples(st.just("retry"), PIDS, st.integers(0, 8)),
    st.tuples(st.just("gap"), PIDS, st.integers(-3, 3), COUNTS),
    st.tuples(st.just("bump"), PIDS, st.booleans(), COUNTS),
    st.tuples(st.just("old_epoch"), PIDS, COUNTS),
    st.tuples(st.just("wild"), PIDS, st.integers(0, 3), st.integers(0, SEQ_MODULUS - 1), COUNTS),
    st.tuples(st.just("plain"), COUNTS),
)
SLEEPS_MS = st.one_of(st.integers(1, DAY_MS), st.sampled_from([DAY_MS - 2, DAY_MS - 1, DAY_MS]))
CLOCK_OPS = st.one_of(st.tuples(st.just("sleep"), SLEEPS_MS), st.tuples(st.just("expire")))
OPS = st.one_of(SEND_OPS, SEND_OPS, SEND_OPS, SEND_OPS, CLOCK_OPS)
STARTS = st.sampled_from([0, 0, 5, SEQ_MODULUS - 3, SEQ_MODULUS - 1])


@dataclass
class Run:
    """Drive a manager and the oracle through the same sends; assert every verdict agrees."""

    manager: ProducerStateManager = field(default_factory=lambda: ProducerStateManager("t-0"))
    oracle: Oracle = field(default_factory=Oracle)
    epochs: dict[int, int] = field(default_factory=dict)
    sent: dict[int, list[BatchHeader]] = field(default_factory=dict)
    log: list[BatchHeader] = field(default_factory=list)
    log_end_offset: int = 0
    now_ms: int = 1_700_000_000_000
    duplicates: int = 0
    verdicts: dict[int, int] = field(default_factory=dict)
    expired: set[int] = field(default_factory=set)

    def send(self, h: BatchHeader) -> None:
        self.now_ms += 1
        self.sent.setdefault(h.producer_id, []).append(h)
        verdict = self.manager.check(h)
        code, base_offset = self.oracle.verdict(h)
        assert verdict.code == code, (h, verdict, self.manager.describe(h, verdict))
        self.verdicts[code] = self.verdicts.get(code, 0) + 1
        if code == DUPLICATE_SEQUENCE_NUMBER:
            self.duplicates += 1
            assert verdict.base_offset == base_offset
            assert verdict.last_offset == base_offset + h.last_offset_delta
            assert verdict.max_timestamp_ms == h.max_timestamp
        if verdict.is_append:
            self.manager.update(h, self.log_end_offset, self.now_ms)
            self.oracle.append(h, self.log_end_offset, self.now_ms)
            self.log.append(stamped(h, self.log_end_offset))
            self.log_end_offset += h.last_offset_delta + 1

    def step(self, op: tuple[Any, ...], starts: dict[int, int]) -> None:
        kind = op[0]
        if kind == "plain":
            self.send(make_header(-1, -1, -1, int(op[1])))
            return
        if kind == "sleep":
            self.now_ms += int(op[1])
            return
        if kind == "expire":
            gone = set(self.manager.expire(self.now_ms))
            assert gone == self.oracle.expire(self.now_ms)
            self.expired |= gone
            return
        pid = int(op[1])
        epoch = self.epochs.setdefault(pid, 0)
        expected = self.oracle.expected_seq(pid, epoch, starts[pid])
        if kind == "next":
            self.send(make_header(pid, epoch, expected, int(op[2])))
        elif kind == "retry":
            sent = self.sent.get(pid)
            if sent:
                self.send(sent[-1 - int(op[2]) % len(sent)])
        elif kind == "gap":
            seq = (expected + int(op[2])) % SEQ_MODULUS
            self.send(make_header(pid, epoch, seq, int(op[3])))
        elif kind == "bump":
            self.epochs[pid] = epoch + 1
            seq = 0 if op[2] else 1 + expected % 100
            self.send(make_header(pid, epoch + 1, seq, int(op[3])))
        elif kind == "old_epoch":
            if epoch > 0:
                self.send(make_header(pid, epoch - 1, expected, int(op[2])))
        elif kind == "wild":
            wild_epoch = max(0, epoch + int(op[2]) - 2)
            self.send(make_header(pid, wild_epoch, int(op[3]), int(op[4])))


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(OPS, min_size=20, max_size=120),
    starts=st.fixed_dictionaries({0: STARTS, 1: STARTS, 7: STARTS}),
)
def test_verdicts_match_the_oracle(ops: list[tuple[Any, ...]], starts: dict[int, int]) -> None:
    run = Run()
    for op in ops:
        run.step(op, starts)
    # The live state of every producer that never expired is what a rebuild from the log gives.  One that
    # expired and came back holds fewer batches than the log (it restarted as unknown), but the same epoch and
    # last batch: the next in-sequence batch gets the same verdict either way.
    rebuilt = ProducerStateManager("t-0")
    rebuilt.rebuild_from(run.log, append_time_ms=run.now_ms)
    from_log = dedup_view(rebuilt)
    for pid, (epoch, batches) in dedup_view(run.manager).items():
        if pid in run.expired:
            assert (from_log[pid][0], from_log[pid][1][-1]) == (epoch, batches[-1])
        else:
            assert from_log[pid] == (epoch, batches)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(SEND_OPS, min_size=1, max_size=80),
    snapshot_at=st.floats(0, 1),
    truncate_at=st.floats(0, 1),
    starts=st.fixed_dictionaries({0: STARTS, 1: STARTS, 7: STARTS}),
)
def test_snapshot_recovery_and_truncation_equal_a_rebuild(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[Any, ...]],
    snapshot_at: float,
    truncate_at: float,
    starts: dict[int, int],
) -> None:
    directory = tmp_path_factory.mktemp("partition")
    log = HeaderLog(directory / "headers")
    run = Run()
    snapshot_step = int(snapshot_at * len(ops))
    for i, op in enumerate(ops):
        if i == snapshot_step:
            run.manager.write_snapshot(directory, run.log_end_offset)
        run.step(op, starts)
    for h in run.log:
        assert log.append(h) == h
    assert log.end_offset == run.log_end_offset
    now_ms = run.now_ms + 5

    # The snapshot round trip is exact, the expiry clock included.
    run.manager.write_snapshot(directory, run.log_end_offset)
    loaded = ProducerStateManager("t-0")
    assert loaded.load_latest_snapshot(directory, log_end_offset=run.log_end_offset) == run.log_end_offset
    assert loaded.producers() == run.manager.producers()

    # Recovery from the older snapshot plus the tail equals a rebuild from the whole log.
    snapshots = list_snapshots(directory)
    assert len(snapshots) <= 2
    snapshot_path(directory, snapshots[-1]).unlink()
    recovered = ProducerStateManager("t-0")
    start = recovered.recover(
        directory, log_end_offset=log.end_offset, headers_from=log.headers_from, append_time_ms=now_ms
    )
    assert start == (snapshots[0] if len(snapshots) == 2 else 0)
    assert dedup_view(recovered) == dedup_view(run.manager)

    # Truncation: the state equals a rebuild from the batches that remain; snapshots above it are gone.
    cuts = [h.base_offset for h in run.log] + [run.log_end_offset]
    cut = cuts[int(truncate_at * (len(cuts) - 1))]
    recovered.truncate_to(cut, directory, headers_from=log.headers_from, append_time_ms=now_ms)
    expected = ProducerStateManager("t-0")
    expected.rebuild_from([h for h in run.log if h.base_offset < cut], append_time_ms=now_ms)
    assert dedup_view(recovered) == dedup_view(expected)
    assert all(offset <= cut for offset in list_snapshots(directory))


# -- the rules, one by one


def append(manager: ProducerStateManager, h: BatchHeader, base_offset: int, now_ms: int = 0) -> None:
    assert manager.check(h).code == NONE, manager.describe(h, manager.check(h))
    manager.update(h, base_offset, now_ms)


def test_batches_without_producer_id_are_always_appended_and_leave_no_state() -> None:
    manager = ProducerStateManager("t-0")
    plain = make_header(-1, -1, -1, 3)
    for i in range(3):
        assert manager.check(plain).is_append
        manager.update(plain, i * 3, 0)
    assert len(manager) == 0


def test_retries_of_the_last_five_batches_are_duplicates_with_their_offsets() -> None:
    manager = ProducerStateManager("t-0")
    batches = [make_header(42, 0, seq * 2, 2, timestamp_ms=1000 + seq) for seq in range(7)]
    for i, h in enumerate(batches):
        append(manager, h, 100 + 10 * i)
    for i, h in enumerate(batches[2:], start=2):
        verdict = manager.check(h)
        assert verdict.is_duplicate
        assert (verdict.base_offset, verdict.last_offset) == (100 + 10 * i, 100 + 10 * i + 1)
        assert verdict.max_timestamp_ms == 1000 + i
    # Older than the last five: Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER.
    assert manager.check(batches[0]).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert manager.check(batches[1]).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    # Same first sequence but a different range is not a duplicate.
    assert manager.check(make_header(42, 0, 12, 1)).code == OUT_OF_ORDER_SEQUENCE_NUMBER


def test_gaps_and_overlaps_are_out_of_order_and_change_nothing() -> None:
    manager = ProducerStateManager("t-0")
    append(manager, make_header(5, 0, 0, 10), 0)
    before = manager.producers()
    assert manager.check(make_header(5, 0, 11, 1)).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert manager.check(make_header(5, 0, 9, 2)).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert manager.producers() == before
    assert manager.check(make_header(5, 0, 10, 1)).is_append


def test_epochs_fence_zombies_and_a_new_epoch_restarts_at_zero() -> None:
    manager = ProducerStateManager("t-0")
    append(manager, make_header(9, 3, 0, 5), 0)
    assert manager.check(make_header(9, 2, 5, 1)).code == INVALID_PRODUCER_EPOCH
    assert manager.check(make_header(9, 2, 0, 5)).code == INVALID_PRODUCER_EPOCH  # even a "duplicate"
    assert manager.check(make_header(9, 4, 5, 1)).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    append(manager, make_header(9, 4, 0, 2), 5)
    entry = manager.entry(9)
    assert entry is not None and entry.epoch == 4 and len(entry.batches) == 1
    assert manager.check(make_header(9, 3, 0, 5)).code == INVALID_PRODUCER_EPOCH
    assert manager.check(make_header(9, 4, 0, 2)).is_duplicate


def test_unknown_producers_are_accepted_at_any_sequence_unless_strict() -> None:
    lenient = ProducerStateManager("t-0")
    assert lenient.check(make_header(3, 0, 1234, 1)).is_append
    assert lenient.check(make_header(3, 7, 0, 1)).is_append
    strict = ProducerStateManager("t-0", strict_unknown_producer=True)
    assert strict.check(make_header(3, 0, 1234, 1)).code == UNKNOWN_PRODUCER_ID
    assert strict.check(make_header(3, 0, 0, 1)).is_append
    append(strict, make_header(3, 0, 0, 1), 0)
    assert strict.check(make_header(3, 0, 1, 1)).is_append


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    manager = ProducerStateManager("t-0")
    top = SEQ_MODULUS - 2
    append(manager, make_header(1, 0, top, 4), 0)  # sequences 2**31-2, 2**31-1, 0, 1
    entry = manager.entry(1)
    assert entry is not None and entry.last_seq == 1
    assert manager.check(make_header(1, 0, top, 4)).is_duplicate
    assert manager.check(make_header(1, 0, 2, 1)).is_append
    assert manager.check(make_header(1, 0, 0, 1)).code == OUT_OF_ORDER_SEQUENCE_NUMBER
    append(manager, make_header(1, 0, 2, SEQ_MODULUS - 2), 4)  # 2 .. 2**31-1
    assert manager.check(make_header(1, 0, 0, 1)).is_append


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (make_header(4, 0, -1, 1), INVALID_RECORD),  # producer id without a sequence
        (make_header(4, -1, 0, 1), INVALID_RECORD),  # producer id without an epoch
        (make_header(4, 0, 0, 1, attributes=CONTROL_FLAG_MASK), INVALID_RECORD),
        (make_header(-1, -1, -1, 1, attributes=CONTROL_FLAG_MASK), INVALID_RECORD),
        (make_header(4, 0, 0, 1, attributes=TRANSACTIONAL_FLAG_MASK), INVALID_TXN_STATE),
    ],
)
def test_batches_a_client_may_not_send_are_refused(header: BatchHeader, code: int) -> None:
    manager = ProducerStateManager("t-0")
    append(manager, make_header(4, 0, 0, 1), 0)
    before = manager.producers()
    assert manager.check(header).code == code
    assert manager.producers() == before


def test_a_drain_sees_its_own_earlier_batches() -> None:
    """check + update in order: a producer's second batch in one writev is in sequence, its retry is not."""
    manager = ProducerStateManager("t-0")
    drain = [
        make_header(1, 0, 0, 3),
        make_header(2, 0, 0, 1),
        make_header(1, 0, 3, 2),
        make_header(1, 0, 0, 3),
    ]
    log_end_offset = 0
    outcomes = []
    for h in drain:
        verdict = manager.check(h)
        outcomes.append((verdict.code, verdict.base_offset))
        if verdict.is_append:
            manager.update(h, log_end_offset, 0)
            log_end_offset += h.records_count
    assert outcomes == [(NONE, -1), (NONE, -1), (NONE, -1), (DUPLICATE_SEQUENCE_NUMBER, 0)]
    assert log_end_offset == 6


def test_expiry_forgets_idle_producers_who_then_count_as_unknown() -> None:
    manager = ProducerStateManager("t-0", producer_id_expiration_ms=1000)
    append(manager, make_header(1, 0, 0, 1), 0, now_ms=10_000)
    append(manager, make_header(2, 0, 0, 1), 1, now_ms=10_500)
    assert manager.expire(10_999) == []
    assert manager.expire(11_000) == [1]
    assert manager.entry(1) is None and manager.entry(2) is not None
    assert manager.check(make_header(1, 0, 77, 1)).is_append  # unknown now: any sequence
    with pytest.raises(ConfigError, match=r"producer\.id\.expiration\.ms"):
        ProducerStateManager("t-0", producer_id_expiration_ms=0)


def test_replayed_batches_take_the_recovery_time_not_their_own_timestamps() -> None:
    manager = ProducerStateManager("t-0")
    old = stamped(make_header(1, 0, 0, 1, timestamp_ms=0), 0)  # a backfill with 1970 timestamps
    manager.rebuild_from([old], append_time_ms=5 * DAY_MS)
    assert manager.expire(5 * DAY_MS + 1) == []
    entry = manager.entry(1)
    assert entry is not None and entry.batches[0].max_timestamp_ms == 0


def test_describe_names_the_partition_producer_and_expected_sequence() -> None:
    manager = ProducerStateManager("orders-3")
    append(manager, make_header(11, 2, 0, 4), 0)
    h = make_header(11, 2, 9, 1)
    text = manager.describe(h, manager.check(h))
    assert "orders-3" in text and "producer 11" in text and "next sequence 4" in text and "error 45" in text


# -- snapshots: round trip, retention, damage of every kind


def populated(n_producers: int = 3) -> ProducerStateManager:
    manager = ProducerStateManager("t-0")
    offset = 0
    for pid in range(n_producers):
        for seq in range(0, 7 * 3, 3):
            append(manager, make_header(pid, pid, seq, 3), offset, now_ms=1000 + offset)
            offset += 3
    return manager


def test_snapshot_round_trip_and_only_the_newest_two_are_kept(tmp_path: Path) -> None:
    ProducerStateManager("t-0").write_snapshot(tmp_path, 10)
    populated(1).write_snapshot(tmp_path, 21)
    manager = populated()
    manager.write_snapshot(tmp_path, 63)
    assert list_snapshots(tmp_path) == [21, 63]
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000021.snapshot", "00000000000000000063.snapshot"]
    loaded = ProducerStateManager("t-0")
    assert loaded.load_latest_snapshot(tmp_path) == 63
    assert loaded.producers() == manager.producers()
    assert len(loaded.producers()[0].batches) == 5


def test_a_snapshot_below_the_state_it_describes_is_refused(tmp_path: Path) -> None:
    manager = populated(1)  # its batches end at offset 20
    with pytest.raises(ApplianceError, match=r"t-0: snapshot at offset 20 .* producer 0 .* 18\.\.20"):
        manager.write_snapshot(tmp_path, 20)
    assert list_snapshots(tmp_path) == []


def test_empty_state_and_absent_directory(tmp_path: Path) -> None:
    manager = ProducerStateManager("t-0")
    assert manager.load_latest_snapshot(tmp_path / "nowhere") is None
    manager.write_snapshot(tmp_path, 0)
    assert manager.load_latest_snapshot(tmp_path) == 0 and len(manager) == 0


def damaged_copies(data: bytes) -> Iterator[bytes]:
    for i in range(len(data)):  # every single byte flipped
        yield data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]
    for n in range(len(data)):  # every truncation
        yield data[:n]
    yield data + b"\x00"
    yield data + b"trailing"
    yield bytes(random.Random(1).randbytes(len(data)))


def test_a_damaged_snapshot_is_ignored_deleted_and_the_older_one_used(tmp_path: Path) -> None:
    older = populated(1)
    older.write_snapshot(tmp_path, 21)
    newer = populated(2)
    good = newer.snapshot_bytes(42)
    copies = 0
    for data in damaged_copies(good):
        snapshot_path(tmp_path, 42).write_bytes(data)
        loaded = ProducerStateManager("t-0")
        assert loaded.load_latest_snapshot(tmp_path) == 21, data
        assert loaded.producers() == older.producers()
        assert list_snapshots(tmp_path) == [21]
        copies += 1
    assert copies > 2 * len(good)
    for data in damaged_copies(older.snapshot_bytes(21)):
        snapshot_path(tmp_path, 21).write_bytes(data)
        loaded = populated(1)
        assert loaded.load_latest_snapshot(tmp_path) is None
        assert len(loaded) == 0
        assert list_snapshots(tmp_path) == []


def test_a_snapshot_under_another_name_or_above_the_log_end_is_not_used(tmp_path: Path) -> None:
    manager = populated(1)
    snapshot_path(tmp_path, 30).write_bytes(manager.snapshot_bytes(21))  # content says 21, name says 30
    assert ProducerStateManager("t-0").load_latest_snapshot(tmp_path) is None
    manager.write_snapshot(tmp_path, 21)
    manager.write_snapshot(tmp_path, 60)
    loaded = ProducerStateManager("t-0")
    assert loaded.load_latest_snapshot(tmp_path, log_end_offset=59) == 21
    assert list_snapshots(tmp_path) == [21]


def test_a_snapshot_with_batches_at_or_above_its_offset_is_not_used(tmp_path: Path) -> None:
    data = bytearray(populated(1).snapshot_bytes(21))  # its batches end at offset 20
    magic, version, reserved, _crc, count, _offset = SNAPSHOT_HEADER.unpack_from(data)
    SNAPSHOT_HEADER.pack_into(data, 0, magic, version, reserved, 0, count, 20)  # relabelled as offset 20
    struct.pack_into(">I", data, 8, crc32c.crc32c(data[12:]))  # with a valid CRC
    snapshot_path(tmp_path, 20).write_bytes(bytes(data))
    assert ProducerStateManager("t-0").load_latest_snapshot(tmp_path) is None
    assert list_snapshots(tmp_path) == []


def test_a_leftover_temporary_file_is_removed(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000050.snapshot.tmp").write_bytes(b"half written")
    populated(1).write_snapshot(tmp_path, 21)
    assert ProducerStateManager("t-0").load_latest_snapshot(tmp_path) == 21
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000021.snapshot"]


def test_recover_without_snapshots_reads_the_whole_log(tmp_path: Path) -> None:
    log = HeaderLog(tmp_path / "headers")
    live = ProducerStateManager("t-0")
    for seq in range(0, 30, 3):
        h = log.append(make_header(8, 1, seq, 3))
        live.update(h, h.base_offset, 0)
    recovered = ProducerStateManager("t-0")
    assert recovered.recover(None, log_end_offset=30, headers_from=log.headers_from, append_time_ms=0) == 0
    assert recovered.producers() == live.producers()
    # A log whose end lies inside the last batch (torn append) does not count that batch.
    recovered.recover(tmp_path, log_end_offset=29, headers_from=log.headers_from, append_time_ms=0)
    entry = recovered.entry(8)
    assert entry is not None and entry.last_seq == 26
