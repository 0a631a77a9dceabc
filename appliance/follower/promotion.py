"""Promoting a replica to leader (``appliance replicas promote``, the ``promote`` control op): what refuses
it, whether each partition is in sync, and the leadership each partition starts with.

Theory of operation
-------------------
Leadership moves per node: the replica leads every partition it holds, so the request must name all of them
(or ``--all``: :func:`partitions_named`).  It is refused while any leader address still answers (stop the old
leader first: two leaders would each accept writes; :func:`refuse_while_a_leader_answers`), and, without
``unclean``, for a partition this replica is not known to be in sync for (:func:`judge_sync`): the last ISR
its leader's Metadata reported did not include it, or no leader was seen since it started, or that ISR was
seen more than ``replica.lag.time.max.ms`` + :data:`~appliance.follower.leaders.REFRESH_INTERVAL_MS` before
the leaders went silent (a replica stopped or cut off that long may have been dropped from the ISR unseen).
With ``unclean`` it proceeds with a loud warning (:func:`unclean_warning`): records acknowledged by the old
leader may be lost.

A replica that holds only some partitions of a topic (an explicit assignment named it for those) is not
promoted (:func:`refuse_partial_topics`): the ``appliance serve`` it becomes leads every partition of every
topic it records, and would serve the others empty.

Then, per partition, the fetcher stops and checkpoints its high watermark, and ``replica-state.json`` records
this node as leader with the ISR it starts with (:func:`leadership`: the last ISR minus the old leader, plus
itself; itself alone if unclean), and the process ``exec``\\s ``appliance serve`` on the same configuration
with ``appliance.replica.leader`` cleared: the supervisor begins a new leader epoch at each log's end, the
broker serves the Kafka protocol on this node's ``listeners``, the other replicas find it by its higher epoch
and truncate to it, and a returning old leader must be started as a replica of it (``appliance serve
--override appliance.replica.leader=NEW:PORT``), which truncates what the new leader never had.

The steps themselves (stopping the fetchers, writing the state, the ``exec``) are
``appliance.follower.replica.ReplicaNode``'s; this module decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from appliance.config.topic_metadata import TopicMetadata
from appliance.follower.leaders import REFRESH_INTERVAL_MS, ClusterView, PartitionView
from storage.errors import ApplianceError

__all__ = [
    "Leadership",
    "PromotionRefused",
    "SyncVerdict",
    "judge_sync",
    "leadership",
    "partitions_named",
    "refuse_partial_topics",
    "refuse_while_a_leader_answers",
    "unclean_warning",
]

TopicPartition = tuple[str, int]


class PromotionRefused(ApplianceError):
    """The replica cannot be promoted now; the message says why."""


@dataclass(frozen=True)
class SyncVerdict:
    """Whether this replica may lead ``key`` without losing acknowledged records, and why not."""

    key: TopicPartition
    seen: PartitionView | None  # the partition in the last view of the leaders, if any
    in_isr: bool
    why_not: str = ""  # in_isr False: the reason, for the refusal or the warning


class Leadership(NamedTuple):
    """What a promoted partition starts from."""

    previous_epoch: int  # the highest leader epoch known here; the supervisor begins the next one
    isr: tuple[int, ...]  # sorted, this node included


def partitions_named(wanted: object, held: set[TopicPartition], node_id: int) -> set[TopicPartition]:
    """The partitions a request names (``"all"`` or a list of ``TOPIC-PARTITION``): every one ``held``.

    PromotionRefused for a name this replica does not hold, for no partitions held, or for a request that
    leaves some out (leadership moves per node)."""
    if wanted == "all":
        named = set(held)
    elif isinstance(wanted, list) and all(isinstance(w, str) for w in wanted):
        named = set()
        for text in wanted:
            topic, sep, index = text.rpartition("-")
            if not sep or not index.isdigit() or (topic, int(index)) not in held:
                raise PromotionRefused(f"{text!r}: not a partition this replica holds "
                                       f"({', '.join(sorted(f'{t}-{p}' for t, p in held))})")
            named.add((topic, int(index)))
    else:
        raise PromotionRefused(f"partitions: {wanted!r}: expected \"all\" or a list of TOPIC-PARTITION")
    if not held:
        raise PromotionRefused(f"replica {node_id} holds no partitions")
    if named != held:
        missing = sorted(f"{t}-{p}" for t, p in held - named)
        raise PromotionRefused(
            f"leadership moves per node: replica {node_id} would lead every partition it holds; "
            f"also name {', '.join(missing)} (or use --all)")
    return named


def refuse_while_a_leader_answers(view: ClusterView | None) -> None:
    """PromotionRefused if ``view`` (a refresh just made) shows a leader still answering."""
    if view is not None and view.partitions:
        leader = next(iter(view.partitions.values())).leader
        raise PromotionRefused(
            f"leader {leader.leader_id} still answers at {view.answered[0]} (epoch "
            f"{leader.leader_epoch}): stop it before promoting a replica (two leaders would both accept "
            "writes)")


def judge_sync(keys: Iterable[TopicPartition], last: ClusterView | None, silent_since_ms: int | None, *,
               lag_time_max_ms: int, node_id: int) -> list[SyncVerdict]:  # fmt: skip
    """Whether the last view of the leaders (``last``, seen before they went silent at ``silent_since_ms``)
    shows this node in each partition's ISR, recently enough (module docstring)."""
    # The last ISR seen is trusted only if it was seen at most replica.lag.time.max.ms (plus one refresh
    # interval: a healthy replica's view is up to that old when the leader dies) before the leaders went
    # silent: a replica frozen or cut off longer may have been dropped from the ISR unseen.
    allowed_ms = lag_time_max_ms + REFRESH_INTERVAL_MS
    stale_ms = (silent_since_ms - last.at_ms) if last is not None and silent_since_ms is not None else 0
    verdicts = []
    for key in keys:
        seen = last.partitions.get(key) if last is not None else None
        in_isr = seen is not None and node_id in seen.isr and stale_ms <= allowed_ms
        why_not = "" if in_isr else _why_not_in_sync(seen, node_id, stale_ms, lag_time_max_ms)
        verdicts.append(SyncVerdict(key, seen, in_isr, why_not))
    return verdicts


