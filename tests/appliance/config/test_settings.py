"""appliance.config.settings, the kit every family of settings is declared with: converters, tables, the
parse step, and the one error for a bad value (checked here through all four families)."""

from __future__ import annotations

import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.client.consumer import Consumer
from appliance.client.producer_config import ProducerConfig
from appliance.config.server_config import load_config
from appliance.config.settings import (
    LONG_MAX,
    Alias,
    Invalid,
    Origin,
    Setting,
    SettingTable,
    bad_value,
    boolean,
    choice,
    client_pairs,
    convert,
    file_path,
    integer,
    optional,
    read_settings,
    string_list,
    text,
)
from appliance.spark.options import parse_options
from storage.errors import ConfigError

# -------------------------------------------------------------------------------------- converters


def test_a_typed_integer_wants_an_integer_in_range() -> None:
    check = integer(1, 10)
    assert check(10) == 10
    for value, reason in [(0, "must be between 1 and 10"), (True, "expected an integer, got a boolean"),
                          ("5", "expected an integer, got a string; write it without quotes"),
                          ("five", "expected an integer, got a string"),
                          (1.5, "expected an integer, got float")]:
        with pytest.raises(Invalid) as caught:
            check(value)
        assert str(caught.value) == reason


def test_an_integer_read_from_text_says_what_text_it_wants() -> None:
    assert [integer(0, text=True)(v) for v in (" 5 ", "+7", "-0", 3)] == [5, 7, 0, 3]
    for value, reason in [("-1", "expected a whole number >= 0"), ("1_000", "expected a whole number >= 0"),
                          ("", "expected a whole number >= 0"),
                          (-1, "must be between 0 and 9223372036854775807")]:
        with pytest.raises(Invalid, match=re.escape(reason)):
            integer(0, text=True)(value)
    with pytest.raises(Invalid, match="expected a whole number between 1 and 9"):
        integer(1, 9, text=True)("10")


@given(st.integers(-(2**64), 2**64))
def test_text_and_typed_integers_agree(number: int) -> None:
    """A number and its text are accepted or refused alike, and read to the same value."""
    check = integer(-5, 2**40, text=True)
    outcomes = []
    for value in (number, str(number), f" {number} "):
        try:
            outcomes.append(check(value))
        except Invalid:
            outcomes.append(None)
    expected = number if -5 <= number <= 2**40 else None
    assert outcomes == [expected] * 3


def test_booleans() -> None:
    assert boolean()(False) is False
    assert [boolean(text=True)(v) for v in ("true", " FALSE ", True)] == [True, False, True]
    with pytest.raises(Invalid, match=r"^expected true or false, got a string$"):
        boolean()("true")
    with pytest.raises(Invalid, match=r"^expected true or false$"):
        boolean(text=True)("yes")
    with pytest.raises(Invalid, match=r"^expected true or false, got an integer$"):
        boolean(text=True)(1)


def test_choices_strings_and_lists() -> None:
    assert choice(("CreateTime", "LogAppendTime"))("logappendtime") == "LogAppendTime"
    with pytest.raises(Invalid, match=r"^expected one of a, b$"):
        choice(("a", "b"))("c")
    with pytest.raises(Invalid, match=r"^expected a string, got an integer$"):
        choice(("a", "b"))(1)
    with pytest.raises(Invalid, match="NUL"):
        text("a\x00b")
    assert file_path(pathlib.Path("rel/x")) == "rel/x"
    assert string_list(" a, b ,c") == ["a", "b", "c"] and string_list("") == []
    assert string_list(["x"]) == ["x"]
    assert optional(text)(None) is None


# -------------------------------------------------------------------------------------- tables and parsing


TABLE = SettingTable((
    Setting("retention.ms", 100, integer(-1), "keep this long", (Alias("log.retention.ms"),
                                                                 Alias("log.retention.hours", 3_600_000))),
    Setting("flag", False, boolean(text=True), "a switch"),
))


