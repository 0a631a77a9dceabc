"""Benchmark: a Spark batch read of a topic through ``format("appliance")`` against reading the same rows
from parquet, in the same local[2] SparkSession.

Run: ``.venv/bin/python -m pytest bench/test_bench_spark.py --benchmark-enable --benchmark-only -s``
(``SPARK_BENCH_RECORDS`` scales the data set down; default 10,000,000).

Set-up: ``appliance serve`` (supervisor, writers, broker) on a loopback port with a topic of 4 partitions;
``SPARK_BENCH_RECORDS`` records of 100-byte values (random bytes, null keys, no headers) produced over TCP
with ``appliance.Producer`` (``bootstrap.servers``, ``send_many``) in batches of about 1 MiB, 4 x 2.5 M
records, about 1.3 GB of log in the page cache; the set-up prints how long that took (``set-up: produced``).
One SparkSession ``local[2]`` (both cores), the data source registered.

* ``test_spark_reads_a_topic``: ``spark.read.format("appliance")...load()`` written to Spark's ``noop``
  sink, so every column of every row (key, value, topic, partition, offset, timestamp, timestampType,
  headers) reaches the JVM: 12 tasks (4 partitions cut at 1,000,000 records), each fetching its range over
  TCP, decoding with numba and handing Arrow batches to Spark.  One warm-up round, then 3 timed rounds.
* ``test_spark_reads_the_same_rows_from_parquet``: the same DataFrame written once to parquet (snappy, the
  default), then ``spark.read.parquet(...)`` to the same ``noop`` sink, 3 timed rounds after a warm-up.
* For scale, ``test_consumer_over_tcp_in_one_process``: the same records read by one
  ``Consumer({"bootstrap.servers": ...}).poll_batch`` loop in this process, no Spark (the fetch and decode
  cost per record that every Spark task pays, on one core).

Each prints one ``RESULT`` line (records/s of the best and of the median timed round, and the load average:
Spark's rounds vary with what else runs on the two cores) and stores its figures in ``extra_info``; the
parquet test also prints the ratios appliance / parquet.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

RECORDS = int(os.environ.get("SPARK_BENCH_RECORDS", "10000000"))
VALUE_BYTES = 100
PARTITIONS = 4
TOPIC = "spark-bench"
_RESULTS: dict[str, float] = {}
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def bootstrap(workdir: Path) -> Iterator[str]:
    """``appliance serve`` with the benchmark topic, filled with RECORDS records; yields HOST:PORT."""
    from appliance.client.producer import Producer
    from ipc.kafka import MetadataRequest
    from ipc.kafka_client import BrokerConnectionError, KafkaConnection

    port = _free_port()
    log_path = workdir / "appliance.log"
    command = [sys.executable, "-m", "appliance.cli", "serve", "--override", f"log.dirs={workdir / 'data'}",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}", "--override",
               f"topics.{TOPIC}.partitions={PARTITIONS}", "--override", "appliance.log.level=WARNING"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"appliance serve did not start: {log_path.read_text(errors='replace')[-2000:]}")
            try:
                with KafkaConnection("127.0.0.1", port, connect_timeout_ms=500) as conn:
                    if any(t.name == TOPIC for t in conn.request(MetadataRequest(topics=None)).topics):
                        break
            except BrokerConnectionError:
                pass
            time.sleep(0.1)
        served = f"127.0.0.1:{port}"
        rows = np.frombuffer(np.random.default_rng(1).bytes(VALUE_BYTES * min(RECORDS, 1_000_000)),
                             np.uint8).reshape(-1, VALUE_BYTES)
        started = time.perf_counter()
        with Producer({"bootstrap.servers": served, "batch.size": 1 << 20}) as producer:
            for partition in range(PARTITIONS):
                left = RECORDS // PARTITIONS + (1 if partition < RECORDS % PARTITIONS else 0)
                while left:
                    count = min(len(rows), left)
                    producer.send_many(TOPIC, rows[:count], partition=partition)
                    left -= count
            producer.flush()
        seconds = time.perf_counter() - started
        print(f"\nset-up: produced {RECORDS:,} records of {VALUE_BYTES} B over TCP in {seconds:.1f} s "
              f"({RECORDS / seconds:,.0f} records/s)")
        yield served
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def spark(workdir: Path) -> Iterator[Any]:
    conf_dir = workdir / "conf"
    conf_dir.mkdir()
    (conf_dir / "log4j2.properties").write_text(_LOG4J2)
    os.environ.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(conf_dir))
    from pyspark.sql import SparkSession

    from appliance.spark import register

    session = (SparkSession.builder.master("local[2]").appName("spark-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "4g").config("spark.local.dir", str(workdir / "local"))
               .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={workdir}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def _topic(spark: Any, bootstrap: str) -> Any:
    return (spark.read.format("appliance").option("bootstrap.servers", bootstrap).option("subscribe", TOPIC)
            .option("includeHeaders", "true").load())


def _timed_noop(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _report(benchmark: BenchmarkFixture, name: str, seconds: list[float]) -> tuple[float, float]:
    """Records/s of the best and of the median round."""
    best, median = RECORDS / min(seconds), RECORDS / sorted(seconds)[len(seconds) // 2]
    load = os.getloadavg()
    benchmark.extra_info.update(records=RECORDS, value_bytes=VALUE_BYTES, seconds=seconds,
                                records_per_s=best, median_records_per_s=median, load_average=load)
    print(f"\nRESULT {name}: {RECORDS:,} records of {VALUE_BYTES} B: best {best:,.0f} records/s, median "
          f"{median:,.0f} (rounds: {', '.join(f'{s:.2f}' for s in seconds)} s; load average "
          f"{load[0]:.1f} on {os.cpu_count()} cores)")
    return best, median


def test_spark_reads_a_topic(benchmark: BenchmarkFixture, spark: Any, bootstrap: str) -> None:
    frame = _topic(spark, bootstrap)
    assert frame.rdd.getNumPartitions() >= PARTITIONS
    _timed_noop(frame)  # warm: worker daemons, numba caches, page cache
    seconds: list[float] = []
    benchmark.pedantic(lambda: seconds.append(_timed_noop(_topic(spark, bootstrap))), rounds=3, iterations=1)
    _RESULTS["appliance"], _RESULTS["appliance-median"] = _report(
        benchmark, "Spark batch read, format('appliance'), local[2]", seconds)


def test_spark_reads_the_same_rows_from_parquet(benchmark: BenchmarkFixture, spark: Any, bootstrap: str,
                                                workdir: Path) -> None:
    path = str(workdir / "rows.parquet")
    _topic(spark, bootstrap).write.mode("overwrite").parquet(path)
    frame = spark.read.parquet(path)
    assert frame.count() == RECORDS
    _timed_noop(frame)
    seconds: list[float] = []
    benchmark.pedantic(lambda: seconds.append(_timed_noop(spark.read.parquet(path))), rounds=3, iterations=1)
    best, median = _report(benchmark, "Spark batch read of the same rows from parquet (snappy), local[2]",
                           seconds)
    if "appliance" in _RESULTS:
        ratios = _RESULTS["appliance"] / best, _RESULTS["appliance-median"] / median
        benchmark.extra_info.update(appliance_over_parquet=ratios[0], appliance_over_parquet_median=ratios[1])
        print(f"RESULT ratio appliance / parquet: {ratios[0]:.2f} (best rounds), {ratios[1]:.2f} (medians)")


def test_consumer_over_tcp_in_one_process(benchmark: BenchmarkFixture, bootstrap: str) -> None:
    from appliance.client.consumer import Consumer

    def consume() -> float:
        started = time.perf_counter()
        with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                       "max.partition.fetch.bytes": 8 << 20, "fetch.max.bytes": 64 << 20}) as consumer:
            consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
            got = 0
            while got < RECORDS:
                got += sum(len(chunk) for chunk in consumer.poll_batch(timeout_ms=1000))
        return time.perf_counter() - started

    consume()
    seconds: list[float] = []
    benchmark.pedantic(lambda: seconds.append(consume()), rounds=3, iterations=1)
    _report(benchmark, "Consumer over TCP, poll_batch, one process (no Spark)", seconds)
