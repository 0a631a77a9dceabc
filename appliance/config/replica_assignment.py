"""CreateTopics' and CreatePartitions' explicit replica assignments: which the appliance honours, and why it
refuses the others.

Theory of operation
-------------------
Kafka lets a CreateTopics request name, per partition, the brokers that hold it (``assignments``: a
partition index and its broker ids, the first the *preferred* leader) instead of a partition count and a
replication factor; CreatePartitions does the same for each new partition.  The appliance keeps each
partition's replicas as assigned (``appliance.config.topic_metadata``: the per-topic form when every
partition has the same, else one list per partition), and one node -- this one, the node that creates the
topic -- leads every partition it serves (docs/replication.md).  So an assignment is honoured when every
node it names exists and every partition names this node, wherever in its list; nothing is ever placed
differently from what was asked.  :func:`check_assignment` applies Kafka's rules, then the appliance's,
in this order (the first broken rule is the answer):

1. ``num_partitions`` and ``replication_factor`` are -1 (Kafka: INVALID_REQUEST "both cannot be used at the
   same time");
2. the partition indexes are 0, 1, ... n-1, each once (INVALID_REPLICA_ASSIGNMENT, as Kafka);
3. every partition names at least one node, no node twice, and every partition as many nodes
   (INVALID_REPLICA_ASSIGNMENT, as Kafka);
4. every node named exists (INVALID_REPLICA_ASSIGNMENT naming the first unknown node and the known ones,
   as Kafka names a broker that is not registered);
5. every partition names this node -- the appliance's own rule: this node leads the partition, so it holds
   its data; a partition without it could be held by no process that serves it (INVALID_REPLICA_ASSIGNMENT
   saying so and what to send instead).

**The preferred leader.**  A partition whose list names another node first is honoured with this node as
its leader, the list recorded and shown (Metadata, DescribeTopics, ``appliance topics describe``) in the
order given: Kafka does the same while the preferred leader is not available, but later moves leadership to
it (automatic preferred-leader election); the appliance does not -- one node leads every partition until a
person promotes a replica -- so the preferred leader only orders the list (docs/configuration.md).

The nodes that exist (:func:`known_nodes`) are this node, the replica processes it runs itself
(``appliance.replica.dirs``: the ids after its own) and every node an existing topic already lists as a
replica (a replica on another host, ``appliance replica``, follows the partitions that list its
``node.id``).  The result is an :class:`Assignment`: the partition count, the replication factor and each
partition's replicas to record.  :func:`check_new_partitions` applies rules 3 to 5 to CreatePartitions'
assignments of new partitions, whose replication factor is the topic's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ipc.kafka import ErrorCode

__all__ = ["Assignment", "AssignmentRefusal", "check_assignment", "check_new_partitions", "known_nodes"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """An assignment the appliance honours: ``replicas[p]`` lists partition ``p``'s nodes as given."""

    partitions: int
    replication_factor: int
    replicas: tuple[tuple[int, ...], ...]


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
    if not assignments:
        return _invalid(f"topic {topic!r}: an empty replica assignment; give num_partitions instead")
    by_partition = dict(assignments)
    if len(by_partition) != len(assignments) or set(by_partition) != set(range(len(assignments))):
        indexes = sorted(index for index, _ in assignments)
        return _invalid(f"topic {topic!r}: partitions {indexes} assigned; expected each of 0.."
                        f"{len(assignments) - 1} once")  # fmt: skip
    ordered = [list(by_partition[index]) for index in range(len(assignments))]
    refusal = _refusal(topic, ordered, 0, len(ordered[0]), node_id, nodes)
    if refusal is not None:
        return refusal
    return Assignment(len(ordered), len(ordered[0]), tuple(tuple(r) for r in ordered))


def check_new_partitions(
    topic: str,
    assignments: Sequence[Sequence[int]],
    *,
    first_partition: int,
    replication_factor: int,
    node_id: int,
    nodes: frozenset[int],
) -> tuple[tuple[int, ...], ...] | AssignmentRefusal:
    """CreatePartitions: the replicas to record for the new partitions ``first_partition``, ... (one list
    each, in order; the caller checked there is one per new partition), or why not (rules 3 to 5)."""
    ordered = [list(nodes_) for nodes_ in assignments]
    refusal = _refusal(topic, ordered, first_partition, replication_factor, node_id, nodes)
    if refusal is not None:
        return refusal
    return tuple(tuple(r) for r in ordered)


def _refusal(topic: str, ordered: list[list[int]], first: int, factor: int, node_id: int,
             nodes: frozenset[int]) -> AssignmentRefusal | None:  # fmt: skip
    """Rules 3 to 5 for the partitions ``first``, ``first + 1``, ... listed in ``ordered``."""
    return (_shape_refusal(topic, ordered, first, factor) or _node_refusal(topic, ordered, first, nodes)
            or _appliance_refusal(topic, ordered, first, node_id))  # fmt: skip


def _shape_refusal(topic: str, ordered: list[list[int]], first: int, factor: int) -> AssignmentRefusal | None:
    for index, replicas in enumerate(ordered, start=first):
        if not replicas:
            return _invalid(f"topic {topic!r} partition {index}: no replicas assigned")
        if len(set(replicas)) != len(replicas):
            return _invalid(f"topic {topic!r} partition {index}: replicas {replicas} name a node twice")
        if len(replicas) != factor:
            return _invalid(f"topic {topic!r}: partition {index} has {len(replicas)} replicas where the "
                            f"replication factor is {factor}; every partition needs the same replication "
                            "factor")  # fmt: skip
    return None


def _node_refusal(topic: str, ordered: list[list[int]], first: int,
                  nodes: frozenset[int]) -> AssignmentRefusal | None:  # fmt: skip
    for index, replicas in enumerate(ordered, start=first):
        for node in replicas:
            if node not in nodes:
                known = ", ".join(str(n) for n in sorted(nodes))
                return _invalid(f"topic {topic!r} partition {index}: node {node} does not exist (the nodes "
                                f"are {known})")  # fmt: skip
    return None


def _appliance_refusal(topic: str, ordered: list[list[int]], first: int,
                       node_id: int) -> AssignmentRefusal | None:  # fmt: skip
    for index, replicas in enumerate(ordered, start=first):
        if node_id not in replicas:
            return _invalid(
                f"topic {topic!r} partition {index}: replicas {replicas} do not name node {node_id}, which "
                "leads every partition here and so must hold a copy of each; add node "
                f"{node_id} to the partition's replicas"
            )
    return None


def _invalid(message: str) -> AssignmentRefusal:
    return AssignmentRefusal(ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)
