"""``appliance bench cleaner`` end to end on a small scale: it writes its JSON with a ratio per pair and the
cleaner's memory, with the dirty topic just past one segment, so the cleaner has a pass to make (with
less, the bench says no pass began).  The figures themselves are measured by hand (docs/performance.md), not
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def bench_cleaner(tmp_path: Path, dirty_records: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    out = tmp_path / "c.json"
    run = subprocess.run([sys.executable, "-m", "appliance.cli", "bench", "cleaner", "--records", "20000",
                          "--dirty-records", str(dirty_records), "--keys", "1000", "--pairs", "1",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)  # fmt: skip
    return run, out


@pytest.mark.slow
def test_bench_cleaner_writes_its_json(tmp_path: Path) -> None:
    run, out = bench_cleaner(tmp_path, 80_000)  # 10 MiB: one segment rolls, the cleaner has work
    assert run.returncode == 0, run.stderr
    assert "with the cleaner cleaning" in run.stdout
    result = json.loads(out.read_text())
    assert len(result["with_cleaner_records_per_s"]) == len(result["without_cleaner_records_per_s"]) == 1
    assert result["ratios"][0] > 0 and result["ratio_median"] == result["ratios"][0]
    assert result["cleaner_vm_hwm_bytes"] >= result["cleaner_idle_rss_bytes"] > 0
    assert result["dedupe_buffer_bytes"] == 134_217_728
