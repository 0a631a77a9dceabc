"""``make bench``: the pytest-benchmark suites, the standard matrix, the cost-growth runs, the targets table.

Run: ``.venv/bin/python -m bench.run_matrix`` (what ``make bench`` runs).  Options: ``--quick`` (a smoke run
of every part, about two minutes), ``--skip-pytest``, ``--large`` (recovery up to 10 GiB instead of 2 GiB),
``--no-docs`` (leave ``docs/performance.md`` alone).

Writes ``bench/results/<UTC date>.json`` (everything: each run's full ``appliance bench`` JSON, the pytest
benchmarks' ``extra_info``, the targets), PNG plots in ``docs/img/`` and the generated part of
``docs/performance.md`` (between its BEGIN/END GENERATED markers), and prints a short table.

The matrix is a subset of the full product (record sizes 10 B .. 100 KiB x partitions 1/8/64 x producers 1/4
x acks 1/all x compression none/zstd = 120 runs would take about an hour on 2 cores).  Each axis is swept
with the others at the baseline (100 B, 1 partition, 1 producer, acks=1, none, ``send()``):

* record size: 10 B, 100 B, 1 KiB, 10 KiB, 100 KiB x compression none, zstd (``send()``), and none through
  ``send_many()`` (15 runs);
* partitions 1, 8, 64 x producers 1, 4 (6 runs), and zstd at 8 partitions x 4 producers (1 run);
* acks=all at 1 and 8 partitions (2 runs; compared with the acks=1 runs above);
* produce-to-consume latency at offered loads of 10k, 50k, 100k, 200k and 400k records/s (5 runs);
* consume 5,000,000 records of 100 B locally and over TCP (2 runs); follower catch-up and acks=all vs acks=1
  (``appliance bench replicate``);
* the issue targets, each run 3 times (the 10 KiB ones 5), interleaved, the median counting: send()
  2,000,000 x 100 B, send_many() 5,000,000 x 100 B, 10 KiB records through send() and send_many(), e2e
  at 100,000/s, and acks=all vs acks=1 with two followers at 1,000,000 x 100 B (the record size of Kafka's
  2014 figure the target cites; the replicate run's 1 KiB pair is listed as the matrix's run of that path);
* cost growth: partitions 1, 4, 16, 64, 256 (throughput, USS) and recovery at 1, 10, 100, 1000 segments.

Every produce run moves about 640 MB (at most 2,000,000 and at least 5,000 records), so a run takes a second
or more whatever its record size.  One ``appliance serve`` (started here, in a temporary directory) serves the
matrix; each run gets a fresh topic, deleted afterwards.

The page-cache ratio (the 10 KiB targets, the "x page cache" column) is ``appliance bench produce``'s: the
page-cache write bandwidth is probed right before AND right after each run, with the run's own bytes (its
payload pool, cycled as the producer sends it), for the run's volume, into a new file in the appliance's data
directory (the log's file system), each after ``os.sync()`` as the run; the run is held against the faster of
its two probes (``bench/test_bench_writer.py``'s and ``bench/test_bench_produce.py``'s 10 KiB benches do the
same, through the same ``bench.limits.PageCacheProbe``).  Each target round logs both probe samples,
their CPU per byte (~0.2-0.3 ns: pages the host still backs; ~2.5 ns: pages it must fault in first, which
moves the figure tenfold on this virtual machine) and ``cpu_bound_ratio`` (the cheaper probe's CPU per byte
over the costlier of producer and writer: what the run would reach with a core each, which others' load does
not move).  The results file keeps them under ``extra.page_cache_probes``.  For records of 10 KiB and more
(``RECYCLE_FROM_BYTES``: the page-cache runs) the two probes and the run each start right after
``perf_limits.recycle_pages`` of their volume, so all three write into pages the host backs (what a
long-running appliance's page cache meets) instead of whichever kind what was freed before them left.  The
replicate run does the same before the follower's catch-up and before each of its acks runs (the followers
write into their page cache what the ``sendfile`` limit never writes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.consume import run_consume
from bench.e2e import run_e2e
from bench.harness import Appliance
from bench.produce import ProduceSettings, run_produce
from bench.replicate import acks_comparison, run_replicate
from bench.scaling import run_partitions, run_recovery

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
IMAGES = REPO / "docs" / "img"
DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- BEGIN GENERATED (bench/run_matrix.py) -->", "<!-- END GENERATED -->"

SIZES = (10, 100, 1024, 10 * 1024, 100 * 1024)
RUN_BYTES = 640 * 10**6
TARGET_ROUNDS = 3  # the target configurations run this many times, interleaved; the median counts
LARGE_TARGET_ROUNDS = 5  # the 10 KiB page-cache targets: ~5 s a round, and their rounds scatter most
RECYCLE_FROM_BYTES = 10 * 1024  # records this large: probes and run each start after recycle_pages
E2E_LOADS = (10_000, 50_000, 100_000, 200_000, 400_000)

TARGETS = (  # (key, what, goal, unit, higher is better)
    ("send_100b", "produce 100 B, send(), 1 producer, 1 partition, acks=1", 2_000_000, "records/s", True),
    ("send_many_100b", "produce 100 B, send_many()", 5_000_000, "records/s", True),
    ("consume_local", "consume 100 B, local mmap (poll_batch)", 3_000_000, "records/s", True),
    ("consume_tcp", "consume 100 B over TCP (poll_batch)", 2_000_000, "records/s", True),
    ("e2e_p99", "produce-to-consume p99 at 100,000 records/s", 1.0, "ms", False),
    ("large_send", "10 KiB records, send(): share of page-cache write", 0.7, "ratio", True),
    ("large_send_many", "10 KiB records, send_many(): share of page-cache write", 0.7, "ratio", True),
    ("replication", "follower catch-up: share of loopback sendfile", 0.7, "ratio", True),
    ("acks_all", "acks=all / acks=1 throughput (2 followers, 100 B)", 0.5, "ratio", True),
)


ERRORS: list[dict[str, str]] = []  # parts that failed: the tree is shared, a module may be mid-edit


def attempt(log: Any, label: str, run: Any) -> Any:
    """``run()``, or None when it fails: the failure is logged and kept in the results (``errors``), and the
    rest of the matrix goes on."""
    try:
        return run()
    except Exception as exc:  # one broken part must not cost the other fifteen minutes
        log(f"  FAILED {label}: {type(exc).__name__}: {exc}")
        ERRORS.append({"part": label, "error": f"{type(exc).__name__}: {exc}"})
        return None


def _records_for(size: int, quick: bool) -> int:
    if quick:
        return max(2_000, min(100_000, 20 * 10**6 // size))
    return max(5_000, min(2_000_000, RUN_BYTES // size))


def _label(s: ProduceSettings) -> str:
    return (f"{s.record_size} B, {s.partitions} part, {s.producers} prod, acks={s.acks}, {s.compression}, "
            f"{s.api}")


def _row(result: dict[str, Any], group: str) -> dict[str, Any]:
    return {"group": group, **result}


def produce_matrix(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    runs: list[tuple[str, ProduceSettings]] = []
    base = ProduceSettings(records=1, record_size=100)
    for size in SIZES:
        for compression in ("none", "zstd"):
            runs.append(("size", replace(base, record_size=size, compression=compression)))
        runs.append(("size", replace(base, record_size=size, api="send_many")))
    for partitions in (1, 8, 64):
        for producers in (1, 4):
            if partitions == 1 and producers == 1:
                continue  # the size sweep's 100 B run
            runs.append(("scaling", replace(base, partitions=partitions, producers=producers)))
    runs.append(("scaling", replace(base, partitions=8, producers=4, compression="zstd")))
    runs.append(("acks", replace(base, acks="all")))
    runs.append(("acks", replace(base, acks="all", partitions=8)))
    rows = []
    for group, settings in runs:
        settings = replace(settings, records=_records_for(settings.record_size, quick),
                           recycle_pages=settings.record_size >= RECYCLE_FROM_BYTES)
        log(f"produce {_label(settings)}: {settings.records:,} records")
        result = attempt(log, f"produce {_label(settings)}", lambda s=settings: run_produce(app, s))
        if result is None:
            continue
        log(f"  {result['records_per_s']:,.0f} records/s, {result['mb_per_s']:,.1f} MB/s, p99 "
            f"{result['latency_ms']['p99']} ms, page-cache ratio {result['ratios']['page_cache_write']:.3f}")
        rows.append(_row(result, group))
    return rows


def target_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    """The issue 3 produce targets, each run TARGET_ROUNDS times (the 10 KiB ones LARGE_TARGET_ROUNDS),
    interleaved (a burst of load from elsewhere on the machine then hits one round of each, not every round
    of one)."""
    configs = [  # (settings, rounds)
        (ProduceSettings(records=200_000 if quick else 2_000_000, record_size=100), TARGET_ROUNDS),
        (ProduceSettings(records=200_000 if quick else 5_000_000, record_size=100, api="send_many"),
         TARGET_ROUNDS),
        (ProduceSettings(records=_records_for(10 * 1024, quick), record_size=10 * 1024, recycle_pages=True),
         LARGE_TARGET_ROUNDS),
        (ProduceSettings(records=_records_for(10 * 1024, quick), record_size=10 * 1024, api="send_many",
                         recycle_pages=True), LARGE_TARGET_ROUNDS),
    ]
    rows = []
    for round_index in range(1 if quick else max(rounds for _, rounds in configs)):
        for settings, rounds in configs:
            if round_index >= rounds:
                continue
            label = f"target round {round_index + 1}: produce {_label(settings)}"
            log(f"{label}: {settings.records:,} records")
            result = attempt(log, label, lambda s=settings: run_produce(app, s))
            if result is None:
                continue
            log(f"  {result['records_per_s']:,.0f} records/s, {result['ratios']['page_cache_write']:.3f} of "
                f"page-cache write{_probes(result)}")
            rows.append(_row(result, "target"))
    return rows


def _probes(result: dict[str, Any]) -> str:
    """The page-cache probes of a produce run, for the log: both samples, their CPU per byte, the ratio to
    their mean and the CPU-bound ratio."""
    extra = result.get("extra", {})
    probes = extra.get("page_cache_probes")
    if not probes:
        return ""
    samples = " / ".join(f"{x:,.0f}" for x in probes["samples_mb_per_s"])
    cpu = " / ".join(f"{x:.2f}" for x in probes["cpu_ns_per_byte"])
    return (f" (probes before / after {samples} MB/s at {cpu} ns/B of CPU; to their mean "
            f"{probes['ratio_to_mean']:.3f}; CPU-bound {probes['cpu_bound_ratio']:.3f}; producer "
            f"{extra['producer_cpu_ns_per_byte']:.2f}, writer {extra['writer_cpu_ns_per_byte']:.2f} ns/B)")


def e2e_target_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    rows = []
    for round_index in range(1 if quick else TARGET_ROUNDS):
        settings = ProduceSettings(records=100_000 if quick else 300_000, record_size=100, throughput=100_000,
                                   measure_limits=False)
        result = attempt(log, f"e2e target round {round_index + 1}",
                         lambda s=settings: run_e2e(app, s, seconds=s.records / 100_000))
        if result is not None:
            log(f"  e2e target round {round_index + 1}: p99 {result['latency_ms']['p99']} ms")
            rows.append(_row(result, "e2e-target"))
    return rows


def e2e_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    rows = []
    for load in E2E_LOADS:
        seconds = 1.0 if quick else 3.0
        settings = ProduceSettings(records=int(load * seconds), record_size=100, throughput=load,
                                   measure_limits=False)
        log(f"e2e at {load:,} records/s for {seconds:.0f} s")
        result = attempt(log, f"e2e {load}", lambda s=settings, t=seconds: run_e2e(app, s, seconds=t))
        if result is None:
            continue
        lat = result["latency_ms"]
        log(f"  p50 {lat['p50']} ms, p99 {lat['p99']} ms, p99.9 {lat['p99_9']} ms, achieved "
            f"{result['records_per_s']:,.0f}/s")
        rows.append(_row(result, "e2e"))
    return rows


def consume_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    rows = []
    records = 200_000 if quick else 5_000_000
    for transport in ("shm", "tcp"):
        log(f"consume {records:,} x 100 B, {transport}")
        result = attempt(log, f"consume {transport}", lambda t=transport: run_consume(
            app, ProduceSettings(records=records, record_size=100, transport=t)))
        if result is None:
            continue
        log(f"  {result['records_per_s']:,.0f} records/s")
        rows.append(_row(result, "consume"))
    return rows


def replicate_run(app: Appliance, quick: bool, log: Any) -> dict[str, Any] | None:
    records = 50_000 if quick else 500_000
    log(f"replicate {records:,} x 1 KiB (catch-up), then acks=1 vs acks=all")
    result: dict[str, Any] | None = attempt(log, "replicate", lambda: run_replicate(
        app, ProduceSettings(records=records, record_size=1024, recycle_pages=True), followers=2))
    if result is None:
        return None
    log(f"  catch-up {result['mb_per_s']:,.1f} MB/s = {result['ratios']['loopback_sendfile']:.3f} of "
        f"loopback sendfile; acks=all/acks=1 {result['extra']['acks']['ratio']}")
    return result


def acks_target_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    """The issue 5 acks target: acks=1 then acks=all of 100-byte records (the record size of Kafka's 2014
    figure the target cites) to a topic with two followers, TARGET_ROUNDS times; the replicate run's 1 KiB
    pair is the matrix's run of the same path."""
    records = 200_000 if quick else 1_000_000
    rows = []
    for round_index in range(1 if quick else TARGET_ROUNDS):
        label = f"acks target round {round_index + 1}: {records:,} x 100 B, acks=1 then acks=all, 2 followers"
        log(label)
        notes: list[str] = []
        result = attempt(log, label, lambda n=notes: acks_comparison(
            app, ProduceSettings(records=records, record_size=100, recycle_pages=True), 2, n))
        if result is None:
            continue
        result["notes"] = notes
        log(f"  acks=1 {result['acks_1']['records_per_s']:,.0f}, acks=all "
            f"{result['acks_all']['records_per_s']:,.0f} records/s: {result['ratio']}")
        rows.append(result)
    return rows


