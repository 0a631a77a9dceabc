"""The example pipeline (``examples/log_pipeline.py``) on a real local[2] SparkSession against a real
appliance: its counts, in parquet and in the output topic, equal a plain-Python computation over the same
log lines."""

from __future__ import annotations

import datetime
import importlib.util
import json
import random
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "log_pipeline.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("log_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log_lines(count: int) -> list[bytes]:
    """JSON lines over five minutes of event time (a little out of order), with some that are not logs."""
    rng = random.Random(11)
    start = datetime.datetime(2024, 5, 1, 10, 0, tzinfo=datetime.UTC)
    lines = []
    for i in range(count):
        at = start + datetime.timedelta(milliseconds=i * 500 + rng.randint(-15_000, 15_000))
        line = {"ts": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "service": rng.choice(["api", "db", "web"]),
                "level": rng.choice(["INFO", "INFO", "WARN", "ERROR"]), "message": f"event {i}"}
        if i % 97 == 0:
            lines.append(b"not json at all")
        elif i % 89 == 0:
            del line["level"]
            lines.append(json.dumps(line).encode())
        else:
            lines.append(json.dumps(line).encode())
    return lines


def expected_counts(lines: list[bytes]) -> dict[tuple[int, str, str], int]:
    """The oracle: per (minute window start in ms, service, level), how many lines."""
    counts: Counter[tuple[int, str, str]] = Counter()
    for raw in lines:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if not all(line.get(k) for k in ("ts", "service", "level")):
            continue
        at = datetime.datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
        millis = int(at.timestamp() * 1000)
        counts[(millis - millis % 60_000, line["service"], line["level"])] += 1
    return dict(counts)


def test_the_example_pipeline_matches_a_plain_python_computation(spark: Any, appliance: Any,
                                                                 tmp_path: Path) -> None:
    lines = log_lines(600)
    with Producer({"bootstrap.servers": appliance.bootstrap, "compression.type": "zstd"}) as producer:
        producer.send_many("logs", lines).get()  # no keys: sticky partitions, all three used
    pipeline = load_example()
    query = pipeline.start(spark, appliance.bootstrap, "logs", "log-counts", str(tmp_path / "parquet"),
                           str(tmp_path / "checkpoint"), app_id="example-test", available_now=True,
                           max_records_per_trigger=400)
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(query.recentProgress) >= 2  # 600 lines in batches of at most 400
    expected = expected_counts(lines)
    parquet = {(r.window_start_ms, r.service, r.level): r["count"]
               for r in pipeline.latest_counts(spark, str(tmp_path / "parquet")).collect()}
    assert parquet == expected
    # the topic: the latest record of each key holds the count
    from_topic: dict[tuple[int, str, str], int] = {}
    with Consumer({"bootstrap.servers": appliance.bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [("log-counts", 0), ("log-counts", 1)]
        total = sum(consumer.end_offsets(tps).values())
        consumer.assign(tps)
        seen = 0
        deadline = time.monotonic() + 20
        while seen < total and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200):
                row = json.loads(record.value)
                key = (row["window_start_ms"], row["service"], row["level"])
                assert record.key == f"{row['service']}|{row['level']}|{row['window_start_ms']}".encode()
                from_topic[key] = row["count"]
                seen += 1
    assert from_topic == expected
