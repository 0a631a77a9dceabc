"""A replica that an explicit assignment named for some partitions of a topic only is not promoted: the
``appliance serve`` it would become leads every partition of the topics it records, and would serve the
others empty."""

from __future__ import annotations

import uuid

import pytest

from appliance.config.topic_metadata import TopicMetadata, with_replicas
from appliance.follower.promotion import PromotionRefused, refuse_partial_topics


def topic(name: str, replicas: list[tuple[int, ...]]) -> TopicMetadata:
    plain = TopicMetadata(name, str(uuid.uuid4()), len(replicas), len(replicas[0]), {},
                          ("/srv/a",) * len(replicas))  # fmt: skip
    return with_replicas(plain, replicas)


def test_a_replica_holding_every_partition_of_its_topics_may_be_promoted() -> None:
    refuse_partial_topics([topic("whole", [(0, 1), (1, 0)]), topic("elsewhere", [(0, 2), (2, 0)])], 1)
    refuse_partial_topics([topic("single", [(0,), (0,)])], 1)


def test_a_replica_holding_some_partitions_of_a_topic_is_refused_naming_them() -> None:
    with pytest.raises(PromotionRefused, match=r"topic 'spread' \(not \[1\]") as refused:
        refuse_partial_topics([topic("spread", [(0, 1), (2, 0), (0, 1)])], 1)
    assert "node 1 holds only some partitions" in str(refused.value)