def pytest_suites(log: Any) -> dict[str, Any]:
    """Run every bench/test_bench_*.py; their benchmarks' medians and extra_info by name."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    log("pytest-benchmark suites: pytest bench --benchmark-enable --benchmark-only")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "bench"), "-q", "-p",
                           "no:cacheprovider", "--benchmark-enable", "--benchmark-only",
                           f"--benchmark-json={out}"],
                          cwd=REPO, capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    log(f"  {summary} ({time.monotonic() - started:.0f} s)")
    suites: dict[str, Any] = {"returncode": done.returncode, "summary": summary,
                              "seconds": round(time.monotonic() - started, 1), "benchmarks": {}}
    try:
        data = json.loads(Path(out).read_text())
        for bench in data.get("benchmarks", []):
            suites["benchmarks"][bench["fullname"]] = {"median_s": bench["stats"]["median"],
                                                       "extra_info": bench.get("extra_info", {})}
    except (OSError, ValueError) as exc:
        suites["error"] = str(exc)
    finally:
        Path(out).unlink(missing_ok=True)
    return suites


# -- targets ----------------------------------------------------------------------------------------------


def _find(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row["config"].get(k) == v for k, v in want.items()) and row.get("group") != "e2e":
            return row
    return None


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue targets: the median of the target rounds, the other runs of the same path listed."""
    rounds = results["targets"]
    base = {"partitions": 1, "producers": 1, "acks": "1", "compression": "none"}

    def of(rows: list[dict[str, Any]], pick: Any, **want: Any) -> list[float]:
        return [pick(r) for r in rows if all(r["config"].get(k) == v for k, v in {**base, **want}.items())]

    def rate(r: dict[str, Any]) -> float:
        return float(r["records_per_s"])

    def page_cache(r: dict[str, Any]) -> float:
        return float(r["ratios"]["page_cache_write"])

    measured: dict[str, tuple[list[float], list[float], str]] = {
        "send_100b": (of(rounds, rate, record_size=100, api="send"),
                      of(results["produce"], rate, record_size=100, api="send"), ""),
        "send_many_100b": (of(rounds, rate, record_size=100, api="send_many"),
                           of(results["produce"], rate, record_size=100, api="send_many"), ""),
        "large_send": (of(rounds, page_cache, record_size=10240, api="send"),
                       of(results["produce"], page_cache, record_size=10240, api="send"), ""),
        "large_send_many": (of(rounds, page_cache, record_size=10240, api="send_many"),
                            of(results["produce"], page_cache, record_size=10240, api="send_many"), ""),
        "e2e_p99": ([r["latency_ms"]["p99"] for r in results["e2e_targets"]],
                    [r["latency_ms"]["p99"] for r in results["e2e"] if r["config"]["throughput"] == 100_000],
                    ""),
    }
    for key, transport in (("consume_local", "shm"), ("consume_tcp", "tcp")):
        runs = [r["records_per_s"] for r in results["consume"] if r["config"]["transport"] == transport]
        measured[key] = (runs, [], "")
    rep = results.get("replicate")
    catch_up = [rep["ratios"]["loopback_sendfile"]] if rep and rep.get("ratios") else []
    measured["replication"] = (catch_up, [], "")
    acks = rep["extra"]["acks"] if rep else None
    acks_rounds = [r["ratio"] for r in results.get("acks_targets") or [] if r.get("replication_available")]
    if acks_rounds:
        same_path = [acks["ratio"]] if acks and acks.get("replication_available") else []
        measured["acks_all"] = (acks_rounds, same_path, "")
    else:
        measured["acks_all"] = ([], [], "not measurable: no topic with followers"
                                + (f" ({acks['why_not']})" if acks and acks.get("why_not") else ""))
    out = []
    for key, what, goal, unit, higher in TARGETS:
        values, others, why = measured[key]
        value = _median(values)
        met = None if value is None else (value >= goal if higher else value <= goal)
        out.append({"key": key, "what": what, "goal": goal, "unit": unit, "measured": value, "met": met,
                    "rounds": values, "other_runs": others, "note": why})
    return out


