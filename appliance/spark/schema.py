"""The table a topic is, as Spark sees it: Spark's Kafka source schema, declared once.

======================  ==========================================  ========================================
column                  type                                        from the record
======================  ==========================================  ========================================
key                     binary                                      its key (null: no key)
value                   binary                                      its value (null: a tombstone)
topic                   string                                      the topic
partition               int                                         the partition
offset                  long                                        its offset
timestamp               timestamp (microseconds, UTC)               its timestamp (milliseconds in the log)
timestampType           int                                         0 CreateTime, 1 LogAppendTime
headers                 array<struct<key: string, value: binary>>   its headers, in order (includeHeaders)
======================  ==========================================  ========================================

As in Spark's Kafka source, ``headers`` is there only with option ``includeHeaders=true``
(:func:`read_schema`).  A write takes Spark's Kafka sink columns (:func:`check_write_columns`, Spark's
rules): ``value`` (string or binary, required), ``key`` (string or binary), ``topic`` (string; required
unless option ``topic`` is set, which then overrides it), ``headers`` (the type above) and ``partition``
(int); names match exactly, other columns are ignored.

Only ``pyspark.sql.types`` here (no pyarrow, no numba): Spark's planning workers import this module to
learn the schema, and each of them is a fresh process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from storage.errors import ConfigError

__all__ = ["HEADER_SCHEMA", "SCHEMA", "SCHEMA_WITHOUT_HEADERS", "check_write_columns", "read_schema"]

HEADER_SCHEMA: Final = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
SCHEMA: Final = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(HEADER_SCHEMA)),
])  # fmt: skip
SCHEMA_WITHOUT_HEADERS: Final = StructType(SCHEMA.fields[:-1])
_HEADERS_TYPE: Final = SCHEMA["headers"].dataType.simpleString()
# the sink's columns: the Spark types each may have
_WRITE_TYPES: Final = {"topic": ("string",), "key": ("string", "binary"), "value": ("string", "binary"),
                       "headers": (_HEADERS_TYPE,), "partition": ("int",)}


def read_schema(include_headers: bool) -> StructType:
    """The columns a read gives: Spark's Kafka schema, ``headers`` last and only when asked for."""
    return SCHEMA if include_headers else SCHEMA_WITHOUT_HEADERS


def check_write_columns(columns: Mapping[str, str], topic_option: str | None) -> None:
    """ConfigError unless ``columns`` (name -> ``DataType.simpleString()``) can be written, by the rules of
    Spark's Kafka sink: the value column, a topic (column or option), and the types of those present."""
    if topic_option is None and "topic" not in columns:
        raise ConfigError("appliance data source: topic option required when no 'topic' attribute is "
                          "present; use the topic option for setting a topic")
    if "value" not in columns:
        raise ConfigError(f"appliance data source: required attribute 'value' not found (the DataFrame has "
                          f"{', '.join(columns) or 'no columns'})")
    for name, allowed in _WRITE_TYPES.items():
        if name == "topic" and topic_option is not None:
            continue  # the option overrides the column, whatever its type
        kind = columns.get(name)
        if kind is not None and kind not in allowed:
            raise ConfigError(f"appliance data source: {name} attribute unsupported type {kind}; {name} must "
                              f"be a(n) {' or '.join(allowed)}")
