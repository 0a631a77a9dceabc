"""Readers sleeping on a state page's high watermark (futexes): woken by the publish, across processes, and
never left asleep when a publish races their sleep."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ipc.state_page as state_page
from ipc.shm import unlink_shared_memory
from ipc.state_page import StatePage, wait_for_high_watermarks
from ipc.wakeup import FUTEX_WAITV_AVAILABLE, futex_wait_any, futex_wake

pytestmark = pytest.mark.skipif(not FUTEX_WAITV_AVAILABLE, reason="futex_waitv needs Linux 5.16+ on x86-64")

_FORK = multiprocessing.get_context("fork")
_NEVER_S = 60.0  # a sleep this long means the wake-up was lost: the test fails on its deadline instead


@pytest.fixture
def pages() -> Iterator[list[StatePage]]:
    names = [f"/la-test-{os.getpid()}-wake-{i}" for i in range(2)]
    for name in names:
        unlink_shared_memory(name)
    created = [StatePage.create(name) for name in names]
    yield created
    for page in created:
        page.close()
        page.unlink()


def _sleep_forever_unless_woken() -> None:
    state_page.READER_SLEEP_MAX_MS = int(_NEVER_S * 1000)  # in this child only: one sleep, no re-stamp


def _wait_once(name: str, position: int, report: Any) -> None:
    _sleep_forever_unless_woken()
    page = StatePage.attach(name)
    started = time.monotonic()
    above = wait_for_high_watermarks([(page, position)], _NEVER_S)
    report.send((above, page.high_watermark, time.monotonic() - started))
    page.close()


def test_a_reader_in_another_process_is_woken_by_the_publish(pages: list[StatePage]) -> None:
    page = pages[0]
    page.high_watermark = 10
    parent, child = _FORK.Pipe()
    reader = _FORK.Process(target=_wait_once, args=(page.name, 10, child))
    reader.start()
    try:
        time.sleep(0.2)  # (it may or may not be asleep yet: either way it must see the publish)
        page.high_watermark = 11
        assert parent.poll(_NEVER_S / 2), "the reader was not woken by the publish"
        above, seen, waited_s = parent.recv()
    finally:
        reader.join(10)
    assert (above, seen) == (True, 11)
    assert waited_s < _NEVER_S / 2


def test_one_page_already_above_returns_at_once_and_quiet_ones_time_out(pages: list[StatePage]) -> None:
    first, second = pages
    first.high_watermark = 5
    second.high_watermark = 7
    assert wait_for_high_watermarks([(first, 5), (second, 6)], 10.0)  # the second is above already
    started = time.monotonic()
    assert not wait_for_high_watermarks([(first, 5), (second, 7)], 0.05)
    assert time.monotonic() - started >= 0.05


def test_a_publish_to_any_of_the_pages_ends_the_sleep(pages: list[StatePage]) -> None:
    first, second = pages
    parent, child = _FORK.Pipe()

    def wait_on_both() -> None:
        _sleep_forever_unless_woken()
        mine = [StatePage.attach(p.name) for p in pages]
        child.send(wait_for_high_watermarks([(mine[0], 0), (mine[1], 0)], _NEVER_S))
        for p in mine:
            p.close()

    reader = _FORK.Process(target=wait_on_both)
    reader.start()
    try:
        time.sleep(0.2)
        second.high_watermark = 1
        assert parent.poll(_NEVER_S / 2) and parent.recv() is True
    finally:
        reader.join(10)
    assert first.high_watermark == 0


def _ping_pong(names: list[str], me: int, rounds: int, report: Any) -> None:
    """Publish my round, then sleep until the other side published its own: a lost wake-up stalls for good."""
    _sleep_forever_unless_woken()
    mine, theirs = StatePage.attach(names[me]), StatePage.attach(names[1 - me])
    for round_ in range(1, rounds + 1):
        if me == 0:
            mine.high_watermark = round_
        while not wait_for_high_watermarks([(theirs, round_ - 1)], _NEVER_S):
            pass
        if me == 1:
            mine.high_watermark = round_
    report.send(theirs.high_watermark)
    mine.close()
    theirs.close()


@pytest.mark.timeout(60)
def test_no_wake_up_is_lost_when_publishes_race_the_sleeps(pages: list[StatePage]) -> None:
    """Two processes hand a counter back and forth through two pages, each sleeping on the other's high
    watermark 2,000 times: every publish races the other side's decision to sleep."""
    rounds = 2000
    names = [p.name for p in pages]
    pipes = [_FORK.Pipe() for _ in range(2)]
    sides = [_FORK.Process(target=_ping_pong, args=(names, me, rounds, pipes[me][1])) for me in range(2)]
    for side in sides:
        side.start()
    try:
        for parent, _ in pipes:
            assert parent.poll(50), "a wake-up was lost: one side sleeps while the other waits for it"
        assert [parent.recv() for parent, _ in pipes] == [rounds, rounds]
    finally:
        for side in sides:
            side.join(10)
            if side.is_alive():
                side.kill()
                side.join()


def test_futex_words_wait_for_a_change_and_wake() -> None:
    word = np.zeros(1, dtype=np.uint32)
    address = int(word.ctypes.data)
    assert futex_wait_any([(address, 1)], 10.0)  # differs already: at once
    started = time.monotonic()
    assert not futex_wait_any([(address, 0)], 0.05)  # nobody wakes it: the timeout
    assert time.monotonic() - started >= 0.05
    futex_wake(address)  # no sleeper: nothing happens
