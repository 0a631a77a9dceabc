"""Which topics' Produce answers carry the append time: resolved per metadata picture, over a cache that
starts over when full."""

from __future__ import annotations

from appliance.broker.append_time import AppendTimeTopics
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import load_config


def _meta(name: str, kind: str | None) -> TopicMeta:
    configs = {} if kind is None else {"message.timestamp.type": kind}
    return TopicMeta(name, 1, configs=configs)


def test_each_topic_answers_its_own_type_across_many_topics_and_a_changed_picture() -> None:
    topics = AppendTimeTopics(load_config(None, ["log.message.timestamp.type=CreateTime"]))
    stamped = {f"t{i}": i % 3 == 0 for i in range(10_000)}  # more topics than the cache keeps
    metas = {name: _meta(name, "LogAppendTime" if s else None) for name, s in stamped.items()}
    for _ in range(2):
        assert {name: topics.stamped(name, meta) for name, meta in metas.items()} == stamped
    altered = _meta("t1", "LogAppendTime")  # AlterConfigs: a new picture of t1 is resolved again
    assert topics.stamped("t1", altered) and not topics.stamped("t2", metas["t2"])
    assert not topics.stamped("unknown", None)
