"""The catalog of Kafka's topic settings: every one known by name, checked by type and range, refused with a
reason where the appliance does not do it, kept with the topic, and documented in one generated table."""

from __future__ import annotations

import pathlib

import pytest

from appliance.config.server_config import load_config, parse_override
from appliance.config.server_settings import TOPIC_SETTINGS
from appliance.config.topic_configs import CATALOG, Behaviour, find_topic_setting, kafka_value, markdown_table
from storage.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[3]

# Kafka's topic-level settings (LogConfig's definitions, Kafka 3.9 / 4.0), written down here as the oracle.
KAFKA_TOPIC_SETTINGS = {
    "cleanup.policy", "compression.gzip.level", "compression.lz4.level", "compression.type",
    "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms",
    "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes", "local.retention.ms", "max.compaction.lag.ms", "max.message.bytes",
    "message.downconversion.enable", "message.format.version", "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms", "message.timestamp.type",
    "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas", "preallocate",
    "remote.log.copy.disable", "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes",
    "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
}  # fmt: skip


def as_create_topics(configs: dict[str, str]) -> dict[str, object]:
    """Values as the broker reads CreateTopics' strings (appliance.broker.handlers.create_topics)."""
    return {key: parse_override(f"{key}={value}")[1] for key, value in configs.items()}


def test_every_kafka_topic_setting_is_in_the_catalog_once() -> None:
    assert {row.name for row in CATALOG} == KAFKA_TOPIC_SETTINGS
    assert len(CATALOG) == len(KAFKA_TOPIC_SETTINGS)
    for setting in TOPIC_SETTINGS:
        if setting.name not in ("partitions", "replication.factor"):
            row = find_topic_setting(setting.name)
            assert row is not None and row.behaviour is not Behaviour.REFUSED, setting.name


def test_the_documentation_table_is_the_catalogs() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = doc.index("<!-- topic-settings-table")
    start = doc.index("\n", start) + 1
    end = doc.index("<!-- end topic-settings-table -->")
    assert doc[start:end] == markdown_table(), (
        "regenerate it: appliance.config.topic_configs.markdown_table()"
    )


@pytest.mark.parametrize("row", CATALOG, ids=lambda row: row.name)
def test_kafkas_default_is_accepted_as_create_topics_carries_it_and_kept(row: object) -> None:
    name = row.name  # type: ignore[attr-defined]
    value = row.kafka_default.split(" (")[0]  # type: ignore[attr-defined]
    topic = load_config().topic("orders", as_create_topics({name: value}))
    assert kafka_value(topic.overrides[name]) in (
        value,
        str(float(value)) if name.endswith("ratio") else value,
    )


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("segment.jitter.ms", "soon", "expected an integer"),
        ("min.cleanable.dirty.ratio", "1.5", "between 0 and 1"),
        ("min.cleanable.dirty.ratio", "true", "between 0 and 1"),
        ("compression.zstd.level", "23", "between -131072 and 22"),
        ("compression.gzip.level", "0", "between 1 and 9 or equal to -1"),
        ("delete.retention.ms", "-1", "between 0 and"),
        ("max.compaction.lag.ms", "0", "between 1 and"),
        ("message.downconversion.enable", "7", "expected true or false"),
        ("message.format.version", "latest", "Kafka version"),
        ("leader.replication.throttled.replicas", "0-1", "PARTITION:BROKER"),
        ("compression.type", "brotli", "expected one of"),
    ],
)
def test_a_wrong_type_or_range_names_the_key_and_changes_nothing(name: str, value: str, said: str) -> None:
    config = load_config()
    with pytest.raises(ConfigError, match=f"topic 'orders' configs: {name}") as info:
        config.topic("orders", as_create_topics({name: value}))
    assert said in str(info.value)
    assert config.topic("orders").overrides == {}


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("compression.type", "zstd", "never recompresses"),
        ("compression.type", "uncompressed", "set compression.type on the producer"),
        ("remote.storage.enable", "true", "no tiered storage"),
        ("local.retention.ms", "1000", "set retention.ms"),
        ("local.retention.bytes", "1000", "set retention.bytes"),
        ("segment.jitter.ms", "1000", "leave segment.jitter.ms at 0"),
        ("unclean.leader.election.enable", "true", "appliance replicas promote --unclean"),
        ("follower.replication.throttled.replicas", "0:1", "replica.fetch.max.bytes"),
    ],
)
def test_a_refused_value_says_why_and_what_to_use_instead(name: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        load_config().topic("orders", as_create_topics({name: value}))
    assert why in str(info.value)


def test_settings_the_appliance_does_not_use_are_kept_through_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text(
        '[topics.orders]\n"min.cleanable.dirty.ratio" = 0.25\n"file.delete.delay.ms" = 5\n'
        '"compression.type" = "producer"\n"message.format.version" = "3.0-IV1"\n'
    )
    config = load_config(path, ["topics.orders.delete.retention.ms=1000"])
    kept = dict(config.topics["orders"].overrides)
    assert kept == {
        "min.cleanable.dirty.ratio": 0.25, "file.delete.delay.ms": 5, "compression.type": "producer",
        "message.format.version": "3.0-IV1", "delete.retention.ms": 1000,
    }  # fmt: skip
    again = tmp_path / "b.toml"
    again.write_text(config.to_toml())
    assert dict(load_config(again).topics["orders"].overrides) == kept


def test_a_refused_value_in_the_file_names_the_file_the_topic_and_the_key(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[topics.orders]\n"remote.storage.enable" = true\n')
    with pytest.raises(ConfigError, match=r"a\.toml: remote\.storage\.enable = true: .*no tiered storage"):
        load_config(path)


def test_an_unknown_topic_setting_is_still_an_error_with_the_nearest_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown topic setting 'min\.cleanable\.ratio' .*'min\.cleanable"):
        load_config().topic("orders", {"min.cleanable.ratio": 0.5})


def test_every_setting_is_accepted_by_name_in_a_topics_table(tmp_path: pathlib.Path) -> None:
    """Each catalog row with a value it accepts (Kafka's default, or any other the row keeps), written in a
    ``[topics.NAME]`` table as TOML types it, loads and is kept as given."""
    values = {row.name: as_create_topics({row.name: row.kafka_default.split(" (")[0]})[row.name]
              for row in CATALOG}  # fmt: skip
    values.update({"segment.bytes": 2097152, "message.timestamp.type": "LogAppendTime", "preallocate": False})
    lines = ["[topics.orders]", *(f'"{name}" = {toml_value(value)}' for name, value in values.items())]
    path = tmp_path / "every.toml"
    path.write_text("\n".join(lines) + "\n")
    kept = dict(load_config(path).topics["orders"].overrides)
    assert {name: kafka_value(value) for name, value in kept.items()} == {
        name: kafka_value(value) for name, value in values.items()
    }


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
