"""What ``make bench`` reports from its results (``bench.run_matrix``): the targets table, the generated part
of ``docs/performance.md`` and the short table it prints.

The targets (:data:`TARGETS`) are measured by dedicated rounds of each target configuration, interleaved
(``TARGET_ROUNDS`` of each, ``LARGE_TARGET_ROUNDS`` of the 10 KiB page-cache ones); :func:`targets` takes the
median of those rounds and lists the matrix's own runs of the same path beside it.  :func:`update_doc`
rewrites only what lies between the ``BEGIN``/``END`` markers of ``docs/performance.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["BEGIN", "END", "LARGE_TARGET_ROUNDS", "TARGETS", "TARGET_ROUNDS", "Measured", "Target",
           "generated_part", "print_table", "tables", "targets", "update_doc"]

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- BEGIN GENERATED (bench/run_matrix.py) -->", "<!-- END GENERATED -->"

TARGET_ROUNDS = 3  # the target configurations run this many times, interleaved; the median counts
LARGE_TARGET_ROUNDS = 5  # the 10 KiB page-cache targets, whose rounds scatter most


class Target(NamedTuple):
    """A goal the matrix checks: ``measured`` must be at least (``higher_is_better``) or at most ``goal``."""

    key: str
    what: str
    goal: float
    unit: str
    higher_is_better: bool

    def met(self, measured: float | None) -> bool | None:
        """Whether ``measured`` meets the goal; None without a figure."""
        if measured is None:
            return None
        return measured >= self.goal if self.higher_is_better else measured <= self.goal


TARGETS = (
    Target("send_100b", "produce 100 B, send(), 1 producer, 1 partition, acks=1", 2_000_000, "records/s",
           True),
    Target("send_many_100b", "produce 100 B, send_many()", 5_000_000, "records/s", True),
    Target("consume_local", "consume 100 B, local mmap (poll_batch)", 3_000_000, "records/s", True),
    Target("consume_tcp", "consume 100 B over TCP (poll_batch)", 2_000_000, "records/s", True),
    Target("e2e_p99", "produce-to-consume p99 at 100,000 records/s", 1.0, "ms", False),
    Target("large_send", "10 KiB records, send(): share of page-cache write", 0.7, "ratio", True),
    Target("large_send_many", "10 KiB records, send_many(): share of page-cache write", 0.7, "ratio", True),
    Target("replication", "follower catch-up: share of loopback sendfile", 0.7, "ratio", True),
    Target("acks_all", "acks=all / acks=1 throughput (2 followers, 100 B)", 0.5, "ratio", True),
)


class Measured(NamedTuple):
    """A target's figures: its rounds (the median counts), the matrix's other runs of the same path, and
    why there is no figure when there is none."""

    rounds: list[float]
    other_runs: list[float]
    note: str = ""


# -- targets ----------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets table: each target's median of its rounds, whether it is met, the other runs listed."""
    measured = {**_produce_measured(results), **_other_measured(results)}
    out = []
    for target in TARGETS:
        figures = measured[target.key]
        value = _median(figures.rounds)
        out.append({"key": target.key, "what": target.what, "goal": target.goal, "unit": target.unit,
                    "measured": value, "met": target.met(value), "rounds": figures.rounds,
                    "other_runs": figures.other_runs, "note": figures.note})
    return out


def _produce_measured(results: dict[str, Any]) -> dict[str, Measured]:
    """The produce targets: the target rounds and the matrix's runs of the same configuration."""
    rounds, matrix = results["targets"], results["produce"]
    base = {"partitions": 1, "producers": 1, "acks": "1", "compression": "none"}

    def of(rows: list[dict[str, Any]], pick: Any, **want: Any) -> list[float]:
        return [pick(r) for r in rows if all(r["config"].get(k) == v for k, v in {**base, **want}.items())]

    def rate(r: dict[str, Any]) -> float:
        return float(r["records_per_s"])

    def page_cache(r: dict[str, Any]) -> float:
        return float(r["ratios"]["page_cache_write"])

    return {
        "send_100b": Measured(of(rounds, rate, record_size=100, api="send"),
                              of(matrix, rate, record_size=100, api="send")),
        "send_many_100b": Measured(of(rounds, rate, record_size=100, api="send_many"),
                                   of(matrix, rate, record_size=100, api="send_many")),
        "large_send": Measured(of(rounds, page_cache, record_size=10240, api="send"),
                               of(matrix, page_cache, record_size=10240, api="send")),
        "large_send_many": Measured(of(rounds, page_cache, record_size=10240, api="send_many"),
                                    of(matrix, page_cache, record_size=10240, api="send_many")),
    }


