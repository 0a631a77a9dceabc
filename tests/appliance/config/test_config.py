"""appliance.config (server_config, server_settings, listeners): defaults, the TOML file, overrides, errors
an operator would see, topics, round trips."""

from __future__ import annotations

import dataclasses
import grp
import os
import pathlib
import pickle
import re
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.config.listeners import Listener, parse_listener
from appliance.config.server_config import (
    Config,
    ConfigError,
    check_new_topic_name,
    check_topic_name,
    config_from_mapping,
    load_config,
    parse_override,
)
from appliance.config.server_settings import SETTINGS, TOPIC_SETTINGS
from storage.log_config import LogConfig

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "systemd" / "appliance.toml"


@pytest.fixture
def in_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text, encoding="utf-8")
    return path


# -------------------------------------------------------------------------------------- defaults


def test_defaults_with_no_file_are_kafkas(in_tmp: pathlib.Path) -> None:
    config = load_config()
    assert config.log_dirs == (str(in_tmp / "data"),)
    assert config.listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    assert config.advertised_listeners == config.listeners
    assert config.listeners[0].is_loopback
    assert str(config.listeners[0]) == "PLAINTEXT://127.0.0.1:9092"
    expected = {
        "num_partitions": 1, "default_replication_factor": 1, "node_id": 0, "segment_bytes": 1073741824,
        "segment_ms": 604800000, "index_interval_bytes": 4096, "segment_index_bytes": 10485760,
        "retention_ms": 604800000, "retention_bytes": -1, "retention_check_interval_ms": 300000,
        "log_dir_min_free_bytes": 33554432,
        "flush_messages": 2**63 - 1, "flush_ms": 2**63 - 1, "socket_request_max_bytes": 104857600,
        "min_insync_replicas": 1, "replica_lag_time_max_ms": 30000, "auto_create_topics_enable": True,
        "delete_topic_enable": True, "max_message_bytes": 1048588, "message_timestamp_type": "CreateTime",
        "cleanup_policy": ("delete",), "ring_bytes": 16 * 1024 * 1024, "ring_initial_bytes": 256 * 1024,
        "ring_idle_ms": 30_000, "shm_group": None, "shm_gid": None,
        "replica_dirs": (), "replica_leader": None, "cluster_secret_file": None, "log_level": "INFO",
        "test_faults": (),
    }
    assert {name: getattr(config, name) for name in expected} == expected
    assert config.broker_id == 0
    assert config.shm_mode == 0o600
    assert config.control_socket == str(in_tmp / "data" / ".appliance.sock")
    assert config.unix_listener == str(in_tmp / "data" / ".broker.sock")
    assert config.topics == {}
    assert config.source is None
    assert re.fullmatch(r"[0-9a-f]{16}", config.instance_id)


