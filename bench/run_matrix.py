"""``make bench``: the pytest-benchmark suites, the standard matrix, the cost-growth runs, the targets table.

Run: ``.venv/bin/python -m bench.run_matrix`` (what ``make bench`` runs).  Options: ``--quick`` (a smoke run
of every part, smaller and once each), ``--skip-pytest``, ``--large`` (recovery up to 10 GiB instead of
2 GiB), ``--no-docs`` (leave ``docs/performance.md`` alone).

Writes ``bench/results/<UTC date>.json`` (everything: each run's full ``appliance bench`` JSON, the pytest
benchmarks' ``extra_info``, the targets), PNG plots in ``docs/img/`` (``bench.matrix_plots``) and the
generated part of ``docs/performance.md`` (between its BEGIN/END GENERATED markers), and prints a short
table (both from ``bench.matrix_report``).

The matrix is a subset of the full product (record sizes 10 B .. 100 KiB x partitions 1/8/64 x producers 1/4
x acks 1/all x compression none/zstd = 120 runs).  Each axis is swept with the others at the baseline
(100 B, 1 partition, 1 producer, acks=1, none, ``send()``):

* record size: 10 B, 100 B, 1 KiB, 10 KiB, 100 KiB x compression none, zstd (``send()``), and none through
  ``send_many()`` (15 runs);
* partitions 1, 8, 64 x producers 1, 4 (6 runs), and zstd at 8 partitions x 4 producers (1 run);
* acks=all at 1 and 8 partitions (2 runs; compared with the acks=1 runs above);
* produce-to-consume latency at offered loads of 10k, 50k, 100k, 200k and 400k records/s (5 runs);
* consume 5,000,000 records of 100 B locally and over TCP (2 runs); follower catch-up and acks=all vs acks=1
  (``appliance bench replicate``);
* the targets (``bench.matrix_report.TARGETS``), each run 3 times (the 10 KiB ones 5), interleaved, the
  median counting: send() 2,000,000 x 100 B, send_many() 5,000,000 x 100 B, 10 KiB records through send()
  and send_many(), e2e at 100,000/s, and acks=all vs acks=1 with two followers at 1,000,000 x 100 B (the
  record size of Kafka's 2014 figure the target cites; the replicate run's 1 KiB pair is listed as the
  matrix's run of that path);
* cost growth: partitions 1, 4, 16, 64, 256 (throughput, USS) and recovery at 1, 10, 100, 1000 segments.

Every produce run moves about 640 MB (at most 2,000,000 and at least 5,000 records), so that a run of small
records lasts as long as one of large records.  One ``appliance serve`` (started here, in a temporary
directory) serves the matrix; each run gets a fresh topic, deleted afterwards.

The page-cache ratio (the 10 KiB targets, the "x page cache" column) is ``appliance bench produce``'s: the
page-cache write bandwidth is probed right before AND right after each run, with the run's own bytes (its
payload pool, cycled as the producer sends it), for the run's volume, into a new file in the appliance's data
directory (the log's file system), each after ``os.sync()`` as the run; the run is held against the faster of
its two probes (``bench/test_bench_writer.py``'s and ``bench/test_bench_produce.py``'s 10 KiB benches do the
same, through the same ``bench.limits.PageCacheProbe``).  Each target round logs both probe samples, their
CPU per byte (which tells pages the host still backs from pages it must fault in first) and
``cpu_bound_ratio`` (the cheaper probe's CPU per byte over the costlier of producer and writer: what the run
would reach with a core each, which others' load does not move).  The results file keeps them under
``extra.page_cache_probes``.  For records of 10 KiB and more (``RECYCLE_FROM_BYTES``: the page-cache runs)
the two probes and the run each start right after ``bench.limits.recycle_pages`` of their volume, so all three
write into pages the host backs (what a long-running appliance's page cache meets) instead of whichever kind
what was freed before them left.  The replicate run does the same before the follower's catch-up and before
each of its acks runs (the followers write into their page cache what the ``sendfile`` limit never writes).
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
from typing import Any, NamedTuple

from bench.acks import acks_comparison
from bench.consume import run_consume
from bench.e2e import run_e2e
from bench.harness import Appliance
from bench.matrix_report import LARGE_TARGET_ROUNDS, TARGET_ROUNDS, print_table, targets, update_doc
from bench.produce import ProduceSettings, run_produce
from bench.replicate import run_replicate
from bench.scaling import run_partitions, run_recovery

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
IMAGES = REPO / "docs" / "img"

SIZES = (10, 100, 1024, 10 * 1024, 100 * 1024)
RUN_BYTES = 640 * 10**6
RECYCLE_FROM_BYTES = 10 * 1024  # records this large: probes and run each start after recycle_pages
E2E_LOADS = (10_000, 50_000, 100_000, 200_000, 400_000)

ERRORS: list[dict[str, str]] = []  # parts that failed: the tree is shared, a module may be mid-edit


def attempt(log: Any, label: str, run: Any) -> Any:
    """``run()``, or None when it fails: the failure is logged and kept in the results (``errors``), and the
    rest of the matrix goes on."""
    try:
        return run()
    except Exception as exc:  # one broken part must not cost the rest of the matrix
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


class TargetConfig(NamedTuple):
    """A produce target's configuration and how many rounds of it run."""

    settings: ProduceSettings
    rounds: int


