"""bench.e2e's pacing and wake-up count (the e2e latency bench's load generator)."""

from __future__ import annotations

import itertools
import os
import time

from bench.e2e import BURST_S, STAMP_BYTES, Load, _paced_send, wakeups


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []
        self.flushed = False

    def send(self, topic: str, value: bytes) -> None:
        self.sent.append((time.monotonic_ns(), value))

    def flush(self) -> None:
        self.flushed = True


def test_paced_send_goes_in_bursts_at_the_rate_each_record_stamped_as_sent() -> None:
    rate, records = 50_000.0, 4_000
    recorder = _Recorder()
    tails = [b"a" * 10, b"b" * 10]
    count, start, end = _paced_send(recorder, Load("t", tails, rate), records)
    assert count == records == len(recorder.sent) and recorder.flushed
    assert (end - start) / 1e9 >= (records - rate * BURST_S) / rate  # not faster than the rate
    stamps = [int.from_bytes(value[:STAMP_BYTES], "little") for _, value in recorder.sent]
    assert all(stamp <= at for stamp, (at, _) in zip(stamps, recorder.sent, strict=True))  # taken at send
    assert stamps == sorted(stamps)
    assert [value[STAMP_BYTES:] for _, value in recorder.sent[:3]] == [tails[0], tails[1], tails[0]]
    gaps = sum(1 for a, b in itertools.pairwise(stamps) if b - a > 0.5e9 / rate)
    assert gaps <= records / (rate * BURST_S) * 1.1 + 10  # a sleep per burst, not one per record or three


def test_wakeups_counts_this_process_sleeping() -> None:
    before = wakeups([os.getpid()])
    for _ in range(5):
        time.sleep(0.001)
    assert wakeups([os.getpid()]) >= before + 5
    assert wakeups([2**22 + 12345]) == 0  # a process that is not there counts nothing