def test_a_config_pickles_for_child_processes(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "p.toml", '[topics.orders]\npartitions = 3\n"cleanup.policy" = "delete"\n')
    config = load_config(path)
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config
    assert copy.topics["orders"].overrides == {"partitions": 3, "cleanup.policy": ("delete",)}
    with pytest.raises(TypeError):
        config.topics["x"] = config.topics["orders"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_partitions = 2  # type: ignore[misc]


def test_instance_id_follows_the_data_dir(tmp_path: pathlib.Path) -> None:
    a = load_config(overrides=[f"log.dirs={tmp_path / 'a'}"])
    a_again = load_config(overrides=[f"log.dirs={tmp_path / 'b' / '..' / 'a'}"])
    b = load_config(overrides=[f"log.dirs={tmp_path / 'b'}"])
    assert a.instance_id == a_again.instance_id
    assert a.instance_id != b.instance_id
    with pytest.raises(ConfigError, match=r"appliance\.instance\.id"):  # derived, never configured
        load_config(overrides=["appliance.instance.id=blue-1"])


def test_relative_paths_become_absolute_against_the_working_directory(in_tmp: pathlib.Path) -> None:
    config = load_config(overrides=['log.dirs=["d1", "sub/d2"]', "appliance.control.socket=ctl.sock"])
    assert config.log_dirs == (str(in_tmp / "d1"), str(in_tmp / "sub" / "d2"))
    assert config.control_socket == str(in_tmp / "ctl.sock")
    assert config.unix_listener == str(in_tmp / "d1" / ".broker.sock")


# -------------------------------------------------------------------------------------- file and overrides


def test_file_then_overrides_in_order(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "a.toml", '"retention.ms" = 1000\n"num.partitions" = 3\n"segment.bytes" = 4096\n')
    config = load_config(path)
    assert (config.retention_ms, config.num_partitions, config.segment_bytes) == (1000, 3, 4096)
    assert config.source == str(path)
    config = load_config(path, ["log.retention.hours=2", "num.partitions=5", "num.partitions=6"])
    assert config.retention_ms == 2 * 3_600_000  # an override under another name of the same setting wins
    assert config.num_partitions == 6  # the last override wins
    assert config.segment_bytes == 4096  # the file's value stays where nothing overrides it


@pytest.mark.parametrize(
    "text",
    [
        '"log.dirs" = ["/srv/a", "/srv/b"]\n"log.retention.hours" = 24\n"appliance.ring.bytes" = 1048576\n',
        '[log]\ndirs = ["/srv/a", "/srv/b"]\nretention.hours = 24\n[appliance]\nring.bytes = 1048576\n',
        'log.dirs = ["/srv/a", "/srv/b"]\nlog.retention.hours = 24\nappliance.ring.bytes = 1048576\n',
        '"log.dirs" = "/srv/a,/srv/b"\n"retention.ms" = 86400000\n[appliance.ring]\nbytes = 1048576\n',
    ],
    ids=["canonical", "tables", "dotted", "kafka-comma-list"],
)
def test_every_spelling_gives_the_same_config(tmp_path: pathlib.Path, text: str) -> None:
    config = load_config(write(tmp_path / "c.toml", text))
    assert config.log_dirs == ("/srv/a", "/srv/b")
    assert config.retention_ms == 86_400_000
    assert config.ring_bytes == 1_048_576


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"retention.ms" = 1\n"log.retention.hours" = 2\n',
         "'retention.ms' is given twice: as 'retention.ms' and 'log.retention.hours'"),
        ('"node.id" = 1\n"broker.id" = 1\n', "'node.id' is given twice"),
        ('"log.dirs" = ["/a"]\n[log]\ndirs = ["/b"]\n', "'log.dirs' is given twice"),
    ],
)
def test_a_setting_given_twice_in_one_file_is_an_error(
    tmp_path: pathlib.Path, text: str, message: str
) -> None:
    path = write(tmp_path / "twice.toml", text)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_and_unreadable_files(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read the configuration file: No such file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path / "bad.toml", '"log.dirs" = [\n'))
    (tmp_path / "latin1.toml").write_bytes(b'"appliance.log.level" = "\xe9"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 25\)"):
        load_config(tmp_path / "latin1.toml")


# -------------------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("log.retention.hour", "log.retention.hours"),
        ("segment.byte", "segment.bytes"),
        ("num.partition", "num.partitions"),
        ("listener", "listeners"),
        ("appliance.ring.byte", "appliance.ring.bytes"),
        ("auto.create.topic.enable", "auto.create.topics.enable"),
    ],
)
def test_unknown_key_names_it_and_the_nearest_known_one(
    tmp_path: pathlib.Path, key: str, suggestion: str
) -> None:
    path = write(tmp_path / "typo.toml", f'"{key}" = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: unknown setting {key!r}; did you mean {suggestion!r}?"
    with pytest.raises(ConfigError, match=re.escape(f"did you mean {suggestion!r}?")):
        load_config(overrides=[f"{key}=1"])


def test_unknown_key_without_a_near_one_points_at_the_docs(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'zzzz'; see docs/configuration.md"):
        load_config(write(tmp_path / "z.toml", "zzzz = 1\n"))


def test_unknown_nested_key_is_named_by_its_dotted_path(tmp_path: pathlib.Path) -> None:
    message = r"unknown setting 'log.retention.hour'; did you mean 'log.retention.hours'"
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "n.toml", "[log.retention]\nhour = 1\n"))


