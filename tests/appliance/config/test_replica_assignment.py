"""CreateTopics' replica assignments checked without a broker: Kafka's rules, then the appliance's, each
refusal with its code and a message naming the partition or node."""

from __future__ import annotations

import pytest

from appliance.config.replica_assignment import (
    Assignment,
    AssignmentRefusal,
    check_assignment,
    check_new_partitions,
    known_nodes,
)
from ipc.kafka import ErrorCode

NODES = frozenset({0, 1, 2})


def check(pairs: list[tuple[int, list[int]]], *, partitions: int = -1, factor: int = -1,
          node_id: int = 0) -> Assignment | AssignmentRefusal:  # fmt: skip
    return check_assignment("t", pairs, num_partitions=partitions, replication_factor=factor,
                            node_id=node_id, nodes=NODES)  # fmt: skip


def test_an_assignment_naming_this_node_in_every_partition_is_honoured_as_given() -> None:
    assert check([(1, [0, 2, 1]), (0, [0, 2, 1])]) == Assignment(2, 3, ((0, 2, 1), (0, 2, 1)))
    assert check([(0, [0]), (1, [0]), (2, [0])]) == Assignment(3, 1, ((0,), (0,), (0,)))
    assert check([(0, [2, 0])], node_id=2) == Assignment(1, 2, ((2, 0),))
    # partitions differ, and another node may be named first (the preferred leader): kept in that order
    assert check([(0, [0, 1]), (1, [2, 0]), (2, [0, 2])]) == Assignment(3, 2, ((0, 1), (2, 0), (0, 2)))


def test_new_partitions_assignments_follow_the_same_rules() -> None:
    assert check_new_partitions("t", [[1, 0], [0, 2]], first_partition=3, replication_factor=2, node_id=0,
                                nodes=NODES) == ((1, 0), (0, 2))  # fmt: skip
    refusal = check_new_partitions("t", [[0, 1], [1, 2]], first_partition=3, replication_factor=2,
                                   node_id=0, nodes=NODES)  # fmt: skip
    assert isinstance(refusal, AssignmentRefusal) and "partition 4" in refusal.message
    refusal = check_new_partitions("t", [[0, 5]], first_partition=1, replication_factor=2, node_id=0,
                                   nodes=NODES)  # fmt: skip
    assert isinstance(refusal, AssignmentRefusal) and "partition 1: node 5 does not exist" in refusal.message


@pytest.mark.parametrize(
    ("pairs", "partitions", "factor", "code", "said"),
    [
        ([(0, [0])], 1, -1, ErrorCode.INVALID_REQUEST, "both given"),
        ([(0, [0])], -1, 1, ErrorCode.INVALID_REQUEST, "both given"),
        ([(0, [0]), (2, [0])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions [0, 2] assigned"),
        ([(0, [0]), (0, [0])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "each of 0..1 once"),
        ([(0, [])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partition 0: no replicas"),
        ([(0, [0, 1, 0])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "name a node twice"),
        ([(0, [0, 1]), (1, [0])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partition 1 has 1 replicas"),
        ([(0, [0, 9])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "node 9 does not exist (the nodes"),
        ([(0, [0, 1]), (1, [1, 2])], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "partition 1: replicas [1, 2] do not name node 0"),
        ([], -1, -1, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "an empty replica assignment"),
    ],
    ids=["partitions-too", "factor-too", "gap", "twice", "empty", "duplicate-node", "unequal", "unknown-node",
         "without-this-node", "no-partitions"],
)  # fmt: skip
def test_an_assignment_that_cannot_be_honoured_is_refused_with_why(
    pairs: list[tuple[int, list[int]]], partitions: int, factor: int, code: ErrorCode, said: str
) -> None:
    refusal = check(pairs, partitions=partitions, factor=factor)
    assert isinstance(refusal, AssignmentRefusal)
    assert refusal.code == code and said in refusal.message and "'t'" in refusal.message, refusal.message


def test_the_known_nodes_are_this_one_its_local_replicas_and_those_topics_list() -> None:
    assert known_nodes(0, 0, []) == {0}
    assert known_nodes(3, 2, [(3, 7), (3, 4)]) == {3, 4, 5, 7}
