"""The lines ``appliance consume`` prints: kafka-console-consumer's ``DefaultMessageFormatter``, byte for
byte.

A record is written as its chosen fields in this order, each followed by ``key.separator`` (a tab) when a
later field is printed, the last by ``line.separator`` (a newline)::

    CreateTime:1234   Partition:0   Offset:5   h1:v1,h2:v2   key   value

* ``print.timestamp``: ``CreateTime:<ms>`` or ``LogAppendTime:<ms>``, the record's timestamp type;
* ``print.partition``: ``Partition:<p>``; ``print.offset``: ``Offset:<o>``;
* ``print.headers``: ``name:value`` pairs joined by ``headers.separator`` (``,``), or ``NO_HEADERS``;
* ``print.key``: the key; ``print.value`` (on by default): the value.

A null key, value or header value is written as ``null.literal`` (``null``).  Keys, values and header
values are written as the bytes they are (Kafka's default deserializers pass bytes through).  With no field
at all chosen (``print.value=false`` alone) nothing is written.  Properties are read as Kafka reads them:
a boolean is true only if it says ``true`` in any case; a separator is taken as its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from appliance.cli.kafka_forms import UsageError
from appliance.client.consumer import ConsumerRecord

__all__ = ["DEFAULT_FORMATTERS", "FORMATTER_PROPERTIES", "MessageFormatter"]

# the names kafka-console-consumer gives its default formatter, old and new
DEFAULT_FORMATTERS: Final = ("kafka.tools.DefaultMessageFormatter",
                             "org.apache.kafka.tools.consumer.DefaultMessageFormatter",
                             "DefaultMessageFormatter")
_BOOLEANS: Final = ("print.timestamp", "print.key", "print.value", "print.partition", "print.offset",
                    "print.headers")
_SEPARATORS: Final = ("key.separator", "line.separator", "headers.separator", "null.literal")
FORMATTER_PROPERTIES: Final = (*_BOOLEANS, *_SEPARATORS)
_TIMESTAMP_TYPES: Final = (b"CreateTime:", b"LogAppendTime:")


@dataclass(frozen=True, slots=True)
class MessageFormatter:
    """Which fields a line holds and how they are separated; see the module docstring."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> MessageFormatter:
        """From formatter properties under Kafka's names; :class:`UsageError` naming an unknown one."""
        unknown = sorted(set(properties) - set(FORMATTER_PROPERTIES))
        if unknown:
            raise UsageError(f"--property {unknown[0]}: not a property of the default formatter; known: "
                             f"{', '.join(FORMATTER_PROPERTIES)}")
        values: dict[str, object] = {}
        for name in _BOOLEANS:
            if name in properties:
                values[name.replace(".", "_")] = properties[name].strip().lower() == "true"
        for name in _SEPARATORS:
            if name in properties:
                values[name.replace(".", "_")] = properties[name].encode()
        return cls(**values)  # type: ignore[arg-type]

    def format(self, record: ConsumerRecord) -> bytes:
        """The bytes written for ``record`` (the line separator included)."""
        fields: list[bytes] = []
        if self.print_timestamp:
            fields.append(_TIMESTAMP_TYPES[record.timestamp_type] + b"%d" % record.timestamp)
        if self.print_partition:
            fields.append(b"Partition:%d" % record.partition)
        if self.print_offset:
            fields.append(b"Offset:%d" % record.offset)
        if self.print_headers:
            fields.append(self.headers_separator.join(
                name.encode() + b":" + self._bytes(value) for name, value in record.headers) or b"NO_HEADERS")
        if self.print_key:
            fields.append(self._bytes(record.key))
        if self.print_value:
            fields.append(self._bytes(record.value))
        if not fields:
            return b""
        return self.key_separator.join(fields) + self.line_separator

    def _bytes(self, value: bytes | None) -> bytes:
        return self.null_literal if value is None else value
