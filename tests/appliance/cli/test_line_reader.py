"""kafka-console-producer's line reader (``appliance.cli.line_reader``): the records Kafka's
``LineMessageReader`` makes of the same lines with the same properties, its errors, and the separator
combinations it refuses."""

from __future__ import annotations

import re

import pytest

from appliance.cli.kafka_forms import UsageError
from appliance.cli.line_reader import MalformedLineError, java_split, line_format

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
BOTH = {"parse.key": "true", "parse.headers": "true"}


def _read(properties: dict[str, str], text: bytes) -> list[Record]:
    parsed = line_format(properties).parse(text.split(b"\n"), 0)
    assert parsed.error is None, parsed.error
    keys = parsed.keys or [None] * len(parsed.values)
    headers = parsed.headers or [None] * len(parsed.values)  # type: ignore[list-item]
    return list(zip(keys, parsed.values, headers, strict=True))


@pytest.mark.parametrize(
    ("properties", "text", "records"),
    [
        ({"parse.key": "true"}, b"key0\tvalue0\nkey1\tvalue1", [(b"key0", b"value0", None),
                                                               (b"key1", b"value1", None)]),
        (BOTH, b"h0:v0,h1:v1\tkey0\tvalue0", [(b"key0", b"value0", [("h0", b"v0"), ("h1", b"v1")])]),
        (BOTH, b":\t\t", [(b"", b"", [("", b"")])]),
        ({"parse.key": "true"}, b"key\t", [(b"key", b"", None)]),
        ({**BOTH, "key.separator": "\t\t", "headers.delimiter": "\t\t", "headers.separator": "---",
          "headers.key.separator": "::::"},
         b"hk0::::hv0---hk1::::\t\tkey\t\tvalue", [(b"key", b"value", [("hk0", b"hv0"), ("hk1", b"")])]),
        ({"parse.headers": "true"}, b"hk:hv\tvalue", [(None, b"value", [("hk", b"hv")])]),
        ({}, b"value", [(None, b"value", None)]),
        ({**BOTH, "headers.separator": "[,;]"}, b"a:1;b:2,,\tk\tv",
         [(b"k", b"v", [("a", b"1"), ("b", b"2")])]),
        ({**BOTH, "headers.separator": ","}, b",\tk\tv", [(b"k", b"v", [])]),
    ],
    ids=["keys", "headers", "all-empty", "empty-value", "long-separators", "headers-no-key", "value-only",
         "separator-regex", "only-separators"],
)
def test_lines_are_read_as_kafkas_line_reader_reads_them(properties: dict[str, str], text: bytes,
                                                          records: list[Record]) -> None:
    assert _read(properties, text) == records


def test_ignore_error_reads_what_it_can() -> None:
    text = (b"hk0:hv0\tkey0\tvalue0\n"
            b"hk1:hv1,hk2:hv2+key1\tvalue1\n"  # the key separator is taken as the headers delimiter
            b"hk3:hv3\tkey2+value2\n"  # no key separator: a null key, the rest the value
            b"hk4:hv4+key3+value3\n"  # neither: no headers, a null key, the line the value
            b"bad-header\tkey4\tvalue4")  # a header without its key separator: a null value
    assert _read({**BOTH, "ignore.error": "true"}, text) == [
        (b"key0", b"value0", [("hk0", b"hv0")]),
        (None, b"value1", [("hk1", b"hv1"), ("hk2", b"hv2+key1")]),
        (None, b"key2+value2", [("hk3", b"hv3")]),
        (None, b"hk4:hv4+key3+value3", []),
        (b"key4", b"value4", [("bad-header", None)]),
    ]


def test_the_null_marker_makes_keys_values_and_headers_null() -> None:
    text = b"key\t\nkey\t<N>\nkey\t<N>value\n<N>\tvalue\n<N>\t<N>"
    assert _read({"parse.key": "true", "null.marker": "<N>"}, text) == [
        (b"key", b"", None), (b"key", None, None), (b"key", b"<N>value", None), (None, b"value", None),
        (None, None, None)]
    assert _read({"parse.key": "true"}, text)[4] == (b"<N>", b"<N>", None), "no marker: the bytes stay"
    with_headers = b"h0:v0,h1:v1\t<N>\tvalue\n<N>\tkey\t<N>\nh0:<N>,h1:<N>value\tkey\t<N>"
    assert _read({**BOTH, "null.marker": "<N>"}, with_headers) == [
        (None, b"value", [("h0", b"v0"), ("h1", b"v1")]), (b"key", None, []),
        (b"key", None, [("h0", None), ("h1", b"<N>value")])]