def test_a_table_finds_names_and_aliases_and_suggests_the_nearest() -> None:
    assert [s.name for s in TABLE] == ["retention.ms", "flag"] and len(TABLE) == 2
    found = TABLE.find("log.retention.hours")
    assert found is not None and (found.setting.name, found.factor) == ("retention.ms", 3_600_000)
    assert TABLE.find("Flag") is None
    assert TABLE.nearest("log.retention.hour") == "log.retention.hours"
    assert TABLE.nearest("zzzz") is None
    assert TABLE.nearest("topic", extra=["topics"]) == "topics"
    assert TABLE.defaults() == {"retention.ms": 100, "flag": False}
    blind = SettingTable([Setting("failOnDataLoss", True, boolean(text=True), "")], case_blind=True)
    assert blind.find("FAILONDATALOSS") is not None
    assert blind.nearest("failondatalos") == "failOnDataLoss"  # the declared spelling, not the folded one
    with pytest.raises(AssertionError, match="declared twice"):
        SettingTable([Setting("a", 1, integer(0), ""), Setting("b", 1, integer(0), "", (Alias("a"),))])


def test_an_alias_scales_its_value_and_minus_one_stays() -> None:
    origin = Origin("here:", toml=True)
    hours = TABLE.find("log.retention.hours")
    assert hours is not None
    assert convert(hours, "log.retention.hours", 2, origin) == 7_200_000
    assert convert(hours, "log.retention.hours", -1, origin) == -1
    with pytest.raises(ConfigError, match=r"^here: log\.retention\.hours = -2: must be between -1 and "):
        convert(hours, "log.retention.hours", -2, origin)


def test_read_settings_converts_by_canonical_name_and_a_later_pair_wins() -> None:
    def unknown(key: str) -> ConfigError:
        return ConfigError(f"no {key}")

    pairs = client_pairs({"flag": "true", "retention.ms": "5"}, {"flag": "false"})
    assert pairs == [("flag", "true"), ("retention.ms", "5"), ("flag", "false")]
    with pytest.raises(ConfigError, match=r"^test retention\.ms='5': expected an integer, got a string"):
        read_settings(TABLE, pairs, Origin("test"), unknown)
    assert read_settings(TABLE, pairs[::2], Origin("test"), unknown) == {"flag": False}
    with pytest.raises(ConfigError, match=r"^no other$"):
        read_settings(TABLE, [("other", 1)], Origin("test"), unknown)


def test_the_bad_value_error_quotes_the_value_as_it_was_written() -> None:
    assert str(bad_value(Origin("f.toml:", toml=True), "k", "v", "why")) == 'f.toml: k = "v": why'
    assert str(bad_value(Origin("f.toml:", toml=True), "k", 1.5, "why")) == "f.toml: k = 1.5: why"
    assert str(bad_value(Origin("producer setting"), "k", "v", "why")) == "producer setting k='v': why"


# -------------------------------------------------------------------------------------- the four families


def _message(action: object) -> str:
    assert callable(action)
    with pytest.raises(ConfigError) as caught:
        action()
    return str(caught.value)


@pytest.mark.parametrize(("action", "expected"), [
    (lambda: load_config(overrides=["num.partitions=0"]),
     "--override 'num.partitions=0': num.partitions = 0: must be between 1 and 100000"),
    (lambda: load_config().topic("t", {"segment.bytes": 1}),
     "topic 't' configs: segment.bytes = 1: must be between 14 and 2147483647"),
    (lambda: ProducerConfig.from_settings(linger_ms="soon"),
     "producer setting linger.ms='soon': expected a whole number >= 0"),
    (lambda: Consumer({"log.dirs": "/x", "max.poll.records": 0}),
     "consumer setting max.poll.records=0: must be between 1 and 2147483647"),
    (lambda: parse_options({"bootstrap.servers": "h:1", "MINPARTITIONS": "0"}),
     "appliance data source: option minPartitions='0': expected a whole number >= 1"),
], ids=["server-override", "server-topic", "producer", "consumer", "spark"])
def test_every_family_names_a_bad_value_with_one_shape(action: object, expected: str) -> None:
    """WHERE KEY=VALUE: REASON, the key as declared, the value as the user wrote it."""
    assert _message(action) == expected


def test_the_families_keep_what_they_accept() -> None:
    assert load_config(overrides=["flush.ms=9223372036854775807"]).flush_ms == LONG_MAX
    assert "write it without quotes" in _message(lambda: load_config(overrides=['num.partitions="2"']))
    producer = ProducerConfig.from_settings({"acks": "1", "enable.idempotence": "false", "linger.ms": " 7"})
    assert (producer.acks, producer.idempotent, producer.linger_ms) == (1, False, 7)
    options = parse_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "failondataloss": "False",
                             "maxrecordspertrigger": "9"})
    assert options.bootstrap_servers == "h:1"
    assert (options.fail_on_data_loss, options.max_offsets_per_trigger) == (False, 9)  # the alias