def _other_measured(results: dict[str, Any]) -> dict[str, Measured]:
    """The latency, consume, catch-up and acks targets."""
    measured = {"e2e_p99": Measured([r["latency_ms"]["p99"] for r in results["e2e_targets"]],
                                    [r["latency_ms"]["p99"] for r in results["e2e"]
                                     if r["config"]["throughput"] == 100_000])}
    for key, transport in (("consume_local", "shm"), ("consume_tcp", "tcp")):
        runs = [r["records_per_s"] for r in results["consume"] if r["config"]["transport"] == transport]
        measured[key] = Measured(runs, [])
    rep = results.get("replicate")
    measured["replication"] = Measured([rep["ratios"]["loopback_sendfile"]] if rep and rep.get("ratios")
                                       else [], [])
    acks = rep["extra"]["acks"] if rep else None
    acks_rounds = [r["ratio"] for r in results.get("acks_targets") or [] if r.get("replication_available")]
    if acks_rounds:
        same_path = [acks["ratio"]] if acks and acks.get("replication_available") else []
        measured["acks_all"] = Measured(acks_rounds, same_path)
    else:
        measured["acks_all"] = Measured([], [], "not measurable: no topic with followers"
                                        + (f" ({acks['why_not']})" if acks and acks.get("why_not") else ""))
    return measured


# -- the generated part of docs/performance.md ------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "records/s":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:.3f}"
    return f"{value:.3f}"


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def tables(results: dict[str, Any]) -> str:
    """The Markdown tables of docs/performance.md's generated part."""
    sections = (_targets_table, _produce_table, _e2e_table, _consume_replicate_table, _partitions_table,
                _recovery_table)
    return "\n".join(line for section in sections for line in section(results))


def _targets_table(results: dict[str, Any]) -> list[str]:
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
    return lines


def _produce_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "### Produce matrix", "",
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
    return lines


def _e2e_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "### Produce-to-consume latency (100 B, 1 partition, linger.ms=0, local consumer)", "",
             "| offered records/s | achieved | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results["e2e"]:
        lat = r["latency_ms"]
        lines.append(f"| {r['config']['throughput']:,.0f} | {r['records_per_s']:,.0f} | {lat['p50']:.3f} | "
                     f"{lat['p95']:.3f} | {lat['p99']:.3f} | {lat['p99_9']:.3f} | {lat['max']:.3f} |")
    return lines


def _consume_replicate_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "### Consume and replicate", "",
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
    return lines


def _partitions_table(results: dict[str, Any]) -> list[str]:
    part = results.get("partitions")
    if not part:
        return []
    lines = ["", "### Partitions 1 -> 256 (send_many, 100 B)", "",
             "| partitions | records/s | MB/s | serve ready s | USS supervisor + writers MiB "
             "| per writer MiB |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in part["rows"]:
        lines.append(f"| {row['partitions']} | {row['records_per_s']:,.0f} | {row['mb_per_s']:,.1f} | "
                     f"{row['serve_ready_s']:.2f} | {row['supervisor_and_writers_uss_mib']:,.1f} | "
                     f"{row['uss_per_writer_mib']:.2f} |")
    return lines


def _recovery_table(results: dict[str, Any]) -> list[str]:
    rec = results.get("recovery")
    if not rec:
        return []
    lines = ["", "### Restart and recovery as the log grows (one partition)", "",
             "| segments | log GiB | crash: restart s | crash: recovery ms | clean stop s "
             "| clean restart s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rec["rows"]:
        lines.append(f"| {row['segments']} | {row['log_gib']:.3f} | {row['crash_restart_s']:.2f} | "
                     f"{row['crash_recovery_ms']} | {row['clean_stop_s']:.2f} | "
                     f"{row['clean_restart_s']:.2f} |")
    return lines


def generated_part(results: dict[str, Any], images: list[str], command: str) -> str:
    """The text between the markers: what ran where, the limits, the tables, failed parts, the plots."""
    body = [BEGIN, "",
            f"Generated by `{command}` on {results['date']} (commit `{results['git_commit']}`, "
            f"{results['host']['cpus']} cores, Python {results['host']['python']}); "
            f"{results['seconds'] / 60:.1f} minutes in all.  Raw figures: `{results['results_file']}`.  "
            f"The machine was shared: 1-minute load average {results['host']['loadavg_1m_at_start']:.1f} at "
            f"the start, a median of {results['host']['loadavg_1m_median_of_runs']:.1f} at the end of the "
            f"runs (2 means both cores busy).", ""]
    body += _limits_paragraph(results)
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
    return "\n".join(body)


def _limits_paragraph(results: dict[str, Any]) -> list[str]:
    """The medians of the produce runs' limits, and a blank line; nothing without limits."""
    limits = [r["limits"] for r in results["produce"] if r.get("limits")]
    if not limits:
        return []
    med = {k: sorted(x[k] for x in limits)[len(limits) // 2] for k in
           ("memcpy_mb_per_s", "page_cache_write_mb_per_s", "loopback_sendfile_mb_per_s")}
    return [f"Limits (medians over the produce runs; page-cache write is the faster of the two "
            f"probes right before and right after each run, with its bytes): memcpy "
            f"{med['memcpy_mb_per_s']:,.0f} MB/s, page-cache write "
            f"{med['page_cache_write_mb_per_s']:,.0f} MB/s, loopback sendfile "
            f"{med['loopback_sendfile_mb_per_s']:,.0f} MB/s.", ""]


def update_doc(results: dict[str, Any], images: list[str], command: str, doc: Path = DOC) -> None:
    """Replace the generated part of ``doc`` (appended when it has no markers)."""
    generated = generated_part(results, images, command)
    text = doc.read_text() if doc.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated + tail
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    doc.write_text(text)


# -- the console ------------------------------------------------------------------------------------------


def print_table(results: dict[str, Any]) -> None:
    """The targets and the produce runs, briefly, on stdout."""
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
