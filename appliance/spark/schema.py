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
headers                 array<struct<key: string, value: binary>>   its headers, in order
======================  ==========================================  ========================================

Only ``pyspark.sql.types`` here (no pyarrow, no numba): Spark's planning workers import this module to
learn the schema, and each of them is a fresh process.
"""

from __future__ import annotations

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

__all__ = ["HEADER_SCHEMA", "SCHEMA"]

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
