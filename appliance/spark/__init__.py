"""Topics of the appliance as Spark tables: a PySpark Python data source, format ``"appliance"``.

One call registers it; then a job written for Spark's Kafka source (its options, schema and sink) runs with
``format("kafka")`` changed to ``format("appliance")`` (Spark keeps the name ``kafka`` for its own
connector: docs/spark.md)::

    from appliance.spark import register
    register(spark)
    df = (spark.read.format("appliance").option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "logs").load())

Modules: ``options`` (checked on the driver), ``offset_specs`` (starting and ending points), ``planning``
(partitions, offsets, ranges), ``batch_reader`` and ``stream_reader`` (Arrow batches fetched over the Kafka
protocol), ``writer`` and ``commit_log`` (exactly-once sink), ``arrow_columns`` (records <-> Arrow),
``schema`` (the table's columns).  A batch write names its mode, ``mode("append")`` (Spark requires it of
a Python data source).
Needs the ``spark`` extra (pyspark, pyarrow).
"""

from __future__ import annotations

from typing import Any

from appliance.spark.datasource import FORMAT, ApplianceDataSource
from appliance.spark.schema import SCHEMA

__all__ = ["FORMAT", "SCHEMA", "ApplianceDataSource", "register"]


def register(spark: Any) -> None:
    """Make ``format("appliance")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(ApplianceDataSource)
