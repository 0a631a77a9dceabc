"""``appliance bench``: the commands run end to end against a real ``appliance serve`` and write the
documented JSON; small pure helpers against simple oracles.  Speed is measured by `make bench`, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.cli import parse_size
from bench.limits import PageCacheProbe, loopback_sendfile
from bench.produce import log_line_payloads
from bench.stats import LATENCY_KEYS, RESULT_KEYS, latency_summary, summary_line

REPO = Path(__file__).resolve().parents[2]
LIMIT_KEYS = ("memcpy_mb_per_s", "page_cache_write_mb_per_s", "loopback_sendfile_mb_per_s")
RATIO_KEYS = ("memcpy", "page_cache_write", "loopback_sendfile")


def _bench(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "appliance.cli", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=tmp_path)


def _check_result(path: Path, command: str, records: int, record_size: int, *, limits: bool = True) -> dict:
    result = json.loads(path.read_text())
    assert tuple(result) == RESULT_KEYS
    assert result["command"] == command
    assert result["records"] == records
    assert result["bytes"] == records * record_size
    assert result["seconds"] > 0
    assert result["records_per_s"] == pytest.approx(records / result["seconds"], rel=1e-3)
    assert result["mb_per_s"] == pytest.approx(result["bytes"] / result["seconds"] / 1e6, rel=1e-2)
    latency = result["latency_ms"]
    assert tuple(latency) == LATENCY_KEYS and latency["samples"] > 0
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["p99_9"] <= latency["max"]
    assert result["config"]["records"] == records and result["config"]["record_size"] == record_size
    if not limits:
        assert result["limits"] is None and result["ratios"] is None
        return result
    for key in LIMIT_KEYS:
        assert result["limits"][key] > 0
    for key in RATIO_KEYS:
        limit = result["limits"][f"{key}_mb_per_s"]
        assert result["ratios"][key] == pytest.approx(result["mb_per_s"] / limit, rel=0.02, abs=1e-3)
    return result


@pytest.mark.slow
def test_produce_and_consume_write_the_documented_json(tmp_path: Path) -> None:
    produced = _bench(tmp_path, "produce", "--records", "20000", "--json", str(tmp_path / "p.json"))
    assert produced.returncode == 0, produced.stderr
    assert "20,000 records sent" in produced.stdout and "avg latency" in produced.stdout
    result = _check_result(tmp_path / "p.json", "produce", 20_000, 100)
    assert result["primary_limit"] == "page_cache_write"
    assert result["extra"]["errors"] == 0
    assert result["extra"]["records_in_log"] == 20_000 + result["extra"]["warmup_records"]  # nothing lost

    consumed = _bench(tmp_path, "consume", "--records", "20000", "--partitions", "2", "--record-size", "64",
                      "--no-limits", "--json", str(tmp_path / "c.json"))
    assert consumed.returncode == 0, consumed.stderr
    assert "20,000 records consumed" in consumed.stdout
    result = _check_result(tmp_path / "c.json", "consume", 20_000, 64, limits=False)
    assert result["primary_limit"] == "memcpy" and result["extra"]["partitions"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("la-perf-")]  # its appliance is gone


def test_consume_by_codec_reports_the_decompression_share(tmp_path: Path) -> None:
    consumed = _bench(tmp_path, "consume", "--records", "20000", "--compression", "lz4", "--no-limits",
                      "--json", str(tmp_path / "lz4.json"))
    assert consumed.returncode == 0, consumed.stderr
    assert "20,000 records consumed" in consumed.stdout
    assert "note: lz4: records sections " in consumed.stdout and "of the timed read" in consumed.stdout
    result = _check_result(tmp_path / "lz4.json", "consume", 20_000, 100, limits=False)
    assert result["config"]["compression"] == "lz4"
    extra = result["extra"]
    assert extra["compression_ratio"] > 1 and extra["decompress_s"] > 0 and extra["decompress_share"] > 0


def test_bad_options_are_refused_with_a_message(tmp_path: Path) -> None:
    done = _bench(tmp_path, "produce", "--records", "lots")
    assert done.returncode == 2 and "--records" in done.stderr and "expected a number" in done.stderr
    done = _bench(tmp_path, "produce", "--records", "10", "--record-size", "9 parsecs")
    assert done.returncode == 2 and "expected a size" in done.stderr
    done = _bench(tmp_path, "e2e", "--record-size", "4", "--no-limits")
    assert done.returncode == 1 and "at least 8 bytes" in done.stderr


def test_parse_size() -> None:
    assert parse_size("100") == 100
    assert parse_size("10KiB") == 10 * 1024
    assert parse_size("1kb") == 1000
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1.5MiB") == 3 << 19
    for bad in ("", "MiB", "10 apples", "-"):
        with pytest.raises(Exception, match="expected a size"):
            parse_size(bad)


def test_latency_summary_matches_numpy() -> None:
    samples_ns = np.random.default_rng(5).integers(1_000, 50_000_000, 10_001)
    got = latency_summary(samples_ns, "send-to-ack")
    ms = samples_ns / 1e6
    assert got["samples"] == 10_001 and got["kind"] == "send-to-ack"
    assert got["avg"] == pytest.approx(ms.mean(), abs=1e-4)
    assert got["max"] == pytest.approx(ms.max(), abs=1e-4)
    for key, q in (("p50", 50), ("p95", 95), ("p99", 99), ("p99_9", 99.9)):
        assert got[key] == pytest.approx(np.percentile(ms, q), abs=1e-4)
    empty = latency_summary([], "poll")
    assert empty["samples"] == 0 and empty["p99"] is None


def test_summary_line_reads_like_kafkas() -> None:
    result = {"command": "produce", "records": 1000, "records_per_s": 500.0, "mb_per_s": 0.05,
              "latency_ms": latency_summary([1_000_000, 3_000_000], "send-to-ack"),
              "ratios": {"memcpy": 0.1, "page_cache_write": 0.5, "loopback_sendfile": 0.2},
              "primary_limit": "page_cache_write"}
    line = summary_line(result)
    assert line.startswith("1,000 records sent, 500.0 records/sec (0.05 MB/sec), 2.00 ms avg latency, "
                           "3.00 ms max latency")
    assert "0.500 of page-cache write (the limit for this path)" in line


def test_log_line_payloads_are_distinct_json_of_the_exact_size() -> None:
    for size in (10, 100, 1000, 5000):
        rows = log_line_payloads(50, size)
        assert rows.shape == (50, size)
        assert len({row.tobytes() for row in rows}) == 50
    first_line = log_line_payloads(1, 5000)[0].tobytes().split(b"\n")[0]
    assert json.loads(first_line)["level"] in ("INFO", "DEBUG", "WARN", "ERROR")


def test_limit_probes_measure_what_they_moved(tmp_path: Path) -> None:
    probe = PageCacheProbe(tmp_path, 3 << 20)
    assert probe.measure(sync=False) > 0
    assert probe.paths[0].stat().st_size == 3 << 20
    sent, seconds = loopback_sendfile(probe.paths, max_bytes=2 << 20)
    assert sent == 2 << 20 and seconds > 0
    probe.remove()
    assert not probe.paths[0].exists()
