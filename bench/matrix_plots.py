"""The plots of ``make bench`` (matplotlib, no display): one PNG per question a user asks.

* ``throughput_vs_record_size.png``: MB/s and records/s against the record size (none and zstd through
  ``send()``, none through ``send_many()``), with the page-cache write limit measured next to each run;
* ``latency_vs_offered_load.png``: produce-to-consume p50 / p95 / p99 / p99.9 against the offered load;
* ``scaling_partitions_producers.png``: records/s at 1, 8, 64 partitions with 1 and 4 producers;
* ``partitions_cost.png``: records/s and unique memory (supervisor + writers) as partitions grow to 256;
* ``recovery_vs_log_size.png``: restart time after a crash and after a clean stop as the log grows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plot_all"]


def _save(fig: Any, directory: Path, name: str) -> str:
    path = directory / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _size_runs(results: dict[str, Any], compression: str, api: str) -> list[dict[str, Any]]:
    rows = [r for r in results["produce"] if r["group"] == "size"
            and r["config"]["compression"] == compression and r["config"]["api"] == api]
    return sorted(rows, key=lambda r: r["config"]["record_size"])


def throughput_vs_record_size(results: dict[str, Any], directory: Path) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    lines = (("none", "send", "o-"), ("zstd", "send", "s-"), ("none", "send_many", "^--"))
    for compression, api, style in lines:
        rows = _size_runs(results, compression, api)
        if not rows:
            continue
        sizes = [r["config"]["record_size"] for r in rows]
        label = f"{api}(), {compression}"
        left.plot(sizes, [r["mb_per_s"] for r in rows], style, label=label)
        right.plot(sizes, [r["records_per_s"] for r in rows], style, label=label)
    limit_rows = _size_runs(results, "none", "send")
    if limit_rows:
        left.plot([r["config"]["record_size"] for r in limit_rows],
                  [r["limits"]["page_cache_write_mb_per_s"] for r in limit_rows], "k:",
                  label="page-cache write (same volume, same run)")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("record size (bytes)")
        axis.grid(True, which="both", alpha=0.3)
    left.set_ylabel("payload MB/s")
    right.set_ylabel("records/s")
    right.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title("produce throughput vs record size (1 partition, acks=1)", fontsize=9)
    right.set_title("records/s vs record size", fontsize=9)
    return _save(fig, directory, "throughput_vs_record_size.png")


def latency_vs_offered_load(results: dict[str, Any], directory: Path) -> str:
    rows = sorted(results["e2e"], key=lambda r: r["config"]["throughput"])
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    loads = [r["config"]["throughput"] for r in rows]
    for key, label in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p99_9", "p99.9")):
        axis.plot(loads, [r["latency_ms"][key] for r in rows], "o-", label=label)
    axis.axhline(1.0, color="k", linestyle=":", label="target p99 1 ms")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("offered load (records/s, 100 B)")
    axis.set_ylabel("produce-to-consume latency (ms)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title("latency percentiles vs offered load (linger.ms=0, local consumer)", fontsize=9)
    return _save(fig, directory, "latency_vs_offered_load.png")


def scaling(results: dict[str, Any], directory: Path) -> str:
    base = [r for r in results["produce"] if r["config"]["record_size"] == 100 and r["config"]["acks"] == "1"
            and r["config"]["compression"] == "none" and r["config"]["api"] == "send"]
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    for producers, style in ((1, "o-"), (4, "s-")):
        rows = sorted((r for r in base if r["config"]["producers"] == producers),
                      key=lambda r: r["config"]["partitions"])
        axis.plot([r["config"]["partitions"] for r in rows], [r["records_per_s"] for r in rows], style,
                  label=f"{producers} producer{'s' if producers > 1 else ''}")
    axis.set_xscale("log")
    axis.set_xticks([1, 8, 64], ["1", "8", "64"])
    axis.set_xlabel("partitions")
    axis.set_ylabel("records/s (100 B, send(), acks=1)")
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title("scaling with partitions and producer processes (2 cores)", fontsize=9)
    return _save(fig, directory, "scaling_partitions_producers.png")


def partitions_cost(results: dict[str, Any], directory: Path) -> str:
    rows = results["partitions"]["rows"]
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    counts = [r["partitions"] for r in rows]
    axis.plot(counts, [r["records_per_s"] for r in rows], "o-", color="tab:blue", label="records/s")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("partitions (one writer process each)")
    axis.set_ylabel("records/s (100 B, send_many)", color="tab:blue")
    axis.set_ylim(bottom=0)
    memory = axis.twinx()
    memory.plot(counts, [r["supervisor_and_writers_uss_mib"] for r in rows], "s--", color="tab:red",
                label="USS supervisor + writers")
    memory.set_ylabel("unique memory, MiB", color="tab:red")
    memory.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.set_title("cost of partitions: throughput and memory", fontsize=9)
    return _save(fig, directory, "partitions_cost.png")


def recovery(results: dict[str, Any], directory: Path) -> str:
    rows = results["recovery"]["rows"]
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    sizes = [r["log_gib"] for r in rows]
    axis.plot(sizes, [r["crash_restart_s"] for r in rows], "o-", label="after SIGKILL: start to ready")
    axis.plot(sizes, [r["clean_restart_s"] for r in rows], "s-", label="after a clean stop: start to ready")
    axis.plot(sizes, [r["clean_stop_s"] for r in rows], "^--", label="clean stop (SIGTERM)")
    for row in rows:
        axis.annotate(f"{row['segments']} seg", (row["log_gib"], row["crash_restart_s"]), fontsize=7,
                      textcoords="offset points", xytext=(4, 4))
    axis.set_xscale("log")
    axis.set_xlabel("log size (GiB, one partition)")
    axis.set_ylabel("seconds")
    axis.set_ylim(bottom=0)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title("restart and recovery time as the log grows (page cache warm)", fontsize=9)
    return _save(fig, directory, "recovery_vs_log_size.png")


def plot_all(results: dict[str, Any], directory: Path) -> list[str]:
    """Every plot the results allow; the PNG paths."""
    directory.mkdir(parents=True, exist_ok=True)
    made = [throughput_vs_record_size(results, directory), scaling(results, directory)]
    if results.get("e2e"):
        made.append(latency_vs_offered_load(results, directory))
    if results.get("partitions"):
        made.append(partitions_cost(results, directory))
    if results.get("recovery"):
        made.append(recovery(results, directory))
    return made
