"""The writers' benchmark trace: rows flushed to a file and read back, offsets mapped to their round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from appliance.server.publish_trace import TRACE_DIR_ENV, PublishTrace, read_traces, round_times


def test_without_the_variable_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    assert PublishTrace.maybe_open("t", 0) is None


def test_rounds_are_read_back_and_each_offset_maps_to_the_round_that_published_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    trace = PublishTrace.maybe_open("t", 3)
    assert trace is not None
    ends = [5, 9, 10, 30]  # rounds publishing offsets 0-4, 5-8, 9, 10-29
    for round_, end in enumerate(ends):
        trace.round_start_ns = 1000 * (round_ + 1)
        trace.append_start_ns = 1000 * (round_ + 1) + 10
        trace.published(end)
    assert read_traces(str(tmp_path), "t", 3).size == 0  # nothing on disk before a flush
    trace.flush()
    rows = read_traces(str(tmp_path), "t", 3)
    assert rows["end_offset"].tolist() == ends
    assert read_traces(str(tmp_path), "t", 4).size == 0  # another partition's file would be its own

    offsets = np.arange(0, 32)
    found = round_times(rows, offsets)
    oracle = [next((i for i, end in enumerate(ends) if offset < end), None) for offset in offsets.tolist()]
    assert found["round_start_ns"].tolist() == [-1 if i is None else 1000 * (i + 1) for i in oracle]
    assert found["append_start_ns"].tolist() == [-1 if i is None else 1000 * (i + 1) + 10 for i in oracle]
    assert (found["published_ns"][found["round_start_ns"] > 0] > 0).all()
    assert round_times(rows[:0], offsets)["round_start_ns"].tolist() == [-1] * 32
