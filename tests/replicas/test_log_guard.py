"""The hand-shake between a follower's fetcher and its adoption thread (``replicas.log_guard``), with real
threads: a cut waits for the pass in progress to stop and then holds the lock; closing the log stops the
pass and waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from replicas.log_guard import LogGuard, PassStopped


def _pass(guard: LogGuard, events: list[str], entered: threading.Event) -> None:
    """A pass that reads 'segments' until asked to stop."""
    with guard.cleaning():
        entered.set()
        try:
            for _ in range(2000):
                guard.check_cut()
                time.sleep(0.005)
            events.append("pass ran to its end")
        except PassStopped:
            time.sleep(0.05)  # unlinking its files: the cut still waits
            events.append("pass stopped")


def test_a_cut_stops_the_pass_in_progress_and_waits_for_it() -> None:
    guard = LogGuard()
    events: list[str] = []
    entered = threading.Event()
    cleaner = threading.Thread(target=_pass, args=(guard, events, entered))
    cleaner.start()
    try:
        assert entered.wait(5)
        with guard.cutting():
            events.append("cut")
            assert guard.lock.locked()
    finally:
        cleaner.join(10)
    assert events == ["pass stopped", "cut"]
    with guard.cleaning():  # the next pass runs
        guard.check_cut()


def test_a_cut_with_no_pass_in_progress_does_not_wait_and_leaves_the_next_pass_alone() -> None:
    guard = LogGuard()
    with guard.cutting():
        assert guard.lock.locked()
    assert not guard.lock.locked()
    with guard.cleaning():
        guard.check_cut()


def test_closing_the_log_stops_the_pass_in_progress_and_refuses_the_next() -> None:
    guard = LogGuard()
    events: list[str] = []
    entered = threading.Event()
    cleaner = threading.Thread(target=_pass, args=(guard, events, entered))
    cleaner.start()
    try:
        assert entered.wait(5)
        guard.close()
        events.append("closed")
    finally:
        cleaner.join(10)
    assert events == ["pass stopped", "closed"]
    with guard.cleaning(), pytest.raises(PassStopped):
        guard.check_cut()