# -------------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('"segment.bytes" = "1073741824"',
         'segment.bytes = "1073741824": expected an integer, got a string; write it without quotes'),
        ('"segment.bytes" = 13', "segment.bytes = 13: must be between 14 and 2147483647"),
        ('"segment.bytes" = 2147483648', "must be between 14 and 2147483647"),
        ('"num.partitions" = 0', "num.partitions = 0: must be between 1 and 100000"),
        ('"num.partitions" = true', "expected an integer, got a boolean"),
        ('"num.partitions" = 1.5', "expected an integer, got float"),
        ('"retention.ms" = -2', "retention.ms = -2: must be between -1 and"),
        ('"log.retention.hours" = -2', "log.retention.hours = -2: must be between -1 and"),
        ('"log.retention.hours" = 9223372036854775807', "log.retention.hours = 9223372036854775807: must be"),
        ('"auto.create.topics.enable" = "yes"', "expected true or false, got a string"),
        ('"log.dirs" = []', "log.dirs = []: expected at least one directory"),
        ('"log.dirs" = ["/a", "/a"]', "lists /a twice"),
        ('"log.dirs" = [1]', "expected a string, got an integer"),
        ('"log.dirs" = 5', "expected an array of strings or a comma-separated string, got an integer"),
        ('"listeners" = "PLAINTEXT://127.0.0.1"', "expected HOST:PORT"),
        ('"listeners" = "PLAINTEXT://127.0.0.1:99999"', "the port must be a number from 0 to 65535"),
        ('"listeners" = "HTTP://127.0.0.1:80"', "unknown listener name 'HTTP'"),
        ('"listeners" = "PLAINTEXT://::1:9092"', "write an IPv6 host in brackets"),
        ('"listeners" = "PLAINTEXT://[::g]:9092"', "is not an IPv6 address"),
        ('"listeners" = "PLAINTEXT://bad_host!:9092"', "is not a host name or address"),
        ('"listeners" = ["PLAINTEXT://a:1", "PLAINTEXT://b:2"]', "names listener PLAINTEXT twice"),
        ('"listeners" = ["PLAINTEXT://a:1", "SSL://b:1"]', "uses port 1 twice"),
        ('"listeners" = []', "expected at least one listener"),
        ('"advertised.listeners" = "SSL://h:1"', "advertised.listeners names SSL, which listeners lacks"),
        ('"advertised.listeners" = "PLAINTEXT://0.0.0.0:9092"', "is no address a client can reach"),
        ('"cleanup.policy" = "shred"', "unknown policy 'shred'"),
        ('"message.timestamp.type" = "Now"', "expected one of CreateTime, LogAppendTime"),
        ('"appliance.ring.bytes" = 100000', "must be a multiple of 4096"),
        ('"appliance.ring.bytes" = 4096', "must be between 65536 and"),
        ('"appliance.shm.group" = "no-such-group-xyz"',
         "appliance.shm.group = 'no-such-group-xyz': no such group"),
        ('"appliance.replica.leader" = "nohost"', "expected HOST:PORT"),
        ('"appliance.replica.dirs" = ["/srv/a"]\n"log.dirs" = ["/srv/a"]', "/srv/a is in both log.dirs and"),
        ('"appliance.log.level" = "LOUD"', "expected one of DEBUG, INFO"),
        ('"appliance.control.socket" = "/' + "x" * 120 + '"',
         "over the 107-byte limit of a Unix socket path"),
    ],
)
def test_bad_values_are_refused_with_the_key_and_the_reason(
    tmp_path: pathlib.Path, line: str, message: str
) -> None:
    path = write(tmp_path / "bad.toml", line + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(path)
    assert str(info.value).startswith(str(path) + ":")


def test_a_long_data_dir_needs_a_shorter_socket_path(tmp_path: pathlib.Path) -> None:
    deep = tmp_path / ("d" * 100)
    with pytest.raises(ConfigError, match=r"control\.socket .* set appliance\.control\.socket to a"):
        load_config(overrides=[f"log.dirs={deep}"])
    config = load_config(overrides=[f"log.dirs={deep}", f"appliance.control.socket={tmp_path}/c.sock",
                                    'appliance.unix.listener=""'])
    assert config.unix_listener is None


def test_shm_group_opens_shared_memory_to_that_group() -> None:
    name = grp.getgrgid(os.getgid()).gr_name
    config = load_config(overrides=[f"appliance.shm.group={name}"])
    assert (config.shm_group, config.shm_gid, config.shm_mode) == (name, os.getgid(), 0o660)
    assert load_config(overrides=[f"appliance.shm.group={os.getgid()}"]).shm_gid == os.getgid()
    assert config_from_mapping({"appliance.shm.group": os.getgid()}).shm_group == str(os.getgid())
    assert load_config(overrides=[f"appliance.shm.group={name}", "appliance.shm.group="]).shm_mode == 0o600


# -------------------------------------------------------------------------------------- listeners


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PLAINTEXT://127.0.0.1:9092", Listener("PLAINTEXT", "127.0.0.1", 9092)),
        ("plaintext://localhost:0", Listener("PLAINTEXT", "localhost", 0)),
        ("SASL_PLAINTEXT://[::1]:9093", Listener("SASL_PLAINTEXT", "::1", 9093)),
        ("PLAINTEXT://:9092", Listener("PLAINTEXT", "", 9092)),
        ("10.1.2.3:9092", Listener("PLAINTEXT", "10.1.2.3", 9092)),
        ("SSL://broker-1.example.org:9094", Listener("SSL", "broker-1.example.org", 9094)),
    ],
)
def test_listener_syntax(text: str, expected: Listener) -> None:
    listener = parse_listener(text)
    assert listener == expected
    assert parse_listener(str(listener)) == listener


