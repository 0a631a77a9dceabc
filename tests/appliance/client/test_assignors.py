"""The assignors and the consumer protocol's bytes, without a broker.

Kafka's answers for known cases (its RangeAssignorTest / RoundRobinAssignorTest examples), properties of
cooperative-sticky against a simple oracle over random groups, the ConsumerProtocol bytes as other clients
write them, and a fuzzer: only ProtocolError escapes decoding.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.assignors import assign_cooperative_sticky, assign_range, assign_roundrobin
from ipc.kafka.consumer_protocol import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from storage.errors import ProtocolError


def subs(**topics_by_member: list[str]) -> dict[str, Subscription]:
    return {m: Subscription(tuple(t)) for m, t in topics_by_member.items()}


def test_range_gives_consecutive_ranges_per_topic_the_first_members_one_more() -> None:
    members = subs(c0=["t1", "t2"], c1=["t1", "t2"])
    plan = assign_range(members, {"t1": 3, "t2": 3})
    assert plan == {"c0": [("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)], "c1": [("t1", 2), ("t2", 2)]}


def test_range_only_shares_a_topic_among_its_subscribers() -> None:
    plan = assign_range(subs(c0=["t1"], c1=["t1", "t2"]), {"t1": 2, "t2": 2})
    assert plan == {"c0": [("t1", 0)], "c1": [("t1", 1), ("t2", 0), ("t2", 1)]}


def test_roundrobin_deals_partitions_in_turn_skipping_non_subscribers() -> None:
    plan = assign_roundrobin(subs(c0=["t1", "t2"], c1=["t1", "t2"]), {"t1": 3, "t2": 3})
    assert plan == {"c0": [("t1", 0), ("t1", 2), ("t2", 1)], "c1": [("t1", 1), ("t2", 0), ("t2", 2)]}
    plan = assign_roundrobin(subs(c0=["t1"], c1=["t1", "t2"]), {"t1": 2, "t2": 2})
    assert plan == {"c0": [("t1", 0)], "c1": [("t1", 1), ("t2", 0), ("t2", 1)]}


def test_cooperative_sticky_takes_away_first_and_gives_out_in_the_next_rebalance() -> None:
    every = [("t", p) for p in range(6)]
    first = {"a": Subscription(("t",), tuple(every), 1), "b": Subscription(("t",))}
    plan = assign_cooperative_sticky(first, {"t": 6})
    assert len(plan["a"]) == 3 and plan["b"] == []  # the 3 that move are only revoked
    second = {"a": Subscription(("t",), tuple(plan["a"]), 2), "b": Subscription(("t",), (), 2)}
    plan2 = assign_cooperative_sticky(second, {"t": 6})
    assert plan2["a"] == plan["a"] and sorted(plan2["b"]) == sorted(set(every) - set(plan["a"]))


@st.composite
def groups(draw: st.DrawFn) -> tuple[dict[str, Subscription], int]:
    count = draw(st.integers(1, 12))
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    owners = draw(st.lists(st.sampled_from([*names, None]), min_size=count, max_size=count))
    members = {m: Subscription(("t",), tuple(("t", p) for p, o in enumerate(owners) if o == m), 1)
               for m in names}
    return members, count


@settings(max_examples=25, deadline=None)
@given(groups())
def test_cooperative_sticky_is_sticky_and_after_two_rounds_balanced(
    group: tuple[dict[str, Subscription], int],
) -> None:
    members, count = group
    plan = assign_cooperative_sticky(members, {"t": count})
    given_out = [tp for tps in plan.values() for tp in tps]
    assert len(given_out) == len(set(given_out))  # no partition twice
    for member, tps in plan.items():  # nothing is taken from one owner and given to another at once
        assert all(tp in members[member].owned_partitions or
                   not any(tp in s.owned_partitions for s in members.values()) for tp in tps)
    again = {m: Subscription(("t",), tuple(plan[m]), 2) for m in members}
    final = assign_cooperative_sticky(again, {"t": count})
    sizes = [len(tps) for tps in final.values()]
    assert sorted(tp for tps in final.values() for tp in tps) == [("t", p) for p in range(count)]
    assert max(sizes) - min(sizes) <= 1
    assert all(set(plan[m]) <= set(final[m]) for m in members)  # what stayed is not moved again


def test_subscription_bytes_round_trip_and_read_older_and_newer_versions() -> None:
    mine = Subscription(("a", "b"), (("a", 0), ("b", 3)), 7)
    assert decode_subscription(encode_subscription(mine)) == mine
    # v0 as kafka-python writes it: version, topics, user_data (empty bytes)
    v0 = struct.pack(">hih1si", 0, 1, 1, b"t", 0)
    assert decode_subscription(v0) == Subscription(("t",), user_data=b"", version=0)
    # a future version with more fields after the known ones
    v9 = struct.pack(">h", 9) + encode_subscription(mine)[2:] + b"\x00\x00\x00\x00future"
    assert decode_subscription(v9).owned_partitions == mine.owned_partitions
    assignment = Assignment((("a", 1), ("a", 2)))
    assert decode_assignment(encode_assignment(assignment)) == assignment
    assert decode_assignment(b"") == Assignment()


@settings(max_examples=25, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_bytes_raise_only_protocol_error(data: bytes) -> None:
    for decode in (decode_subscription, decode_assignment):
        try:
            decode(data)
        except ProtocolError:
            pass