def _why_not_in_sync(seen: PartitionView | None, node_id: int, stale_ms: int, lag_time_max_ms: int) -> str:
    if seen is None:
        return "no leader was ever seen"
    if node_id not in seen.isr:
        return (f"the last ISR seen was {list(seen.isr)} (leader {seen.leader.leader_id}, epoch "
                f"{seen.leader.leader_epoch})")
    return (f"the ISR {list(seen.isr)} was seen {stale_ms} ms before the leader went silent, more than "
            f"replica.lag.time.max.ms {lag_time_max_ms} + {REFRESH_INTERVAL_MS}: it may have been dropped "
            "from the ISR unseen (was this replica stopped or cut off?)")


def unclean_warning(problems: list[str], unclean: bool) -> str | None:
    """The warning of an unclean promotion (None if every partition is in sync).

    PromotionRefused if some partition is out of sync (``problems``, one line each) and ``unclean`` is not
    asked for."""
    if problems and not unclean:
        raise PromotionRefused(
            "not promoted: " + "; ".join(problems) + ".  Promoting an out-of-sync replica loses records "
            "the old leader acknowledged: wait for an in-sync replica, or pass --unclean")
    if not problems:
        return None
    return ("UNCLEAN PROMOTION: " + "; ".join(problems) + ".  Records the old leader acknowledged and this "
            "replica never received are LOST; the other replicas will truncate to this one")


def leadership(verdict: SyncVerdict, node_id: int, *, log_epoch: int, fetched_epoch: int) -> Leadership:
    """The epoch and ISR a partition starts from: the highest epoch known here (its log's ``log_epoch``,
    its fetcher's leader's ``fetched_epoch``, the view's); in sync, the last ISR seen minus the old leader,
    plus this node; else this node alone."""
    seen = verdict.seen
    epoch = max(log_epoch, fetched_epoch, seen.leader.leader_epoch if seen is not None else -1)
    old_leader = seen.leader.leader_id if seen is not None else -1
    if verdict.in_isr and seen is not None:
        isr = {node_id} | (set(seen.isr) - {old_leader})
    else:
        isr = {node_id}
    return Leadership(epoch, tuple(sorted(isr)))


def refuse_partial_topics(topics: Iterable[TopicMetadata], node_id: int) -> None:
    """PromotionRefused if this replica holds some partitions of a topic and not the others (module doc)."""
    for topic in topics:
        missing = [p for p in range(topic.partitions) if node_id not in topic.partition_replicas(p)]
        if topic.nodes and missing and len(missing) < topic.partitions:
            raise PromotionRefused(
                f"node {node_id} holds only some partitions of topic {topic.name!r} (not {missing}: their "
                "replica assignment does not name it); as leader it would serve those empty. Promote a "
                "replica that holds every partition, or restart the old leader"
            )