# -- output -----------------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "records/s":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:.3f}"
    return f"{value:.3f}"


def tables(results: dict[str, Any]) -> str:
    """The Markdown tables of docs/performance.md's generated part."""
    lines = ["### Targets", "",
             f"Median of the target rounds (each configuration run {TARGET_ROUNDS} times, the 10 KiB "
             f"page-cache ones {LARGE_TARGET_ROUNDS} times, interleaved); the rounds and the matrix's runs "
             "of the same path follow.", "",
             "| target | goal | measured (median) | met | rounds | same path in the matrix |",
             "| --- | --- | --- | --- | --- | --- |"]
    for t in results["target_table"]:
        goal = f"{'>=' if t['key'] != 'e2e_p99' else '<='} {_fmt(t['goal'], t['unit'])} {t['unit']}"
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        rounds = ", ".join(_fmt(v, t["unit"]) for v in t["rounds"])
        others = ", ".join(_fmt(v, t["unit"]) for v in t["other_runs"])
        lines.append(f"| {t['what']} | {goal} | {_fmt(t['measured'], t['unit'])}{note} | {met} | {rounds} | "
                     f"{others} |")
    lines += ["", "### Produce matrix", "",
              "| record | partitions | producers | acks | compression | api | records/s | MB/s | p50 ms | "
              "p99 ms | x page cache | x memcpy | log MB/s | zstd ratio |",
              "|" + " ---: |" * 3 + " --- |" * 3 + " ---: |" * 8]
    for r in results["produce"] + results["targets"]:
        c, lat, ratio = r["config"], r["latency_ms"], r["ratios"]
        lines.append(
            f"| {_size(c['record_size'])} | {c['partitions']} | {c['producers']} | {c['acks']} | "
            f"{c['compression']} | {c['api']} | {r['records_per_s']:,.0f} | {r['mb_per_s']:,.1f} | "
            f"{lat['p50']:.2f} | {lat['p99']:.2f} | {ratio['page_cache_write']:.3f} | "
            f"{ratio['memcpy']:.3f} | {r['extra']['log_mb_per_s']:,.1f} | "
            f"{r['extra']['compression_ratio']:.2f} |")
    lines += ["", "### Produce-to-consume latency (100 B, 1 partition, linger.ms=0, local consumer)", "",
              "| offered records/s | achieved | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results["e2e"]:
        lat = r["latency_ms"]
        lines.append(f"| {r['config']['throughput']:,.0f} | {r['records_per_s']:,.0f} | {lat['p50']:.3f} | "
                     f"{lat['p95']:.3f} | {lat['p99']:.3f} | {lat['p99_9']:.3f} | {lat['max']:.3f} |")
    lines += ["", "### Consume and replicate", "",
              "| run | records/s | MB/s | limit | x limit |", "| --- | ---: | ---: | --- | ---: |"]
    for r in results["consume"]:
        primary = r["primary_limit"]
        lines.append(f"| consume 100 B, {r['config']['transport']} | {r['records_per_s']:,.0f} | "
                     f"{r['mb_per_s']:,.1f} | {primary} | {r['ratios'][primary]:.3f} |")
    rep = results.get("replicate")
    if rep:
        lines.append(f"| follower catch-up, 1 KiB records (log bytes) | {rep['records_per_s']:,.0f} | "
                     f"{rep['mb_per_s']:,.1f} | loopback_sendfile (same files) | "
                     f"{rep['ratios']['loopback_sendfile']:.3f} |")
        acks = rep["extra"]["acks"]
        lines.append(f"| produce 1 KiB acks=1 / acks=all ({acks['followers']} followers) | "
                     f"{acks['acks_1']['records_per_s']:,.0f} / {acks['acks_all']['records_per_s']:,.0f} | | "
                     f"acks=all / acks=1 | {acks['ratio']:.3f} |")
    for acks in results.get("acks_targets") or []:
        lines.append(f"| produce 100 B acks=1 / acks=all ({acks['followers']} followers; acks target) | "
                     f"{acks['acks_1']['records_per_s']:,.0f} / {acks['acks_all']['records_per_s']:,.0f} | | "
                     f"acks=all / acks=1 | {acks['ratio']:.3f} |")
    part = results.get("partitions")
    if part:
        lines += ["", "### Partitions 1 -> 256 (send_many, 100 B)", "",
                  "| partitions | records/s | MB/s | serve ready s | USS supervisor + writers MiB "
                  "| per writer MiB |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in part["rows"]:
            lines.append(f"| {row['partitions']} | {row['records_per_s']:,.0f} | {row['mb_per_s']:,.1f} | "
                         f"{row['serve_ready_s']:.2f} | {row['supervisor_and_writers_uss_mib']:,.1f} | "
                         f"{row['uss_per_writer_mib']:.2f} |")
    rec = results.get("recovery")
    if rec:
        lines += ["", "### Restart and recovery as the log grows (one partition)", "",
                  "| segments | log GiB | crash: restart s | crash: recovery ms | clean stop s "
                  "| clean restart s |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in rec["rows"]:
            lines.append(f"| {row['segments']} | {row['log_gib']:.3f} | {row['crash_restart_s']:.2f} | "
                         f"{row['crash_recovery_ms']} | {row['clean_stop_s']:.2f} | "
                         f"{row['clean_restart_s']:.2f} |")
    return "\n".join(lines)


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def update_doc(results: dict[str, Any], images: list[str], command: str) -> None:
    limits = [r["limits"] for r in results["produce"] if r.get("limits")]
    med = {k: sorted(x[k] for x in limits)[len(limits) // 2] for k in
           ("memcpy_mb_per_s", "page_cache_write_mb_per_s", "loopback_sendfile_mb_per_s")} if limits else {}
    body = [BEGIN, "",
            f"Generated by `{command}` on {results['date']} (commit `{results['git_commit']}`, "
            f"{results['host']['cpus']} cores, Python {results['host']['python']}); "
            f"{results['seconds'] / 60:.1f} minutes in all.  Raw figures: `{results['results_file']}`.  "
            f"The machine was shared: 1-minute load average {results['host']['loadavg_1m_at_start']:.1f} at "
            f"the start, a median of {results['host']['loadavg_1m_median_of_runs']:.1f} at the end of the "
            f"runs (2 means both cores busy).", ""]
    if med:
        body.append(f"Limits (medians over the produce runs; page-cache write is the faster of the two "
                    f"probes right before and right after each run, with its bytes): memcpy "
                    f"{med['memcpy_mb_per_s']:,.0f} MB/s, page-cache write "
                    f"{med['page_cache_write_mb_per_s']:,.0f} MB/s, loopback sendfile "
                    f"{med['loopback_sendfile_mb_per_s']:,.0f} MB/s.")
        body.append("")
    body.append(tables(results))
    body.append("")
    if results.get("errors"):
        body.append("Parts that failed in this run (the tree is shared; see the results file):")
        body.append("")
        body += [f"* {e['part']}: `{e['error'][:300]}`" for e in results["errors"]]
        body.append("")
    for image in images:
        name = Path(image).stem.replace("_", " ")
        body.append(f"![{name}](img/{Path(image).name})")
        body.append("")
    body.append(END)
    generated = "\n".join(body)
    text = DOC.read_text() if DOC.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated + tail
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    DOC.write_text(text)


def print_table(results: dict[str, Any]) -> None:
    print("\ntarget                                                     goal           measured        met")
    for t in results["target_table"]:
        sign = "<=" if t["key"] == "e2e_p99" else ">="
        goal = f"{sign} {_fmt(t['goal'], t['unit'])}"
        met = {True: "yes", False: "NO", None: "n/a"}[t["met"]]
        print(f"{t['what'][:58]:<58} {goal:>14} {_fmt(t['measured'], t['unit']):>14}  {met:>4}"
              + (f"  ({t['note'][:60]})" if t["note"] else ""))
    print("\nproduce: record size / partitions / producers / acks / compression / api -> records/s, MB/s, "
          "x page cache")
    for r in results["produce"] + results["targets"]:
        c = r["config"]
        print(f"  {_size(c['record_size']):>7} {c['partitions']:>3}p {c['producers']}k acks={c['acks']:<3} "
              f"{c['compression']:<4} {c['api']:<9} {r['records_per_s']:>12,.0f} {r['mb_per_s']:>9,.1f} "
              f"{r['ratios']['page_cache_write']:>7.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run_matrix.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run of every part")
    parser.add_argument("--skip-pytest", action="store_true", help="do not run the pytest-benchmark suites")
    parser.add_argument("--large", action="store_true", help="recovery up to 10 GiB (default 2 GiB)")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    parser.add_argument("--out", default=str(RESULTS), help="results directory (bench/results)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    now = datetime.datetime.now(datetime.UTC)

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {message}", flush=True)

    commit = os.environ.get("BENCH_GIT_COMMIT") or subprocess.run(  # set when run from a `git archive` copy
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    results: dict[str, Any] = {"date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "git_commit": commit,
                               "quick": args.quick, "host": {"cpus": os.cpu_count(),
                                                             "python": sys.version.split()[0],
                                                             "loadavg_1m_at_start": os.getloadavg()[0]}}
    results["pytest"] = None if args.skip_pytest else pytest_suites(log)
    app = Appliance.open(None)
    try:
        results["produce"] = produce_matrix(app, args.quick, log)
        results["targets"] = target_runs(app, args.quick, log)
        results["e2e"] = e2e_runs(app, args.quick, log)
        results["e2e_targets"] = e2e_target_runs(app, args.quick, log)
        results["consume"] = consume_runs(app, args.quick, log)
        results["replicate"] = replicate_run(app, args.quick, log)
        results["acks_targets"] = acks_target_runs(app, args.quick, log)
    finally:
        app.close()
    log("partitions 1 -> 256")
    results["partitions"] = attempt(log, "partitions", lambda: run_partitions(
        [1, 4, 16, 64] if args.quick else [1, 4, 16, 64, 256], records=200_000 if args.quick else 1_000_000))
    log("recovery as the log grows")
    max_bytes = (10 << 30) if args.large else ((200 << 20) if args.quick else (2 << 30))
    results["recovery"] = attempt(log, "recovery", lambda: run_recovery([1, 10, 100, 1000],
                                                                        max_bytes=max_bytes))
    results["errors"] = ERRORS
    results["target_table"] = targets(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    results["host"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    loads = [r["host"]["loadavg_1m_at_end"] for r in results["produce"] + results["targets"] + results["e2e"]
             + results["consume"]]
    results["host"]["loadavg_1m_median_of_runs"] = sorted(loads)[len(loads) // 2] if loads else None
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = now.strftime("%Y-%m-%d") + ("-quick" if args.quick else "")
    path = out_dir / f"{name}.json"
    results["results_file"] = os.path.relpath(path, REPO)
    path.write_text(json.dumps(results, indent=1) + "\n")
    from bench.matrix_plots import plot_all

    images = plot_all(results, IMAGES if not args.quick else out_dir / f"{name}-img")
    command = os.environ.get("BENCH_COMMAND") or (
        "make bench" + (" (python -m bench.run_matrix --quick)" if args.quick else ""))
    if not args.no_docs and not args.quick:
        update_doc(results, images, command)
    print_table(results)
    for error in results["errors"]:
        print(f"FAILED {error['part']}: {error['error'][:200]}")
    log(f"wrote {path} and {len(images)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