def test_listeners_on_every_interface_advertise_this_host() -> None:
    config = load_config(overrides=["listeners=PLAINTEXT://0.0.0.0:9092,SSL://[::1]:9093"])
    assert [str(x) for x in config.listeners] == ["PLAINTEXT://0.0.0.0:9092", "SSL://[::1]:9093"]
    assert [x.is_loopback for x in config.listeners] == [False, True]
    assert config.advertised_listeners == (Listener("PLAINTEXT", socket.gethostname(), 9092),
                                           Listener("SSL", "::1", 9093))


# -------------------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("num.partitions=8", ("num.partitions", 8)),
        (" num.partitions = 8 ", ("num.partitions", 8)),
        ("auto.create.topics.enable=false", ("auto.create.topics.enable", False)),
        ('log.dirs=["/a", "/b"]', ("log.dirs", ["/a", "/b"])),
        ("log.dirs=/var/lib/x", ("log.dirs", "/var/lib/x")),
        ('appliance.log.level="7"', ("appliance.log.level", "7")),
        ("listeners=PLAINTEXT://127.0.0.1:0", ("listeners", "PLAINTEXT://127.0.0.1:0")),
        ("appliance.log.level=2024-01-01", ("appliance.log.level", "2024-01-01")),
        ("appliance.log.level=1.5", ("appliance.log.level", "1.5")),
        ("a=1\nb = 2", ("a", "1\nb = 2")),
        ("k=", ("k", "")),
        ("k=x=y", ("k", "x=y")),
    ],
)
def test_parse_override(text: str, expected: tuple[str, object]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["", "=5", "novalue", " = 1"])
def test_malformed_override(text: str) -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(overrides=[text])


# -------------------------------------------------------------------------------------- topics


