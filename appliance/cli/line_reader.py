"""How ``appliance produce`` reads a line into a record: kafka-console-producer's ``LineMessageReader``.

A line is, in this order, its headers (with ``parse.headers=true``), then its key (with ``parse.key=true``),
then its value::

    h1:v1,h2:v2<TAB>key<TAB>value

* the headers end at the first ``headers.delimiter`` (a tab); they are split at ``headers.separator``
  (``,``; a regular expression, split as Java's ``Pattern.split`` splits, :func:`java_split`) and each
  piece at its first ``headers.key.separator`` (``:``) into a header's name and value;
* the key ends at the first ``key.separator`` (a tab) after the headers, found as a string (Kafka's
  ``indexOf``, not a regular expression: ``.`` is a dot); the rest is the value.  An empty
  ``key.separator`` is found at once: every key is empty, the whole rest the value, as in Kafka;
* ``null.marker`` (none by default): a key, a value, a header value or the whole headers part equal to it is
  null (no headers, for the last); a header *name* equal to it is an error, as in Kafka;
* a missing delimiter or separator is an error naming the line (:class:`MalformedLineError`: the lines
  before it were sent) unless ``ignore.error=true``: then a line without the headers delimiter has no
  headers, one without the key separator a null key and the whole rest as its value, and a header without
  its key separator a null value.

**Lines** end as Java's ``BufferedReader.readLine`` ends them, at ``\n``, ``\r`` or ``\r\n``
(:class:`LineSplitter`, fed the input a block at a time as it arrives: a ``\r\n`` split across two blocks is
one line end); the last line needs no end, and an empty one there is no record.

Kafka refuses separators that cannot be told apart (``headers.delimiter`` equal to ``headers.separator``,
``null.marker`` equal to a separator, ...): so does :func:`line_format` (:class:`UsageError`).  Lines are
split as bytes, each separator as its UTF-8 bytes, which is how Kafka's reading of UTF-8 text splits them;
bytes that are not UTF-8 are kept as they are (Kafka's reader would replace them).  The headers separator
is a regular expression over characters, as Java's: the headers are split as text (bytes that are not
UTF-8 kept through ``surrogateescape``), with Java's ASCII-only ``\\w``, ``\\d``, ``\\s`` and ``\\b``
(``re.ASCII``); a character outside the Basic Multilingual Plane is one character here and two UTF-16
units in Java, which only a separator matching inside one could tell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from appliance.cli.kafka_forms import UsageError
from storage.errors import ApplianceError

__all__ = ["READER_PROPERTIES", "LineFormat", "LineSplitter", "MalformedLineError", "ParsedLines",
           "java_split", "line_format"]

READER_PROPERTIES: Final = ("parse.key", "key.separator", "parse.headers", "headers.delimiter",
                            "headers.separator", "headers.key.separator", "ignore.error", "null.marker")
Header = tuple[str, bytes | None]


class MalformedLineError(ApplianceError):
    """A line without a separator the reader needs (``ignore.error`` off)."""


@dataclass(frozen=True, slots=True)
class ParsedLines:
    """Records read from lines: values, keys (None: no keys parsed), headers (None: none parsed)."""

    values: list[bytes | None]
    keys: list[bytes | None] | None
    headers: list[list[Header]] | None
    error: MalformedLineError | None  # the first malformed line (those before it are here)


@dataclass(frozen=True, slots=True)
class LineFormat:
    """The reader's properties, decoded; see the module docstring."""

    parse_key: bool = False
    key_separator: bytes = b"\t"
    parse_headers: bool = False
    headers_delimiter: bytes = b"\t"
    headers_separator: re.Pattern[str] = re.compile(",", re.ASCII)
    headers_key_separator: bytes = b":"
    ignore_error: bool = False
    null_marker: bytes | None = None

    @property
    def plain(self) -> bool:
        """Whether a line is only a key and a value (the fast path: no headers, no null marker)."""
        return (not self.parse_headers and self.null_marker is None and not self.ignore_error
                and (not self.parse_key or self.key_separator != b""))

    def parse(self, lines: Sequence[bytes], lines_before: int) -> ParsedLines:
        """The records of ``lines``, numbered from ``lines_before + 1`` in errors."""
        values: list[bytes | None] = []
        keys: list[bytes | None] | None = [] if self.parse_key else None
        headers: list[list[Header]] | None = [] if self.parse_headers else None
        for number, line in enumerate(lines, lines_before + 1):
            try:
                record_headers, key, value = self._record(line, number)
            except MalformedLineError as exc:
                return ParsedLines(values, keys, headers, exc)
            values.append(value)
            if keys is not None:
                keys.append(key)
            if headers is not None:
                headers.append(record_headers)
        return ParsedLines(values, keys, headers, None)

    def _record(self, line: bytes, number: int) -> tuple[list[Header], bytes | None, bytes | None]:
        start = 0
        record_headers: list[Header] = []
        if self.parse_headers:
            end = line.find(self.headers_delimiter)
            if end >= 0:
                part = line[:end]
                start = end + len(self.headers_delimiter)
                if part != self.null_marker:
                    record_headers = self._headers(part, number)
            elif not self.ignore_error:
                raise self._missing("headers delimiter", self.headers_delimiter, line, number)
        key: bytes | None = None
        if self.parse_key:
            end = line.find(self.key_separator, start)
            if end >= 0:
                key = line[start:end]
                start = end + len(self.key_separator)
            elif not self.ignore_error:
                raise self._missing("key separator", self.key_separator, line, number)
        return record_headers, self._nullable(key), self._nullable(line[start:])

    def _headers(self, part: bytes, number: int) -> list[Header]:
        text = part.decode("utf-8", "surrogateescape")
        pieces = [p.encode("utf-8", "surrogateescape") for p in java_split(self.headers_separator, text)]
        out: list[Header] = []
        for piece in pieces:
            name, sep, value = piece.partition(self.headers_key_separator)
            if not sep:
                if not self.ignore_error:
                    raise MalformedLineError(f"line {number}: no header key separator "
                                             f"{_shown(self.headers_key_separator)} in header {piece[:80]!r}")
                out.append((piece.decode("utf-8", "replace"), None))
                continue
            if name == self.null_marker:
                raise MalformedLineError(f"line {number}: header name {name[:80]!r} is the null marker: a "
                                         "header's name cannot be null")
            out.append((name.decode("utf-8", "replace"), self._nullable(value)))
        return out

    def _nullable(self, value: bytes | None) -> bytes | None:
        return None if value is None or value == self.null_marker else value

    @staticmethod
    def _missing(what: str, separator: bytes, line: bytes, number: int) -> MalformedLineError:
        return MalformedLineError(f"line {number}: no {what} {_shown(separator)} in {line[:80]!r}")


