"""Stateful property test: the log against a list of batches (the oracle).

Every step may append (as leader or follower), read with random limits, truncate, roll, apply retention, or
close and reopen (cleanly or as a crash).  After every step the log and a LogReader on the same directory
hold exactly the oracle's batches, byte for byte, with dense offsets.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from batchgen import build_batch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from storage.batch_header import parse_header
from storage.errors import OffsetOutOfRangeError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader


@dataclass
class Stored:
    base: int
    last: int
    data: bytes
    max_timestamp: int


batch_specs = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 120), st.integers(-50, 400)),  # records, value size, ts step
    min_size=1,
    max_size=4,
)


def _last_size(data: bytes) -> int:
    position = 0
    while True:
        size = parse_header(data, position).size
        if position + size == len(data):
            return size
        position += size


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="logprop-")
        self.directory = f"{self.root}/prop-0"
        self.oracle: list[Stored] = []
        self.start = 0
        self.end = 0
        self.epoch = 0
        self.clock = 1_000_000
        self.log: Log | None = None

    @initialize(
        segment_bytes=st.sampled_from([200, 700, 3000]),
        interval=st.sampled_from([0, 64, 1000]),
        index_bytes=st.sampled_from([24, 100, 4096]),
        retention_bytes=st.sampled_from([-1, 500, 2000]),
        retention_ms=st.sampled_from([-1, 2000]),
    )
    def open_log(self, segment_bytes: int, interval: int, index_bytes: int, retention_bytes: int,
                 retention_ms: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval,
                                segment_index_bytes=index_bytes, retention_bytes=retention_bytes,
                                retention_ms=retention_ms)
        self.log = Log.open(self.directory, self.config)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close(clean=False)
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def current(self) -> Log:
        assert self.log is not None
        return self.log

    def _build(self, specs: list[tuple[int, int, int]], base: int, epoch: int) -> list[bytearray]:
        out = []
        for records, value_size, step in specs:
            self.clock += step
            out.append(build_batch([bytes([65 + i]) * value_size for i in range(records)], base_offset=base,
                                   timestamp_ms=self.clock, leader_epoch=epoch))
            base += records
        return out

    def _remember(self, batches: list[bytearray]) -> None:
        for b in batches:
            h = parse_header(b)
            assert h.base_offset == self.end, "offsets must be dense"
            self.oracle.append(Stored(h.base_offset, h.last_offset, bytes(b), h.max_timestamp))
            self.end = h.last_offset + 1

    @rule(specs=batch_specs)
    def append(self, specs: list[tuple[int, int, int]]) -> None:
        batches = self._build(specs, base=12345, epoch=-1)
        buf = bytearray(b"".join(batches))
        info = self.current.append(buf, leader_epoch=self.epoch)
        assert info.first_offset == self.end and info.batch_count == len(batches)
        # the caller's buffer now holds exactly the stored bytes
        stored, position = [], 0
        for b in batches:
            stored.append(buf[position : position + len(b)])
            position += len(b)
        self._remember(stored)
        assert info.last_offset == self.end - 1

    @rule(specs=batch_specs, bump=st.booleans())
    def append_as_follower(self, specs: list[tuple[int, int, int]], bump: bool) -> None:
        self.epoch += int(bump)
        batches = self._build(specs, base=self.end, epoch=self.epoch)
        self.current.append_as_follower(b"".join(batches))
        self._remember(batches)

    @rule()
    def bump_epoch(self) -> None:
        self.epoch += 1

    def _expected_read(self, offset: int, max_bytes: int, hw: int | None) -> bytes:
        """The exact bytes a read must return: whole batches from the one holding ``offset``, within one
        segment, at least one, then while they fit ``max_bytes``, none reaching ``hw``."""
        if offset == self.end:
            return b""
        i = next(k for k, s in enumerate(self.oracle) if s.last >= offset)
        if hw is not None and self.oracle[i].last >= hw:
            return b""
        bases = self._bases()
        segment_end = min((b for b in bases if b > self.oracle[i].base), default=None)
        taken = [self.oracle[i].data]
        total, limit = len(taken[0]), max(max_bytes, len(taken[0]))
        for stored in self.oracle[i + 1 :]:
            if (segment_end is not None and stored.base >= segment_end) or total + len(stored.data) > limit:
                break
            if hw is not None and stored.last >= hw:
                break
            taken.append(stored.data)
            total += len(stored.data)
        return b"".join(taken)

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end), label="offset")
        max_bytes = data.draw(st.integers(0, 1500), label="max_bytes")
        hw = data.draw(st.none() | st.integers(self.start, self.end), label="max_offset")
        piece = self.current.read(offset, max_bytes, max_offset=hw)
        got = piece.read_bytes()
        assert got == self._expected_read(offset, max_bytes, hw)
        if got:
            first = parse_header(got)
            assert piece.first_offset == first.base_offset <= offset <= first.last_offset
            assert piece.next_offset == parse_header(got, len(got) - _last_size(got)).last_offset + 1

    @precondition(lambda self: self.log is not None)
    @invariant()
    def reads_at_every_offset(self) -> None:
        for k, offset in enumerate(range(self.start, self.end + 1)):
            max_bytes = (0, 150, 400, 1 << 20)[k % 4]
            hw = None if k % 3 else self.end - k % 5
            hw = None if hw is not None and hw < self.start else hw
            assert self.current.read(offset, max_bytes, max_offset=hw).read_bytes() == self._expected_read(
                offset, max_bytes, hw), (offset, max_bytes, hw)

    def _bases(self) -> list[int]:
        return [s.base_offset for s in self.current.segments]

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from([self.start - 1, self.end + 1, self.end + 1000]))
        try:
            self.current.read(offset, 100)
        except OffsetOutOfRangeError as error:
            assert str(offset) in str(error)
        else:
            raise AssertionError(f"offset {offset} outside [{self.start}, {self.end}] was read")

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(max(0, self.start - 3), self.end + 2), label="truncate_to")
        new_end = self.current.truncate_to(offset)
        if offset >= self.end:
            assert new_end == self.end
        elif offset < self.start:  # below the first segment: emptied, restarted at offset
            self.oracle, self.start, self.end = [], offset, offset
        else:  # the batch holding offset goes whole
            self.oracle = [s for s in self.oracle if s.last < offset]
            self.end = self.oracle[-1].last + 1 if self.oracle else self.start
        assert new_end == self.end

    @rule()
    def roll(self) -> None:
        self.current.roll()

    @rule(advance=st.integers(0, 5000), use_hw=st.booleans())
    def retention(self, advance: int, use_hw: bool) -> None:
        now = self.clock + advance
        before = self.current.segments
        hw = self.end - 1 if use_hw else None
        deleted = self.current.delete_retained_segments(now, high_watermark=hw)
        after = self.current.segments
        assert after == before[deleted:] and after[-1].is_active
        if deleted:
            self.start = after[0].base_offset
            self.oracle = [s for s in self.oracle if s.base >= self.start]
            total = sum(s.size_bytes for s in before)
            for k, seg in enumerate(before[:deleted]):
                expired = self.config.retention_ms >= 0 and now - seg.max_timestamp > self.config.retention_ms
                remaining = total - sum(s.size_bytes for s in before[: k + 1])
                too_big = self.config.retention_bytes >= 0 and remaining >= self.config.retention_bytes
                assert expired or too_big, f"segment {seg} deleted without a reason"
                assert hw is None or seg.next_offset <= hw
        assert self.current.delete_retained_segments(now, high_watermark=hw) == 0
        assert self.current.log_start_offset == self.start

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        self.current.close(clean=clean)
        self.log = Log.open(self.directory, self.config)

    @precondition(lambda self: self.log is not None)
    @invariant()
    def same_as_oracle(self) -> None:
        log = self.current
        assert (log.log_start_offset, log.log_end_offset) == (self.start, self.end)
        assert list(log.batches()) == [s.data for s in self.oracle]
        assert log.size_bytes == sum(len(s.data) for s in self.oracle)
        bases = self._bases()
        assert bases == sorted(bases) and bases[0] <= self.start


def _reader_agrees(machine: LogMachine) -> None:
    with LogReader(machine.directory, machine.config) as reader:
        assert reader.log_start_offset == machine.start
        assert reader.log_end_offset == machine.end
        assert list(reader.batches()) == [s.data for s in machine.oracle]


class LogMachineWithReader(LogMachine):
    @precondition(lambda self: self.log is not None)
    @invariant()
    def reader_agrees(self) -> None:
        _reader_agrees(self)


LogMachineWithReader.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogAgainstOracle = pytest.mark.slow(LogMachineWithReader.TestCase)
