"""CreateTopics' explicit replica assignments: which the appliance honours, and why it refuses the others.

Theory of operation
-------------------
Kafka lets a CreateTopics request name, per partition, the brokers that hold it (``assignments``: a
partition index and its broker ids, the first the preferred leader) instead of a partition count and a
replication factor.  The appliance's replicas are kept per *topic*, not per partition
(``appliance.config.topic_metadata``: ``"replicas": [0, 1, 2]``, every partition alike), and one node --
this one, the node that creates the topic -- leads every partition (docs/replication.md).  So an assignment
is honoured exactly when it describes such a topic, and refused otherwise with the reason; nothing is ever
placed differently from what was asked.  :func:`check_assignment` applies Kafka's rules, then the
appliance's, in this order (the first broken rule is the answer):

1. ``num_partitions`` and ``replication_factor`` are -1 (Kafka: INVALID_REQUEST "both cannot be used at the
   same time");
2. the partition indexes are 0, 1, ... n-1, each once (INVALID_REPLICA_ASSIGNMENT, as Kafka);
3. every partition names at least one node, no node twice, and every partition as many nodes
   (INVALID_REPLICA_ASSIGNMENT, as Kafka);
4. every node named exists (INVALID_REPLICA_ASSIGNMENT naming the first unknown node and the known ones,
   as Kafka names a broker that is not registered);
5. every partition names this node first (this node leads every partition) and the same nodes in the same
   order (replicas are per topic) -- the appliance's own rules, refused as INVALID_REPLICA_ASSIGNMENT with
   what to send instead.

The nodes that exist (:func:`known_nodes`) are this node, the replica processes it runs itself
(``appliance.replica.dirs``: the ids after its own) and every node an existing topic already lists as a
replica (a replica on another host, ``appliance replica``, follows the topics that list its ``node.id``).
The result is an :class:`Assignment`: the partition count, the replication factor and the replicas to
record, as the supervisor records those it assigns itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ipc.kafka import ErrorCode

__all__ = ["Assignment", "AssignmentRefusal", "check_assignment", "known_nodes"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """An assignment the appliance honours: ``replicas`` is empty for a factor of 1 (nothing replicated)."""

    partitions: int
    replication_factor: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AssignmentRefusal:
    """Why an assignment is refused: Kafka's error code and a message naming the partition or node."""

    code: ErrorCode
    message: str


def known_nodes(node_id: int, replica_dirs: int, topic_replicas: Iterable[Sequence[int]]) -> frozenset[int]:
    """This node, the ``replica_dirs`` local replica processes after it, and every node a topic lists."""
    nodes = {node_id, *range(node_id + 1, node_id + 1 + replica_dirs)}
    for replicas in topic_replicas:
        nodes.update(replicas)
    return frozenset(nodes)


def check_assignment(
    topic: str,
    assignments: Sequence[tuple[int, Sequence[int]]],
    *,
    num_partitions: int,
    replication_factor: int,
    node_id: int,
    nodes: frozenset[int],
) -> Assignment | AssignmentRefusal:
    """The assignment to record for ``topic`` (``assignments``: partition index, node ids), or why not."""
    if num_partitions != -1 or replication_factor != -1:
        return AssignmentRefusal(
            ErrorCode.INVALID_REQUEST,
            f"topic {topic!r}: a replica assignment and a partition count or replication factor were both "
            "given; send num_partitions and replication_factor as -1 with an assignment",
        )
    by_partition = dict(assignments)
    if len(by_partition) != len(assignments) or set(by_partition) != set(range(len(assignments))):
        indexes = sorted(index for index, _ in assignments)
        return _invalid(f"topic {topic!r}: partitions {indexes} assigned; expected each of 0.."
                        f"{len(assignments) - 1} once")  # fmt: skip
    ordered = [list(by_partition[index]) for index in range(len(assignments))]
    refusal = _shape_refusal(topic, ordered) or _node_refusal(topic, ordered, nodes)
    if refusal is None:
        refusal = _appliance_refusal(topic, ordered, node_id)
    if refusal is not None:
        return refusal
    first = tuple(ordered[0])
    return Assignment(len(ordered), len(first), first if len(first) > 1 else ())


def _shape_refusal(topic: str, ordered: list[list[int]]) -> AssignmentRefusal | None:
    for index, replicas in enumerate(ordered):
        if not replicas:
            return _invalid(f"topic {topic!r} partition {index}: no replicas assigned")
        if len(set(replicas)) != len(replicas):
            return _invalid(f"topic {topic!r} partition {index}: replicas {replicas} name a node twice")
        if len(replicas) != len(ordered[0]):
            return _invalid(f"topic {topic!r}: partition {index} has {len(replicas)} replicas and "
                            f"partition 0 {len(ordered[0])}; every partition needs the same replication "
                            "factor")  # fmt: skip
    return None


def _node_refusal(topic: str, ordered: list[list[int]], nodes: frozenset[int]) -> AssignmentRefusal | None:
    for index, replicas in enumerate(ordered):
        for node in replicas:
            if node not in nodes:
                known = ", ".join(str(n) for n in sorted(nodes))
                return _invalid(f"topic {topic!r} partition {index}: node {node} does not exist (the nodes "
                                f"are {known})")  # fmt: skip
    return None


def _appliance_refusal(topic: str, ordered: list[list[int]], node_id: int) -> AssignmentRefusal | None:
    for index, replicas in enumerate(ordered):
        if replicas[0] != node_id:
            return _invalid(
                f"topic {topic!r} partition {index}: node {replicas[0]} is named first (its preferred "
                f"leader), but node {node_id} leads every partition here; name node {node_id} first"
            )
        if replicas != ordered[0]:
            return _invalid(
                f"topic {topic!r}: partition {index} lists replicas {replicas} and partition 0 {ordered[0]}; "
                "replicas here are per topic: give every partition the same list"
            )
    return None


def _invalid(message: str) -> AssignmentRefusal:
    return AssignmentRefusal(ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)