def java_split(pattern: re.Pattern[str], text: str) -> list[str]:
    """``text`` split at the matches of ``pattern`` as Java's ``Pattern.split(text)`` splits it: the matches
    found as ``Matcher.find`` finds them (after an empty match the next search starts one character on),
    no empty first piece for an empty match at the very start, the text whole when nothing matched, and the
    empty pieces at the end dropped."""
    pieces: list[str] = []
    index = 0
    start, end = -1, 0  # the last match (Matcher's first and last)
    while True:
        at = end + 1 if end == start else end
        if at > len(text):
            break
        found = pattern.search(text, at)
        if found is None:
            break
        start, end = found.span()
        if index == 0 and start == 0 and end == 0:
            continue  # no empty leading piece for an empty match at the beginning
        pieces.append(text[index:start])
        index = end
    if index == 0:
        return [text]
    pieces.append(text[index:])
    while pieces and not pieces[-1]:
        pieces.pop()
    return pieces


class LineSplitter:
    """Input cut into lines as Java's ``BufferedReader.readLine`` cuts it (module docstring), a block at a
    time: :meth:`feed` gives the lines a block completes, :meth:`end` the last one at the end of input."""

    _ENDS: Final = re.compile(b"\r\n?|\n")

    def __init__(self) -> None:
        self._carry = b""
        self._skip_lf = False  # the last block ended with \r: a \n first in the next one ends nothing

    def feed(self, block: bytes) -> list[bytes]:
        if self._skip_lf and block[:1] == b"\n":
            block = block[1:]
        data = self._carry + block
        if b"\r" in data:
            lines = self._ENDS.split(data)
            self._skip_lf = data.endswith(b"\r")
        else:
            lines = data.split(b"\n")
            self._skip_lf = False
        self._carry = lines.pop()
        return lines

    def end(self) -> list[bytes]:
        carry, self._carry = self._carry, b""
        return [carry] if carry else []


def _shown(separator: bytes) -> str:
    return repr(separator.decode("utf-8", "replace"))


def _true(value: str) -> bool:
    return value.strip().lower() == "true"  # Kafka: equalsIgnoreCase("true") after trim


def line_format(properties: Mapping[str, str], key_separator: str | None = None) -> LineFormat:
    """The reader ``--property`` values ask for (``key_separator``: ours, ``--key-separator``, which
    also turns key parsing on); :class:`UsageError` naming an unknown property or separators Kafka
    refuses together."""
    unknown = sorted(set(properties) - set(READER_PROPERTIES))
    if unknown:
        raise UsageError(f"--property {unknown[0]}: not a property of the console producer's line reader; "
                         f"known: {', '.join(READER_PROPERTIES)}")
    texts = {"key.separator": "\t", "headers.delimiter": "\t", "headers.separator": ",",
             "headers.key.separator": ":"}
    texts.update({k: v for k, v in properties.items() if k in texts})
    parse_key = _true(properties.get("parse.key", "false"))
    if key_separator is not None:
        texts["key.separator"], parse_key = key_separator, True
    if key_separator == "":
        raise UsageError("--key-separator: the separator cannot be empty (--property key.separator= may be: "
                         "every key is then empty, as in Kafka)")
    marker = properties.get("null.marker")
    for first, second in (("headers.delimiter", "headers.separator"), ("headers.delimiter",
                          "headers.key.separator"), ("headers.separator", "headers.key.separator")):
        if texts[first] == texts[second]:
            raise UsageError(f"--property {first} and {second} may not be equal (as in Kafka)")
    for name in ("key.separator", "headers.separator", "headers.delimiter", "headers.key.separator"):
        if marker == texts[name]:
            raise UsageError(f"--property null.marker and {name} may not be equal (as in Kafka)")
    try:
        separator = re.compile(texts["headers.separator"], re.ASCII)
    except re.error as exc:
        raise UsageError(f"--property headers.separator={texts['headers.separator']!r}: not a regular "
                         f"expression ({exc})") from None
    return LineFormat(parse_key=parse_key, key_separator=texts["key.separator"].encode(),
                      parse_headers=_true(properties.get("parse.headers", "false")),
                      headers_delimiter=texts["headers.delimiter"].encode(), headers_separator=separator,
                      headers_key_separator=texts["headers.key.separator"].encode(),
                      ignore_error=_true(properties.get("ignore.error", "false")),
                      null_marker=None if marker is None else marker.encode())
