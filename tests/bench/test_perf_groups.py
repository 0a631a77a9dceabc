"""``appliance bench groups`` end to end at a tiny size against the appliance it starts: the result's shape
(the documented keys, counts that add up).  Speed is measured by ``make bench``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("confluent_kafka")


@pytest.mark.slow
def test_bench_groups_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "groups.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    args = [
        "groups",
        "--members",
        "2",
        "--partitions",
        "3",
        "--rounds",
        "1",
        "--commits",
        "10",
        "--records",
        "2000",
        "--pairs",
        "1",
        "--json",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("rebalance with 2 members (ms, p50 / max): form ")
    result = json.loads(out.read_text())
    assert result["command"] == "groups"
    assert result["config"]["members"] == 2 and result["config"]["heartbeat_interval_ms"] > 0
    for phase in ("form", "join", "leave"):
        figures = result["rebalance_ms"][phase]
        assert len(figures["samples"]) == 1 and 0 < figures["p50"] <= figures["max"]
    commit = result["offset_commit"]
    assert commit["commits"] == 10 and commit["commits_per_s"] > 0 and commit["p50_ms"] <= commit["max_ms"]
    throughput = result["consume_throughput"]
    for mode in ("group", "assign"):
        (run,) = throughput[mode]
        assert run["records"] == 2000 and sum(run["per_process"]) == 2000 and run["records_per_s"] > 0
    assert throughput["ratio_median"] == pytest.approx(
        throughput["group"][0]["records_per_s"] / throughput["assign"][0]["records_per_s"], rel=0.01
    )


def test_bench_groups_refuses_a_group_it_cannot_measure(tmp_path: Path) -> None:
    from bench.cli import main

    assert main(["groups", "--members", "4", "--partitions", "4"]) == 1
