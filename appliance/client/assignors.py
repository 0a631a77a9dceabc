"""Partition assignors: how a group's leader shares the subscribed partitions among the members.

Theory of operation
-------------------
The leader member gets every member's :class:`~ipc.kafka.consumer_protocol.Subscription` in its
JoinGroup answer and computes each member's partitions; the coordinator only carries the bytes.  Three
assignors, by Kafka's names (``partition.assignment.strategy``), each giving the same answer as Kafka's for
the same members and partitions:

* ``range`` (Kafka's ``RangeAssignor``, eager): per topic, the members subscribed to it in member-id order
  get consecutive ranges; the first ``partitions % members`` get one more.
* ``roundrobin`` (``RoundRobinAssignor``, eager): every subscribed partition in (topic, partition) order is
  dealt to the members in member-id order, in turn, skipping a member not subscribed to its topic.
* ``cooperative-sticky`` (``CooperativeStickyAssignor``, cooperative): balanced (counts differ by at most
  one among members with the same subscription) and sticky: a member keeps the partitions it owns, up to its
  share; what is left goes to the members with the fewest.  Cooperative (KIP-429): a partition that
  changes owner is *not* given to its new owner in this rebalance, only taken from the old one; the old
  owner revokes it and joins again, and the rebalance that follows gives it out.  Of two members claiming
  one partition, the one with the newer ``generation_id`` keeps it.

The *rebalance protocol* follows from the assignors a member lists: cooperative when every one is
cooperative, else eager (a member revokes all its partitions before it joins), as in Kafka's consumer.

Each assignor is a pure function ``(members, partition counts) -> member id -> partitions``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from ipc.kafka.consumer_protocol import Subscription

__all__ = ["ASSIGNORS", "Assignor", "assign_cooperative_sticky", "assign_range", "assign_roundrobin"]

TopicPartitionKey = tuple[str, int]
Assignments = dict[str, list[TopicPartitionKey]]
AssignFunction = Callable[[Mapping[str, Subscription], Mapping[str, int]], Assignments]


@dataclass(frozen=True)
class Assignor:
    name: str  # Kafka's name, sent as the JoinGroup protocol name
    cooperative: bool
    assign: AssignFunction


def _members_of(members: Mapping[str, Subscription], topic: str) -> list[str]:
    return sorted(m for m, s in members.items() if topic in s.topics)


def _subscribed_topics(members: Mapping[str, Subscription], counts: Mapping[str, int]) -> list[str]:
    return sorted({t for s in members.values() for t in s.topics if counts.get(t, 0) > 0})


def assign_range(members: Mapping[str, Subscription], counts: Mapping[str, int]) -> Assignments:
    out: Assignments = {m: [] for m in members}
    for topic in _subscribed_topics(members, counts):
        consumers = _members_of(members, topic)
        per, extra = divmod(counts[topic], len(consumers))
        start = 0
        for i, member in enumerate(consumers):
            length = per + (1 if i < extra else 0)
            out[member] += [(topic, p) for p in range(start, start + length)]
            start += length
    return out


def assign_roundrobin(members: Mapping[str, Subscription], counts: Mapping[str, int]) -> Assignments:
    out: Assignments = {m: [] for m in members}
    order = sorted(members)
    if not order:
        return out
    turn = 0
    for topic in _subscribed_topics(members, counts):
        for partition in range(counts[topic]):
            while topic not in members[order[turn % len(order)]].topics:
                turn += 1
            out[order[turn % len(order)]].append((topic, partition))
            turn += 1
    return out


def _claims(members: Mapping[str, Subscription], counts: Mapping[str, int]) -> dict[TopicPartitionKey, str]:
    """Partition -> the member that owns it now: the claim with the newest generation wins; a claim on a
    partition that no longer exists or a topic the member no longer subscribes to is dropped."""
    owner: dict[TopicPartitionKey, str] = {}
    for member in sorted(members, key=lambda m: (-members[m].generation_id, m)):
        sub = members[member]
        for topic, partition in sub.owned_partitions:
            if topic in sub.topics and 0 <= partition < counts.get(topic, 0):
                owner.setdefault((topic, partition), member)
    return owner


def _balanced_sticky(members: Mapping[str, Subscription], counts: Mapping[str, int],
                     owner: dict[TopicPartitionKey, str]) -> Assignments:
    every = [(t, p) for t in _subscribed_topics(members, counts) for p in range(counts[t])]
    total, n = len(every), max(1, len(members))
    floor_share, extra = divmod(total, n)
    owned: dict[str, list[TopicPartitionKey]] = {m: [] for m in members}
    for tp, member in owner.items():
        owned[member].append(tp)
    out: Assignments = {m: [] for m in members}
    for member in sorted(members, key=lambda m: (-len(owned[m]), m)):
        share = floor_share + (1 if extra > 0 else 0)
        out[member] = sorted(owned[member])[:share]
        if len(out[member]) > floor_share:
            extra -= 1
    taken = {tp for tps in out.values() for tp in tps}
    for tp in every:
        if tp in taken:
            continue
        candidates = [m for m in members if tp[0] in members[m].topics]
        if candidates:
            out[min(candidates, key=lambda m: (len(out[m]), m))].append(tp)
    return out


def assign_cooperative_sticky(members: Mapping[str, Subscription], counts: Mapping[str, int]) -> Assignments:
    owner = _claims(members, counts)
    target = _balanced_sticky(members, counts, owner)
    # Cooperative: a partition moving from one member to another is only revoked in this rebalance.
    return {m: sorted(tp for tp in tps if owner.get(tp, m) == m) for m, tps in target.items()}


ASSIGNORS: Final[dict[str, Assignor]] = {
    "range": Assignor("range", False, assign_range),
    "roundrobin": Assignor("roundrobin", False, assign_roundrobin),
    "cooperative-sticky": Assignor("cooperative-sticky", True, assign_cooperative_sticky),
}
