"""Topics of the appliance as Spark tables: a PySpark Python data source, format ``"appliance"``.

One call registers it, then Spark's Kafka-style options apply::

    from appliance.spark import register
    register(spark)
    df = (spark.read.format("appliance").option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "logs").load())

Modules: ``options`` (checked on the driver), ``planning`` (partitions, offsets, ranges), ``batch_reader``
and ``stream_reader`` (Arrow batches fetched over the Kafka protocol), ``writer`` and ``commit_log``
(exactly-once sink), ``arrow_columns`` (records <-> Arrow), ``schema`` (the table's columns).
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