@pytest.mark.parametrize(
    ("properties", "line", "message"),
    [
        ({"parse.key": "true"}, b"no separator here", "line 2: no key separator '\\t'"),
        (BOTH, b"h:v+k\tv", "line 2: no key separator"),
        (BOTH, b"no delimiter", "line 2: no headers delimiter '\\t'"),
        (BOTH, b"h=v\tk\tv", "line 2: no header key separator ':' in header b'h=v'"),
        ({**BOTH, "null.marker": "<N>"}, b"<N>:v\tk\tv", "header name b'<N>' is the null marker"),
        ({**BOTH, "null.marker": "<N>", "ignore.error": "true"}, b"<N>:v\tk\tv", "is the null marker"),
    ],
)
def test_a_malformed_line_is_named_after_the_lines_before_it(properties: dict[str, str], line: bytes,
                                                             message: str) -> None:
    parsed = line_format(properties).parse([b"h0:v0\tk0\tv0" if "parse.headers" in properties else b"k0\tv0",
                                            line, b"k\tv"], 0)
    assert isinstance(parsed.error, MalformedLineError) and message in str(parsed.error), parsed.error
    assert len(parsed.values) == 1, "the line before it was read, none after"


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"headers.delimiter": ",", "headers.separator": ","}, "headers.delimiter and headers.separator"),
        ({"headers.delimiter": ":"}, "headers.delimiter and headers.key.separator"),
        ({"headers.separator": ":"}, "headers.separator and headers.key.separator"),
        ({"null.marker": "\t"}, "null.marker and key.separator"),
        ({"null.marker": ",", "key.separator": "|", "headers.delimiter": "|"},
         "null.marker and headers.separator"),
        ({"print.key": "true"}, "print.key: not a property of the console producer's line reader"),
        ({"headers.separator": "("}, "headers.separator='(': not a regular expression"),
    ],
)
def test_separators_kafka_refuses_together_are_refused(properties: dict[str, str], named: str) -> None:
    with pytest.raises(UsageError, match=named.replace("(", r"\(").replace(".", r"\.")):
        line_format(properties)


@pytest.mark.parametrize(
    ("pattern", "text", "pieces"),
    [
        (",", "a,b,,", ["a", "b"]),  # empty pieces at the end dropped
        (",", ",a", ["", "a"]),  # a match at the start: an empty first piece
        (",", ",", []),
        (",", "", [""]),  # nothing matched: the text whole
        ("", "abc", ["a", "b", "c"]),  # an empty match at the start: no empty first piece
        ("", "éa", ["é", "a"]),  # characters, not UTF-8 bytes
        ("x*", "axb", ["a", "", "b"]),
        ("(?=b)", "abab", ["a", "ba", "b"]),
        ("\\w", "é1é", ["é", "é"]),  # Java's \\w is ASCII
    ],
)
def test_headers_are_split_as_javas_pattern_split_splits(pattern: str, text: str, pieces: list[str]) -> None:
    assert java_split(re.compile(pattern, re.ASCII), text) == pieces


def test_a_separator_matching_the_empty_string_splits_headers_as_kafka_does() -> None:
    properties = {**BOTH, "headers.separator": "", "ignore.error": "true"}
    assert _read(properties, "é:1\tk\tv".encode()) == [
        (b"k", b"v", [("é", None), ("", b""), ("1", None)])]


def test_the_key_separator_is_a_string_not_a_regular_expression_and_may_be_empty() -> None:
    """Kafka's LineMessageReader finds key.separator with indexOf: ``.`` is a dot, and an empty separator
    is found at once (every key empty, the line the value)."""
    assert _read({"parse.key": "true", "key.separator": "."}, b"a.b.c\nxyz.") == [
        (b"a", b"b.c", None), (b"xyz", b"", None)]
    assert _read({"parse.key": "true", "key.separator": ""}, b"k\tv\n") == [
        (b"", b"k\tv", None), (b"", b"", None)]
    with pytest.raises(UsageError, match="--key-separator: the separator cannot be empty"):
        line_format({}, "")
