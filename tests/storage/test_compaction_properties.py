"""Stateful property test: a compacted log against a model of Kafka's cleaning rules (``compaction_oracle``).

Steps: appends (keys from a small set, keyless records, values and tombstones, idempotent producers, every
codec), rolls, cleans with random upper bounds and small dedupe buffers (several passes), the clock moving
(tombstones reaching their horizon), and reopening (cleanly or as after a crash).  After every step the log,
and a LogReader on the same directory, read from the start exactly as the model says (offsets, keys,
values); the batches at or past the first dirty offset are byte for byte as appended; every producer's last
batch (offsets, epoch, base sequence) is unchanged; every batch keeps its codec.
"""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from compaction_oracle import Model, headers, horizons, producer_last_batches, read_records
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.cleaner import clean_log, first_dirty_offset
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import open_read_only
from storage.offset_map import BYTES_PER_ENTRY

DELETE_RETENTION_MS = 1_000
KEYS = [b"a", b"b", b"c", b"d", b"e", b"f", None]
records = st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=0, max_size=12))),
                   min_size=1, max_size=5)


class CompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="compactprop-")
        self.directory = f"{self.root}/compact-0"
        self.model = Model()
        self.appended: dict[int, bytes] = {}  # base offset -> the batch as stored
        self.codecs: dict[int, int] = {}
        self.producers: dict[int, tuple[int, int, int, int]] = {}
        self.sequences = {7001: 0, 7002: 0}
        self.clock = 1_000_000
        self.log: Log | None = None

    @initialize(segment_bytes=st.sampled_from([300, 700, 2000]))
    def open_log(self, segment_bytes: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=128)
        self.log = Log.open(self.directory, self.config)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close(clean=False)
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def current(self) -> Log:
        assert self.log is not None
        return self.log

    @rule(batch=records, codec=st.sampled_from([0, 0, 1, 2, 3, 4]),
          producer=st.sampled_from([None, 7001, 7002]))
    def append(self, batch: list[tuple[bytes | None, bytes | None]], codec: int,
               producer: int | None) -> None:
        keys = [k for k, _ in batch]
        values = [v for _, v in batch]
        self.clock += 1
        fields = {}
        if producer is not None:
            fields = {"producer_id": producer, "producer_epoch": 0, "base_sequence": self.sequences[producer]}
            self.sequences[producer] += len(batch)
        data = build_batch(values, keys, timestamp_ms=self.clock, compression=codec, **fields)
        info = self.current.append(data, leader_epoch=0)
        base = info.first_offset
        self.model.append(base, keys, values)
        stored = next(iter(self.current.batches(base)))
        assert parse_header(stored).base_offset == base
        self.appended[base] = stored
        self.codecs[base] = codec
        if producer is not None:
            self.producers[producer] = (base, info.last_offset, 0, fields["base_sequence"])

    @rule()
    def roll(self) -> None:
        self.current.roll()

    @rule(ms=st.integers(0, 1500))
    def time_passes(self, ms: int) -> None:
        self.clock += ms

    @rule(fraction=st.floats(0, 1), slots=st.integers(6, 40))
    def clean(self, fraction: float, slots: int) -> None:
        log = self.current
        start = log.log_start_offset
        upper = start + round((log.log_end_offset - start) * fraction)
        before = first_dirty_offset(log)
        result = clean_log(log, upper_bound=upper, now_ms=self.clock,
                           dedupe_buffer_bytes=slots * BYTES_PER_ENTRY * 4 // 3,  # the records' slots: 1/4
                           delete_retention_ms=DELETE_RETENTION_MS)
        assert result.start_offset == before
        assert before <= result.end_offset <= max(before, min(upper, log.segments[-1].base_offset))
        if result.end_offset > before:
            self.model.clean(result.end_offset, self.clock, DELETE_RETENTION_MS)
            assert first_dirty_offset(log) == result.end_offset

    @rule(clean_close=st.booleans())
    def reopen(self, clean_close: bool) -> None:
        self.current.close(clean=clean_close)
        self.log = None
        self.log = Log.open(self.directory, self.config)

    @precondition(lambda self: self.log is not None)
    @invariant()
    def reads_as_the_model(self) -> None:
        batches = list(self.current.batches())
        assert read_records(batches) == self.model.records
        assert producer_last_batches(batches) == self.producers
        got = horizons(batches)
        for base, horizon in got.items():
            assert self.model.horizons.get(base) == horizon
        for offset, (_, value) in self.model.records.items():
            base = self.model.batch_of[offset]
            if value is None and base in self.model.horizons:
                assert got[base] == self.model.horizons[base]
        dirty = first_dirty_offset(self.current)
        for data in batches:
            header = parse_header(data)
            if header.base_offset >= dirty:
                assert data == self.appended[header.base_offset]
            if header.records_count:
                assert header.compression == self.codecs[header.base_offset]
        assert [h.base_offset for h in headers(batches)] == sorted(h.base_offset for h in headers(batches))
        reader = open_read_only(self.directory)
        try:
            assert list(reader.batches()) == batches
        finally:
            reader.close()


CompactionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCompactionAgainstModel = pytest.mark.slow(CompactionMachine.TestCase)
