"""``appliance produce TOPIC``: the line reader (whole input, byte by byte, CRLF, missing separators) and
the command end to end against a real ``appliance serve``, read back from the log."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.harness import REPO, Appliance

from appliance.cli.line_reader import LineFormat, line_format
from appliance.cli.main import _COMMANDS
from appliance.cli.produce import MalformedLineError, _parser, producer_settings, read_records
from appliance.client.partitioner import KeyPartitioner
from storage.batch_header import parse_header
from storage.batch_reader import Record, iter_records
from storage.compression import CODECS_BY_NAME
from storage.errors import ConfigError


class _Trickle(io.RawIOBase):
    """A stream that hands out at most ``step`` bytes per read (a pipe written slowly)."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = data
        self._step = step

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        piece, self._data = self._data[: self._step], self._data[self._step :]
        return piece

    def read(self, size: int = -1) -> bytes:
        return self.read1(size)


Line = tuple[bytes, bytes | None]


def _format(separator: bytes | None) -> LineFormat:
    return line_format({}, None if separator is None else separator.decode())


def _lines(data: bytes, separator: bytes | None = None, step: int | None = None) -> list[Line]:
    stream = _Trickle(data, step or max(len(data), 1))
    out: list[tuple[bytes, bytes | None]] = []
    for parsed in read_records(stream, _format(separator)):  # type: ignore[arg-type]
        out += zip(parsed.values, parsed.keys or [None] * len(parsed.values), strict=True)  # type: ignore[arg-type]
    return out


def test_lines_become_records_whole_or_trickled_byte_by_byte() -> None:
    data = b"one\ntwo\r\n\nlast without newline"
    expected = [(b"one", None), (b"two", None), (b"", None), (b"last without newline", None)]
    assert _lines(data) == expected
    assert _lines(data, step=1) == expected
    assert _lines(b"") == []
    assert _lines(b"only\n") == [(b"only", None)]
    assert _lines(b"\r\n") == [(b"", None)]


def test_keys_split_at_the_first_separator() -> None:
    data = b"k1:v1\nk2::v:2\r\n:empty key\nk4:\n"
    expected = [(b"v1", b"k1"), (b":v:2", b"k2"), (b"empty key", b""), (b"", b"k4")]
    assert _lines(data, b":") == expected
    assert _lines(data, b":", step=1) == expected
    assert _lines(b"a=>b\n", b"=>", step=1) == [(b"b", b"a")]


def test_a_line_without_the_separator_is_named_after_the_lines_before_it() -> None:
    stream = _Trickle(b"k:v\nk:w\nnope\nk:x\n", 4)
    seen = []
    with pytest.raises(MalformedLineError, match=r"line 3: no key separator ':' in b'nope'"):
        for parsed in read_records(stream, _format(b":")):  # type: ignore[arg-type]
            seen += parsed.values
    assert seen == [b"v", b"w"], "the lines before the bad one were handed out"


def _read_lines(data: bytes) -> list[bytes]:
    """Java's ``BufferedReader.readLine`` until it returns null: a line ends at \\n, \\r or \\r\\n."""
    lines: list[bytes] = []
    line = bytearray()
    i = 0
    while i < len(data):
        byte = data[i : i + 1]
        if byte in (b"\n", b"\r"):
            lines.append(bytes(line))
            line = bytearray()
            if byte == b"\r" and data[i + 1 : i + 2] == b"\n":
                i += 1
        else:
            line += byte
        i += 1
    return lines + ([bytes(line)] if line else [])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"\n\r", b"\x00"]), max_size=40),
       st.integers(1, 7))
def test_lines_end_as_javas_read_line_ends_them(pieces: list[bytes], step: int) -> None:
    """A lone \\r ends a line too, and a \\r\\n cut between two blocks is one line end."""
    data = b"".join(pieces)
    assert [value for value, _ in _lines(data, step=step)] == _read_lines(data)


def test_a_lone_carriage_return_ends_a_line() -> None:
    expected = [(b"v1", b"k1"), (b"v2", b"k2"), (b"v3", b"k3")]
    assert _lines(b"k1:v1\rk2:v2\r\nk3:v3\r", b":") == expected
    assert _lines(b"k1:v1\rk2:v2\r\nk3:v3\r", b":", step=1) == expected


