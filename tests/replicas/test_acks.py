"""acks=all waiters against a list oracle: each leaves once, with the right code, at the right time."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.kafka import ErrorCode
from replicas.acks import PendingAcks


@dataclass
class Waiter:
    token: int
    last_offset: int
    deadline_ms: int
    result: ErrorCode | None = None


events = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 200), st.integers(0, 300)),  # last offset, timeout
        st.tuples(st.just("hw"), st.integers(0, 50), st.integers(1, 3)),  # HW step, ISR size
        st.tuples(st.just("clock"), st.integers(0, 100), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(events=events, min_isr=st.integers(1, 3))
def test_every_waiter_leaves_once_with_the_oracles_code(
    events: list[tuple[str, int, int]], min_isr: int
) -> None:
    acks: PendingAcks[int] = PendingAcks("t-0")
    oracle: list[Waiter] = []
    released: dict[int, ErrorCode] = {}
    now, hw = 0, 0

    def take(out: list[tuple[int, ErrorCode]]) -> None:
        for token, code in out:
            assert token not in released, f"waiter {token} released twice"
            released[token] = code

    for kind, a, b in events:
        if kind == "add":
            oracle.append(Waiter(len(oracle), a, now + b))
            acks.add(len(oracle) - 1, last_offset=a, deadline_ms=now + b)
        elif kind == "hw":
            hw += a
            out = acks.complete(hw, isr_size=b, min_insync_replicas=min_isr)
            assert [t for t, _ in out] == sorted(
                (t for t, _ in out), key=lambda t: (oracle[t].last_offset, t)
            )
            code = ErrorCode.NONE if b >= min_isr else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            for w in oracle:
                if w.result is None and w.last_offset < hw:
                    w.result = code
            take(out)
        else:
            now += a
            take(acks.expire(now))
            for w in oracle:
                if w.result is None and w.deadline_ms <= now:
                    w.result = ErrorCode.REQUEST_TIMED_OUT
        assert released == {w.token: w.result for w in oracle if w.result is not None}
        pending = [w for w in oracle if w.result is None]
        assert len(acks) == len(pending)
        assert acks.next_deadline_ms() == (min(w.deadline_ms for w in pending) if pending else None)
    rest = acks.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert sorted(t for t, _ in rest) == sorted(w.token for w in oracle if w.result is None)
    assert all(code == ErrorCode.NOT_LEADER_OR_FOLLOWER for _, code in rest)
    assert len(acks) == 0 and acks.next_deadline_ms() is None
    assert acks.complete(10**9, isr_size=3, min_insync_replicas=1) == [] and acks.expire(10**9) == []


def test_memory_follows_the_pending_waiters() -> None:
    acks: PendingAcks[int] = PendingAcks()
    for i in range(10_000):  # completed by offset while their deadlines are all far away
        acks.add(i, last_offset=i, deadline_ms=10**9 - i)
        acks.complete(i + 1, isr_size=1, min_insync_replicas=1)
    assert len(acks) == 0
    assert len(acks._by_deadline) < 200  # released entries do not pile up in the other heap
