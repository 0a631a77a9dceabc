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
values are written as the bytes they are (Kafka's default deserializers pass bytes through), unless
``key.deserializer`` / ``value.deserializer`` / ``headers.deserializer`` (``--key-deserializer``,
``--value-deserializer``) name Kafka's ``StringDeserializer``: then as UTF-8 text, each malformed sequence
written as U+FFFD, as Java's decoding writes it.  ``ByteArrayDeserializer`` writes the bytes (Kafka would
print the Java array's identity, ``[B@1b6d3586``, which says nothing); other deserializers are refused,
named.  With no field
at all chosen (``print.value=false`` alone) nothing is written.  Properties are read as Kafka reads them:
a boolean is true only if it says ``true`` in any case; a separator is taken as its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from appliance.cli.kafka_forms import UsageError

if TYPE_CHECKING:  # the consumer (numba kernels) is imported by the command once its arguments are checked
    from appliance.client.consumer import ConsumerRecord

__all__ = ["DEFAULT_FORMATTERS", "DESERIALIZERS", "DESERIALIZERS_BUILT", "FORMATTER_PROPERTIES",
           "MessageFormatter"]

# the names kafka-console-consumer gives its default formatter, old and new
DEFAULT_FORMATTERS: Final = ("kafka.tools.DefaultMessageFormatter",
                             "org.apache.kafka.tools.consumer.DefaultMessageFormatter",
                             "DefaultMessageFormatter")
_BOOLEANS: Final = ("print.timestamp", "print.key", "print.value", "print.partition", "print.offset",
                    "print.headers")
_SEPARATORS: Final = ("key.separator", "line.separator", "headers.separator", "null.literal")
_DESERIALIZER_PROPERTIES: Final = ("key.deserializer", "value.deserializer", "headers.deserializer")
FORMATTER_PROPERTIES: Final = (*_BOOLEANS, *_SEPARATORS, *_DESERIALIZER_PROPERTIES)
# the deserializers built here, by Kafka's class name: does each write the bytes as UTF-8 text?
DESERIALIZERS: Final = {"org.apache.kafka.common.serialization.StringDeserializer": True,
                        "org.apache.kafka.common.serialization.ByteArrayDeserializer": False}
DESERIALIZERS_BUILT: Final = (f"only {' and '.join(DESERIALIZERS)} are built here (keys and values are "
                              "written as their bytes or as UTF-8 text)")
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
    key_text: bool = False  # key.deserializer is StringDeserializer
    value_text: bool = False
    headers_text: bool = False

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
        for name in _DESERIALIZER_PROPERTIES:
            if name in properties:
                given = properties[name].strip()
                if given not in DESERIALIZERS:
                    raise UsageError(f"{name} {given}: {DESERIALIZERS_BUILT}")
                values[name.split(".")[0] + "_text"] = DESERIALIZERS[given]
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
            text = self.headers_text
            pairs = [name.encode() + b":" + self._bytes(value, text) for name, value in record.headers]
            fields.append(self.headers_separator.join(pairs) or b"NO_HEADERS")
        if self.print_key:
            fields.append(self._bytes(record.key, self.key_text))
        if self.print_value:
            fields.append(self._bytes(record.value, self.value_text))
        if not fields:
            return b""
        return self.key_separator.join(fields) + self.line_separator

    def _bytes(self, value: bytes | None, text: bool) -> bytes:
        written = self.null_literal if value is None else value
        return written.decode("utf-8", "replace").encode() if text else written