def test_settings_from_the_command_line(tmp_path: Path) -> None:
    def parse(*argv: str) -> tuple[dict[str, object], LineFormat]:
        return producer_settings(_parser().parse_args(["t", *argv]))

    settings_, lines = parse("--property", "parse.key=true", "--data-dir", str(tmp_path))
    assert lines.parse_key and lines.key_separator == b"\t", "Kafka's default key.separator"
    assert settings_["appliance.data.dir"] == str(tmp_path) and settings_["acks"] == "all"
    settings_, lines = parse("--key-separator", "::", "--control-socket", "/s", "--acks", "0",
                             "--compression", "zstd", "--linger-ms", "7", "--producer-property",
                             "max.block.ms=10")
    assert lines.key_separator == b"::"
    assert settings_ == {"max.block.ms": "10", "acks": "0", "compression.type": "zstd", "linger.ms": 7,
                         "appliance.control.socket": "/s"}
    config = tmp_path / "a.toml"
    config.write_text(f'"log.dirs" = ["{tmp_path}/d"]\n')
    settings_, _ = parse("--config", str(config))
    assert settings_["appliance.control.socket"] == f"{tmp_path}/d/.appliance.sock"
    with pytest.raises(ConfigError, match=r"print\.value: not a property of the console producer's line"):
        parse("--property", "print.value=true")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse("--producer-property", "oops")
    with pytest.raises(ConfigError, match="cannot be empty"):
        parse("--key-separator", "")


# -- end to end --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    serve = Appliance(None, "topics.lines.partitions=3", "topics.plain.partitions=1",
                      "topics.squeezed.partitions=1", "topics.plain-lz4.partitions=1",
                      "topics.plain-snappy.partitions=1", "listeners=PLAINTEXT://127.0.0.1:0")
    try:
        serve.start()
        yield serve
    finally:
        serve.close()


def _produce(serve: Appliance, *args: str, stdin: bytes, console_script: bool = False,
             ) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if console_script:
        command = [str(Path(sys.executable).parent / "appliance"), "produce"]
    else:
        command = [sys.executable, "-m", "appliance.cli.produce"]
    return subprocess.run([*command, *args, "--control-socket", str(serve.socket_path)], input=stdin, env=env,
                          capture_output=True, timeout=60)  # fmt: skip


def _records(serve: Appliance, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    for data in serve.batches(topic, partition):
        records += iter_records(data)
    return records


def test_the_console_script_sends_keyed_lines(appliance: Appliance) -> None:
    lines = [b"user-%d:event %d" % (i % 7, i) for i in range(300)]
    assert "produce" in _COMMANDS
    done = _produce(appliance, "lines", "--key-separator", ":", stdin=b"\n".join(lines) + b"\n",
                    console_script=True)
    assert done.returncode == 0, done.stderr.decode()
    logged = {(r.key, r.value) for p in range(3) for r in _records(appliance, "lines", p)}
    assert logged == {tuple(line.split(b":", 1)) for line in lines}
    partitioner = KeyPartitioner(3)
    for p in range(3):
        assert all(partitioner.partition(r.key or b"") == p for r in _records(appliance, "lines", p))


@pytest.mark.parametrize("codec", ["zstd", "lz4", "snappy"])
def test_produce_sends_lines_in_order_and_compressed(appliance: Appliance, codec: str) -> None:
    topic = "plain" if codec == "zstd" else f"plain-{codec}"
    lines = [b"line %06d " % i + b"y" * (i % 50) for i in range(100_000)]
    done = _produce(appliance, topic, "--compression", codec, "--acks", "1", stdin=b"\r\n".join(lines))
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()
    assert [r.value for r in _records(appliance, topic, 0)] == lines
    assert {parse_header(b).compression for b in appliance.batches(topic, 0)} == {CODECS_BY_NAME[codec]}


def test_produce_stops_at_a_malformed_line_after_sending_the_ones_before(appliance: Appliance) -> None:
    done = _produce(appliance, "squeezed", "--property", "parse.key=true", "--property", "key.separator=|",
                    stdin=b"a|1\nb|2\nno separator\nc|3\n")
    assert done.returncode == 1
    assert b"line 3: no key separator '|'" in done.stderr
    assert [(r.key, r.value) for r in _records(appliance, "squeezed", 0)] == [(b"a", b"1"), (b"b", b"2")]


def test_produce_without_an_appliance_says_where_it_looked(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "appliance.cli.produce", "t", "--data-dir", str(tmp_path)],
                          input=b"x\n", env=env, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert f"{tmp_path}/.appliance.sock".encode() in done.stderr and b"appliance serve" in done.stderr