def test_topics_tables(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.toml", """
"num.partitions" = 3
"retention.ms" = 1000
[topics.orders]
partitions = 12
"replication.factor" = 1
"retention.ms" = 5000
"cleanup.policy" = "delete"
[topics."logs.v1"]
segment.bytes = 1048576
[topics.plain]
""")
    config = load_config(path)
    assert list(config.topics) == ["orders", "logs.v1", "plain"]
    orders = config.topics["orders"]
    assert (orders.partitions, orders.replication_factor, orders.retention_ms) == (12, 1, 5000)
    assert orders.cleanup_policy == ("delete",)
    assert orders.segment_bytes == config.segment_bytes  # inherited
    logs = config.topic("logs.v1")
    assert (logs.partitions, logs.segment_bytes, logs.retention_ms) == (3, 1048576, 1000)
    assert dict(logs.overrides) == {"segment.bytes": 1048576}
    assert config.topics["plain"].overrides == {}
    # a topic the file does not declare gets the broker defaults
    other = config.topic("other")
    assert (other.partitions, other.retention_ms, other.overrides) == (3, 1000, {})


def test_topic_overrides_from_create_topics(in_tmp: pathlib.Path) -> None:
    config = load_config(overrides=["topics.orders.retention.ms=5000"])
    topic = config.topic("orders", {"partitions": 4, "segment.bytes": 65536})
    assert (topic.partitions, topic.segment_bytes, topic.retention_ms) == (4, 65536, 5000)
    with pytest.raises(ConfigError, match=r"topic 'orders' configs: segment.bytes = 1: must be between 14"):
        config.topic("orders", {"segment.bytes": 1})
    with pytest.raises(ConfigError, match=r"unknown topic setting 'retention.m' .* mean 'retention.ms'"):
        config.topic("orders", {"retention.m": 1})


@pytest.mark.parametrize(
    ("override", "topic", "attr", "value"),
    [
        ("topics.orders.partitions=6", "orders", "partitions", 6),
        ("topics.logs.v1.retention.ms=7", "logs.v1", "retention_ms", 7),
        ("topics.a.b.c.log.retention.hours=1", "a.b.c", "retention_ms", 3_600_000),
        ("topics.x.replication.factor=3", "x", "replication_factor", 3),
    ],
)
def test_topic_overrides_on_the_command_line(override: str, topic: str, attr: str, value: int) -> None:
    config = load_config(overrides=[override])
    assert list(config.topics) == [topic]
    assert getattr(config.topics[topic], attr) == value


def test_topic_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"'partition' for topic 'orders'; did you mean 'partitions'"):
        load_config(write(tmp_path / "a.toml", "[topics.orders]\npartition = 3\n"))
    with pytest.raises(ConfigError, match=r"a topic name with a dot must be quoted: \[topics\.\"orders\.v1"):
        load_config(write(tmp_path / "b.toml", "[topics.orders.v1]\npartitions = 3\n"))
    with pytest.raises(ConfigError, match=r"may contain only ASCII letters"):
        load_config(write(tmp_path / "c.toml", '[topics."../etc"]\npartitions = 3\n'))
    with pytest.raises(ConfigError, match=r"topics must hold tables"):
        load_config(write(tmp_path / "d.toml", "topics = 3\n"))
    with pytest.raises(ConfigError, match=r"topics.orders must be a table"):
        load_config(write(tmp_path / "e.toml", "[topics]\norders = 3\n"))
    with pytest.raises(ConfigError, match=r"partitions = 0: must be between 1"):
        load_config(write(tmp_path / "f.toml", "[topics.orders]\npartitions = 0\n"))
    with pytest.raises(ConfigError, match=r"'partitions' is given twice"):
        load_config(write(tmp_path / "g.toml", '[topics.orders]\npartitions = 1\n"num.partitions" = 2\n'))
    with pytest.raises(ConfigError, match=r"expected topics.NAME.SETTING"):
        load_config(overrides=["topics.orders=3"])
    with pytest.raises(ConfigError, match=r"topic '': a topic name cannot be empty"):
        load_config().topic("")


@pytest.mark.parametrize(
    ("name", "ok"),
    [("orders", True), ("a.b_c-D9", True), ("x" * 249, True), ("x" * 250, False), ("", False), (".", False),
     ("..", False), ("a/b", False), ("a b", False), ("é", False), ("a\x00", False)],
)
def test_topic_names_follow_kafkas_rules(name: str, ok: bool) -> None:
    assert (check_topic_name(name) is None) == ok


def test_log_config_for_a_topic(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "l.toml", """
"log.segment.bytes" = 8388608
"log.index.interval.bytes" = 1024
"log.index.size.max.bytes" = 65536
"log.roll.hours" = 1
"log.flush.interval.messages" = 100
"log.flush.interval.ms" = 2000
"message.max.bytes" = 2000000
[topics.small]
"segment.bytes" = 65536
"retention.bytes" = 1000000
""")
    config = load_config(path)
    assert config.log_config("small") == LogConfig(
        segment_bytes=65536, segment_ms=3_600_000, index_interval_bytes=1024, segment_index_bytes=65536,
        retention_ms=604_800_000, retention_bytes=1_000_000, flush_messages=100, flush_ms=2000,
        max_message_bytes=2_000_000,
    )
    assert config.log_config("other").segment_bytes == 8388608
    assert config.log_config("other", {"retention.ms": -1}).retention_ms == -1
    assert load_config().log_config("t") == LogConfig()  # our defaults are storage's (Kafka's)


# -------------------------------------------------------------------------------------- the example file


def test_the_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert config.log_dirs == ("/var/lib/log-appliance",)
    assert config.control_socket == "/run/log-appliance/control.sock"
    assert config.topics["events"].partitions == 8
    assert all(listener.is_loopback for listener in config.listeners)


def test_truncated_or_garbled_files_give_config_errors_only(tmp_path: pathlib.Path) -> None:
    data = EXAMPLE.read_bytes()
    path = tmp_path / "cut.toml"
    outcomes = {"ok": 0, "error": 0}
    for end in range(len(data)):
        path.write_bytes(data[:end])
        try:
            load_config(path)
            outcomes["ok"] += 1
        except ConfigError:
            outcomes["error"] += 1
    assert outcomes["ok"] and outcomes["error"]
    for trailer in (b"\x00", b"\xff\xfe", b"garbage", b"[topics.events]\n", b'"num.partitions" = 2\n'):
        path.write_bytes(data + trailer)
        with pytest.raises(ConfigError):
            load_config(path)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_raise_only_config_error(tmp_path: pathlib.Path, data: bytes) -> None:
    path = tmp_path / "g.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError:
        pass


# -------------------------------------------------------------------------------------- round trip


_values = st.fixed_dictionaries(
    {},
    optional={
        "num.partitions": st.integers(1, 100_000),
        "log.segment.bytes": st.integers(14, 2**31 - 1),
        "log.retention.hours": st.integers(-1, 10**6),
        "retention.bytes": st.integers(-1, 2**63 - 1),
        "flush.messages": st.integers(1, 2**63 - 1),
        "auto.create.topics.enable": st.booleans(),
        "message.timestamp.type": st.sampled_from(["CreateTime", "logappendtime"]),
        "cleanup.policy": st.sampled_from(["delete", ["delete"], "delete,delete"]),
        "listeners": st.sampled_from(["PLAINTEXT://127.0.0.1:0", "PLAINTEXT://[::1]:9092,SSL://:9093"]),
        "appliance.ring.bytes": st.integers(16, 4096).map(lambda pages: pages * 4096),
        "appliance.replica.leader": st.sampled_from(["", "127.0.0.1:9092", "[::1]:1"]),
        "log.dirs": st.lists(st.text("abc\"\\ é\t", min_size=1, max_size=8), min_size=1, max_size=3,
                             unique=True).map(lambda names: [f"/srv/{name}" for name in names]),
    },
)
_topics = st.dictionaries(
    st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True).filter(  # a name a configuration may hold
        lambda n: n not in (".", "..") and not n.startswith("__")),
    st.fixed_dictionaries({}, optional={"partitions": st.integers(1, 64),
                                        "retention.ms": st.integers(-1, 10**12),
                                        "segment.bytes": st.integers(14, 2**31 - 1)}),
    max_size=3,
)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(_values, _topics)
def test_to_toml_round_trips(
    tmp_path: pathlib.Path, values: dict[str, object], topics: dict[str, object]
) -> None:
    config = config_from_mapping({**values, "topics": topics})
    path = write(tmp_path / "round.toml", config.to_toml())
    again = load_config(path)
    fields = {name: getattr(config, name) for name in config.__dataclass_fields__}
    assert again == Config(**{**fields, "source": str(path)})


# -------------------------------------------------------------------------------------- docs


def test_every_setting_and_alias_is_documented() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for setting in (*SETTINGS, *TOPIC_SETTINGS):
        for name in (setting.name, *(alias for alias, _ in setting.aliases)):
            assert f"`{name}`" in doc, name


@pytest.mark.parametrize(("policy", "loaded"), [("compact", ("compact",)),
                                              ("compact,delete", ("delete", "compact")),
                                              ('["delete", "compact"]', ("delete", "compact"))])
def test_compaction_is_accepted_everywhere_a_policy_is_given(tmp_path: pathlib.Path, policy: str,
                                                             loaded: tuple[str, ...]) -> None:
    value = policy if policy.startswith("[") else f'"{policy}"'
    for name in ("cleanup.policy", "log.cleanup.policy"):
        assert load_config(write(tmp_path / "c.toml", f'"{name}" = {value}\n')).cleanup_policy == loaded
    config = load_config(write(tmp_path / "c.toml", f'[topics.orders]\n"cleanup.policy" = {value}\n'))
    assert config.topic("orders").cleanup_policy == loaded
    assert load_config().topic("orders", {"cleanup.policy": policy.strip('[]"').replace('", "', ",")}
                               ).cleanup_policy == loaded


def test_the_cleaners_settings_have_kafkas_names_and_defaults(tmp_path: pathlib.Path) -> None:
    config = load_config()
    assert (config.cleaner_enable, config.cleaner_dedupe_buffer_size, config.cleaner_backoff_ms,
            config.cleaner_threads) == (True, 134_217_728, 15_000, 1)
    assert config.cleaner_io_max_bytes_per_second == 1.7976931348623157e308
    assert (config.min_cleanable_dirty_ratio, config.delete_retention_ms, config.min_compaction_lag_ms) == (
        0.5, 86_400_000, 0)
    text = '"log.cleaner.min.cleanable.ratio" = 0.2\n"log.cleaner.delete.retention.ms" = 5\n'
    loaded = load_config(write(tmp_path / "c.toml", text))
    assert loaded.topic("t").min_cleanable_dirty_ratio == 0.2
    assert loaded.topic("t", {"delete.retention.ms": 7}).delete_retention_ms == 7
    assert config.cleaner_nice == 10  # appliance.cleaner.nice: not Kafka's (docs/configuration.md)
    assert load_config(write(tmp_path / "c.toml", '"appliance.cleaner.nice" = 19\n')).cleaner_nice == 19
    for bad in ('"log.cleaner.threads" = 2', '"log.cleaner.io.max.bytes.per.second" = 0',
                '"min.cleanable.dirty.ratio" = 1.5', '"appliance.cleaner.nice" = 20',
                '"appliance.cleaner.nice" = -1'):
        with pytest.raises(ConfigError, match=bad.split('"')[1]):
            load_config(write(tmp_path / "c.toml", bad + "\n"))


def test_internal_topic_names_are_refused_in_the_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="reserved for the appliance's internal topics"):
        load_config(write(tmp_path / "i.toml", "[topics.__consumer_offsets]\npartitions = 1\n"))
    assert check_new_topic_name("__x") is not None
    assert check_new_topic_name("__x", internal=True) is None
    assert check_new_topic_name("a__x") is None
