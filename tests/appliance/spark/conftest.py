"""One real ``local[2]`` SparkSession and one real ``appliance serve`` for every Spark test of a run.

Starting a JVM costs 5-13 s and the first Python data source query 5-9 s more (its worker daemons start),
so both are session-scoped and shared (pyspark-python-datasource notes: workers run ``sys.executable``,
``SPARK_LOCAL_IP`` is loopback, the UI is off, log4j2 is quiet from a configuration in a temporary
``SPARK_CONF_DIR``, Spark's scratch space is under pytest's base temp dir).  Each test uses topics of its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.consumer_fixtures import free_port
from support.harness import Appliance

from appliance.server.faults import UNREAD_RECORDS
from ipc.kafka import MetadataRequest
from ipc.kafka_client import BrokerConnectionError, KafkaConnection

_LOG4J2 = """\
# root at warn, not error: Spark takes a root logger at error with one appender for log4j's default setup
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

# topics every test may use (partitions); each test owns the ones named after it
TOPICS = {
    "batch-read": 3, "batch-zstd": 2, "bad-input": 2, "short-lived": 1, "stream-in": 2, "stream-out": 2,
    "replay-in": 2, "replay-out": 3, "logs": 3, "log-counts": 2, "pattern-a": 1, "write-out": 2,
    "codecs-in": 4, "codecs-out": 4, "codecs-bad": 4, "compacted": 1,
    "topic1": 2, "topic2": 1, "topic3": 2, "guide-out": 2, "guide-stream-out": 2, "headers": 1, "times": 2,
    "trigger-min": 2, "trigger-delay": 1,
}  # fmt: skip


class RunningAppliance:
    def __init__(self, serve: Appliance, bootstrap: str) -> None:
        self.serve = serve
        self.bootstrap = bootstrap


@pytest.fixture(scope="session")
def appliance() -> Iterator[RunningAppliance]:
    port = free_port()
    overrides = [f"listeners=PLAINTEXT://127.0.0.1:{port}", "log.retention.check.interval.ms=100"]
    overrides += [f"topics.{name}.partitions={count}" for name, count in TOPICS.items()]
    # a topic whose old segments retention deletes within a second (failOnDataLoss tests)
    overrides += ["topics.short-lived.segment.bytes=2048", "topics.short-lived.retention.bytes=4096"]
    # a compacted topic the cleaner cleans within a second of a segment rolling
    overrides += ["topics.compacted.cleanup.policy=compact", "topics.compacted.segment.bytes=1024",
                  "topics.compacted.min.cleanable.dirty.ratio=0.01", "log.cleaner.backoff.ms=100"]
    # the writers trust CreateTime batches' headers, so codecs-bad's garbage batch reaches the log (a
    # producer's is refused CORRUPT_MESSAGE at the append): test_spark_codecs.py reads it
    overrides += [f"appliance.test.faults={json.dumps([UNREAD_RECORDS])}"]
    # `appliance serve` with the broker and the cleaner as its extra children (no replica processes)
    children = ("appliance.broker.process:child_spec", "appliance.cleaner.process:child_spec")
    serve = Appliance(None, *overrides, patch={"EXTRA_CHILDREN": children})
    try:
        serve.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                with KafkaConnection("127.0.0.1", port, connect_timeout_ms=500) as conn:
                    answer = conn.request(MetadataRequest(topics=None))
                if {t.name for t in answer.topics} >= set(TOPICS):
                    break
            except BrokerConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the broker did not answer within 30 s:\n{serve.log()}")
            time.sleep(0.05)
        yield RunningAppliance(serve, f"127.0.0.1:{port}")
        assert serve.stop() == 0, serve.log()
        assert "Traceback" not in serve.log(), serve.log()
    finally:
        serve.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("spark")
    conf_dir = base / "conf"
    conf_dir.mkdir()
    (conf_dir / "log4j2.properties").write_text(_LOG4J2)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
    from pyspark.sql import SparkSession

    from appliance.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("appliance-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(base / "local"))
        .config("spark.sql.warehouse.dir", str(base / "warehouse"))
        # the serial collector and the C1 compiler only: a short-lived test JVM on two shared cores spends
        # less CPU on garbage collector and JIT threads than with G1 and C2
        .config("spark.driver.extraJavaOptions",
                f"-Djava.io.tmpdir={base} -XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def scratch(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    return str(path)
