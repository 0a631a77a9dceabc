"""The example pipeline: JSON log lines from a topic -> counts per minute, service and level -> a topic and
parquet.

Input records carry one JSON object per value, for example::

    {"ts": "2024-05-01T10:00:03.250Z", "service": "api", "level": "WARN", "message": "slow request"}

Lines that are not JSON, or lack ``ts``, ``service`` or ``level``, are dropped.  Counts are kept per
one-minute event-time window (a watermark of ``--watermark`` bounds the state; later lines are ignored) and
emitted in *update* mode: each micro-batch emits the windows it changed, with their counts so far.  Both
outputs are written by one ``foreachBatch`` function, exactly once per micro-batch:

* parquet under ``<parquet>/batch_id=<N>/`` (written with ``mode("overwrite")``: a replayed batch replaces
  its own directory);
* the output topic through ``format("appliance")`` with ``txnAppId``/``txnVersion`` (the sink's commit log
  makes a replayed batch write nothing twice).  Key ``service|level|window_start_ms``, value the row as JSON;
  the latest record of a key holds the window's count (a compacted view).

:func:`latest_counts` reads the parquet output back as final counts (per window, service and level: the row
of the highest batch).  Run it against a local appliance (``appliance serve`` on 127.0.0.1:9092)::

    .venv/bin/python examples/log_pipeline.py --bootstrap 127.0.0.1:9092 --input logs --output log-counts \\
        --parquet /tmp/log-counts --checkpoint /tmp/log-counts-checkpoint --available-now

Without ``--available-now`` it runs until interrupted.  ``docs/spark.md`` shows the same on a cluster.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

LOG_SCHEMA = "ts TIMESTAMP, service STRING, level STRING, message STRING"
KEY_COLUMNS = ("window_start_ms", "service", "level")


def windowed_counts(spark: SparkSession, bootstrap: str, input_topic: str, *, window: str = "1 minute",
                    watermark: str = "10 minutes", starting_offsets: str = "earliest",
                    max_records_per_trigger: int | None = None) -> DataFrame:
    """The streaming DataFrame of counts: window_start_ms, window_end_ms, service, level, count."""
    reader = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", input_topic).option("startingOffsets", starting_offsets))
    if max_records_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_trigger))
    events = (reader.load()
              .select(F.from_json(F.col("value").cast("string"), LOG_SCHEMA).alias("line"))
              .select("line.*")
              .where(F.col("ts").isNotNull() & F.col("service").isNotNull() & F.col("level").isNotNull()))
    counts = (events.withWatermark("ts", watermark)
              .groupBy(F.window("ts", window).alias("window"), "service", "level")
              .count())
    return counts.select(
        (F.unix_millis(F.col("window.start"))).alias("window_start_ms"),
        (F.unix_millis(F.col("window.end"))).alias("window_end_ms"),
        "service", "level", "count",
    )


def start(spark: SparkSession, bootstrap: str, input_topic: str, output_topic: str, parquet_dir: str,
          checkpoint_dir: str, *, app_id: str = "log-pipeline", available_now: bool = False,
          **count_options: Any) -> StreamingQuery:
    """Start the pipeline (see the module docstring); returns the streaming query."""
    counts = windowed_counts(spark, bootstrap, input_topic, **count_options)

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            batch.write.mode("overwrite").parquet(f"{parquet_dir}/batch_id={batch_id}")
            (batch.select(F.concat_ws("|", "service", "level", "window_start_ms").alias("key"),
                          F.to_json(F.struct(*batch.columns)).alias("value"))
             .write.format("appliance").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", output_topic).option("txnAppId", app_id).option("txnVersion", str(batch_id))
             .mode("append").save())
        finally:
            batch.unpersist()

    writer = (counts.writeStream.outputMode("update").foreachBatch(write_batch)
              .option("checkpointLocation", checkpoint_dir).queryName(app_id))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="5 seconds")
    return writer.start()


def latest_counts(spark: SparkSession, parquet_dir: str) -> DataFrame:
    """Final counts from the parquet output: per window, service and level, the row of the latest batch."""
    rows = spark.read.parquet(parquet_dir)
    latest = rows.groupBy(*KEY_COLUMNS).agg(F.max("batch_id").alias("batch_id"))
    return rows.join(latest, [*KEY_COLUMNS, "batch_id"]).select(
        *KEY_COLUMNS, "window_end_ms", "count")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="the appliance's broker HOST:PORT")
    parser.add_argument("--input", default="logs", help="topic of JSON log lines")
    parser.add_argument("--output", default="log-counts", help="topic for the counts")
    parser.add_argument("--parquet", required=True, help="directory for the parquet output")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--max-records-per-trigger", type=int, default=None)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("log-pipeline").getOrCreate()
    from appliance.spark import register

    register(spark)
    query = start(spark, args.bootstrap, args.input, args.output, args.parquet, args.checkpoint,
                  available_now=args.available_now, max_records_per_trigger=args.max_records_per_trigger)
    query.awaitTermination()
    if args.available_now:
        latest_counts(spark, args.parquet).orderBy(*KEY_COLUMNS).show(50, truncate=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