def _target_configs(quick: bool) -> list[TargetConfig]:
    """send() and send_many() of 100 B records, then of 10 KiB records (recycling pages)."""
    send, send_many = (200_000, 200_000) if quick else (2_000_000, 5_000_000)
    large = _records_for(10 * 1024, quick)
    return [
        TargetConfig(ProduceSettings(records=send, record_size=100), TARGET_ROUNDS),
        TargetConfig(ProduceSettings(records=send_many, record_size=100, api="send_many"), TARGET_ROUNDS),
        TargetConfig(ProduceSettings(records=large, record_size=10 * 1024, recycle_pages=True),
                     LARGE_TARGET_ROUNDS),
        TargetConfig(ProduceSettings(records=large, record_size=10 * 1024, api="send_many",
                                     recycle_pages=True), LARGE_TARGET_ROUNDS),
    ]


def target_runs(app: Appliance, quick: bool, log: Any) -> list[dict[str, Any]]:
    """The produce targets, each configuration run its number of rounds (one when ``quick``), interleaved (a
    burst of load from elsewhere on the machine then hits one round of each, not every round of one)."""
    configs = _target_configs(quick)
    rows = []
    for round_index in range(1 if quick else max(config.rounds for config in configs)):
        for config in configs:
            if round_index >= config.rounds:
                continue
            settings = config.settings
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
    """The acks target: acks=1 then acks=all of 100-byte records (the record size of Kafka's 2014
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

    results = _header(now, args.quick)
    results["pytest"] = None if args.skip_pytest else pytest_suites(log)
    results.update(one_appliance_runs(args.quick, log))
    results.update(cost_growth_runs(args.quick, args.large, log))
    _close(results, started)
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


def _header(now: datetime.datetime, quick: bool) -> dict[str, Any]:
    """The results' first keys: when, which commit, which host."""
    commit = os.environ.get("BENCH_GIT_COMMIT") or subprocess.run(  # set when run from a `git archive` copy
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "git_commit": commit, "quick": quick,
            "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                     "loadavg_1m_at_start": os.getloadavg()[0]}}


def one_appliance_runs(quick: bool, log: Any) -> dict[str, Any]:
    """The matrix, the target rounds, latency, consume and replicate runs, against one ``appliance serve``
    started here."""
    results: dict[str, Any] = {}
    app = Appliance.open(None)
    try:
        results["produce"] = produce_matrix(app, quick, log)
        results["targets"] = target_runs(app, quick, log)
        results["e2e"] = e2e_runs(app, quick, log)
        results["e2e_targets"] = e2e_target_runs(app, quick, log)
        results["consume"] = consume_runs(app, quick, log)
        results["replicate"] = replicate_run(app, quick, log)
        results["acks_targets"] = acks_target_runs(app, quick, log)
    finally:
        app.close()
    return results


def cost_growth_runs(quick: bool, large: bool, log: Any) -> dict[str, Any]:
    """Partitions 1 -> 256 and recovery as the log grows, each starting appliances of its own."""
    log("partitions 1 -> 256")
    partitions = attempt(log, "partitions", lambda: run_partitions(
        [1, 4, 16, 64] if quick else [1, 4, 16, 64, 256], records=200_000 if quick else 1_000_000))
    log("recovery as the log grows")
    max_bytes = (10 << 30) if large else ((200 << 20) if quick else (2 << 30))
    recovery = attempt(log, "recovery", lambda: run_recovery([1, 10, 100, 1000], max_bytes=max_bytes))
    return {"partitions": partitions, "recovery": recovery}


def _close(results: dict[str, Any], started: float) -> None:
    """The results' closing keys: failed parts, the targets table, the time taken, the load seen."""
    results["errors"] = ERRORS
    results["target_table"] = targets(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    results["host"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    loads = [r["host"]["loadavg_1m_at_end"] for r in results["produce"] + results["targets"] + results["e2e"]
             + results["consume"]]
    results["host"]["loadavg_1m_median_of_runs"] = sorted(loads)[len(loads) // 2] if loads else None


if __name__ == "__main__":
    sys.exit(main())
