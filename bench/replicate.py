"""``appliance bench replicate``: follower catch-up against loopback sendfile, and acks=all against acks=1.

Two measurements (issue 5's benchmarks):

1. **Catch-up.**  A topic is filled with ``--records`` records (``send_many``, untimed), in batches as a
   producer streaming records makes them: every one ``batch.size`` full (each ``send_many`` call is the
   records one batch holds, see :func:`fill_full_batches`).  Then a follower -- a forked process running
   ``replicas.fetcher.PartitionFetcher`` per partition, the very code ``appliance replica`` runs: Fetch
   with its replica id from its log end offset, the leader's broker answers with ``sendfile`` from the
   segment files, CRCs checked, ``Log.append_as_follower`` into its own log in another directory -- copies
   the whole log, from empty until its log end offsets equal the leader's.  Bytes/s of log copied, against
   a plain loopback ``sendfile`` of the same segment files (the ``loopback_sendfile`` limit of this
   command), in ``CATCH_UP_ROUNDS`` rounds, each a ``sendfile`` then a catch-up into a fresh directory; the
   figures are the round whose ratio is the median (``bench/test_bench_replication.py`` takes the median of
   its rounds' ratios too); every round is in ``extra.catch_up_rounds``.  ``replica.fetch.max.bytes`` is
   Kafka's 1 MiB unless ``--producer-prop replica.fetch.max.bytes=N`` says otherwise.  With
   ``--recycle-pages`` each catch-up starts right after ``perf_limits.recycle_pages`` of the log's size
   (the ``sendfile`` limit writes no page cache at all, so on a virtual machine that hands free pages back
   to its host, a follower writing into pages the host must fault in first pays ~2.5 ns per byte the limit
   never pays; ``make bench`` sets it).
   The leader's batches are counted in the output (``leader_batches``, ``leader_batch_bytes_median``).

   Why full batches: the topic used to be filled by calls of ``batch.size // record size`` records (1024
   of 1 KiB), of which one ``batch.size`` batch holds 1011, so the log alternated batches of 1,045,371
   and 13,490 bytes.  A 1 MiB Fetch takes whole batches up to 1 MiB, so every second Fetch carried one
   13 KB batch: twice the fetches, and the leader's turnaround (~0.3-0.4 ms a Fetch: wake, read,
   ``sendfile``) bared once more per MiB, since fetching ahead overlaps it only with the append of the
   answer before.  On 500,000 x 1 KiB records, this forked follower, ``--recycle-pages``, 3 alternating
   rounds (load ~1.8): that log 0.38-0.62 of ``sendfile``, blocked 17-24% of the time, 0.65-0.73 s of CPU
   per GB; full batches of the same records 0.66-0.81, blocked 3-6%, 0.50-0.55 s/GB.  A producer streaming
   records fills each batch; ``bench/test_bench_replication.py`` writes ~55 KB batches, nineteen to a
   1 MiB Fetch.  The output gives the follower's shares of the time runnable but not running (a busy
   machine) and blocked (waiting for the leader), from ``/proc/self/task/<tid>/schedstat``.

2. **acks=all vs acks=1.**  Two produce runs of ``--records`` records (``appliance bench produce``'s path),
   one per setting, to one topic with ``--followers`` followers (replication factor followers + 1,
   ``min.insync.replicas`` 2), measured once every follower is in the ISR.  The followers are the replica
   processes of the appliance used (``appliance.replica.dirs``); when it has fewer, a second appliance with
   that many replica dirs is started for these two runs.  When no follower joins (replication not built or
   broken in this tree), both runs go to a topic without followers and the output says so: the ratio then
   compares a path with itself.  With ``--recycle-pages`` each run starts right after ``recycle_pages`` of
   what the leader and its followers will write.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from appliance.client.accumulator import RECORD_ESTIMATE_BYTES
from bench.harness import Appliance, topic_name
from bench.limits import Limits, loopback_sendfile, measure_limits, recycle_pages
from bench.produce import ProduceSettings, payload_pool, produce_into, producer_settings, run_produce
from bench.stats import Progress, latency_summary, make_result, profiled, thread_schedstat
from storage.batch_header import BATCH_LENGTH_OFFSET, LOG_OVERHEAD
from storage.errors import ApplianceError
from storage.log_config import LogConfig

__all__ = ["acks_comparison", "batch_sizes", "catch_up", "fill_full_batches", "replica_children",
           "replicated_topic", "run_replicate"]

DEFAULT_FETCH_MAX_BYTES = 1_048_576  # Kafka's replica.fetch.max.bytes
CATCH_UP_TIMEOUT_S = 600.0
CATCH_UP_ROUNDS = 3  # each: loopback sendfile, recycle_pages, catch-up; the figure is the median round
ISR_WAIT_S = 30.0  # for followers to join a new topic's ISR


def fill_full_batches(app: Appliance, settings: ProduceSettings, topic: str) -> None:
    """Produce ``settings.records`` records into ``topic`` (send_many, acks=1, untimed), each call the records
    one ``batch.size`` batch holds (the producer's own room and per-record bound, for a topic of default
    ``max.message.bytes``), the payload pool a whole number of calls: every batch full but the last."""
    from appliance.client.producer import Producer

    local = replace(settings, transport="shm", acks="1", api="send_many")
    config = producer_settings(local, app, None)
    batch_bytes = settings.batch_size or 1_048_576
    pool = payload_pool(local, batch_bytes)
    with Producer(config) as producer:
        room_bytes = producer.config.batch_room(LogConfig().max_message_bytes)  # a topic's default
        per_batch = max(1, room_bytes // (settings.record_size + RECORD_ESTIMATE_BYTES))
        if len(pool) > per_batch:
            pool = pool[: len(pool) // per_batch * per_batch]
        produce_into(producer, topic, pool, settings.records, api="send_many",
                     batch_bytes=per_batch * settings.record_size)


def batch_sizes(paths: list[str]) -> list[int]:
    """Bytes of each batch in the segment files (headers only; a torn tail ends a file's walk)."""
    sizes = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            end, position = os.fstat(fd).st_size, 0
            while position + LOG_OVERHEAD <= end:
                length = int.from_bytes(os.pread(fd, 4, position + BATCH_LENGTH_OFFSET), "big")
                if length <= 0 or position + LOG_OVERHEAD + length > end:
                    break
                sizes.append(LOG_OVERHEAD + length)
                position += LOG_OVERHEAD + length
        finally:
            os.close(fd)
    return sizes


def _follow(directory: str, topic: str, partitions: int, leader: tuple[str, int, int, list[int]],
            targets: list[int], fetch_max_bytes: int, counter: Any, pipe: Any, profile: str | None) -> None:
    """A follower process: fetch every partition until it holds ``targets`` records; report timings."""
    from replicas.fetcher import FetcherConfig, PartitionFetcher
    from replicas.leader_connection import LeaderInfo
    from storage.log import Log

    host, port, leader_id, epochs = leader
    logs = []
    fetchers = []
    try:
        config = FetcherConfig(broker_id=1000 + os.getpid() % 1000, replica_fetch_max_bytes=fetch_max_bytes,
                               replica_fetch_wait_max_ms=100, replica_fetch_backoff_ms=50)
        for partition in range(partitions):
            log = Log.open(os.path.join(directory, f"{topic}-{partition}"),
                           topic_partition=(topic, partition))
            logs.append(log)
            leader_info = LeaderInfo(host, port, leader_id, epochs[partition])
            fetchers.append(PartitionFetcher(log, leader_info, config))
        for fetcher in fetchers:  # connect and settle the truncation phase before the clock starts
            while fetcher.phase.value != "fetching":
                outcome = fetcher.step()
                if outcome.backoff_ms:
                    time.sleep(outcome.backoff_ms / 1000)
        pipe.send(("ready", None))
        pipe.recv()
        profiler = profiled(profile)
        profiler.__enter__()
        cpu = time.process_time_ns()
        on_cpu, waiting = thread_schedstat()
        start = time.monotonic_ns()
        deadline = start + int(CATCH_UP_TIMEOUT_S * 1e9)
        pending = set(range(partitions))
        last_error = ""
        while pending:
            for partition in list(pending):
                fetcher = fetchers[partition]
                outcome = fetcher.step()
                if outcome.action == "backoff":
                    last_error = outcome.detail
                    time.sleep(outcome.backoff_ms / 1000)
                if fetcher.log_end_offset >= targets[partition]:
                    pending.discard(partition)
            counter.value = sum(f.log_end_offset for f in fetchers)
            if time.monotonic_ns() > deadline:
                raise ApplianceError(
                    f"follower not caught up after {CATCH_UP_TIMEOUT_S:.0f} s ({last_error})")
        end = time.monotonic_ns()
        on_cpu_after, waiting_after = thread_schedstat()
        profiler.__exit__(None, None, None)
        copied = sum(segment.size_bytes for log in logs for segment in log.segments)
        runnable_ns = waiting_after - waiting
        blocked_ns = max(0, end - start - (on_cpu_after - on_cpu) - runnable_ns)
        pipe.send(("done", (start, end, time.process_time_ns() - cpu, copied, runnable_ns, blocked_ns)))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for fetcher in fetchers:
            fetcher.close()
        for log in logs:
            log.close()
        pipe.close()


def catch_up(app: Appliance, topic: str, fetch_max_bytes: int, progress: Progress | None,
             profile: str | None = None) -> tuple[float, int, int, int, float, float]:
    """A follower copies ``topic`` from empty; (seconds, log bytes copied, records, follower CPU ns, share of
    the time its thread was runnable but not running, share it was blocked: waiting for the leader)."""
    host, port_text = app.require_bootstrap().rsplit(":", 1)
    with app.client() as client:
        metadata = client.metadata([topic])
    info = metadata.topics[topic]
    targets = [p.log_end_offset for p in info.partitions]
    epochs = [p.leader_epoch for p in info.partitions]
    follower_dir = tempfile.mkdtemp(prefix="la-perf-follower-", dir=app.data_dir.parent)
    context = multiprocessing.get_context("fork")
    counter = context.RawValue("q", 0)
    parent, child = context.Pipe()
    process = context.Process(target=_follow, daemon=True, args=(
        follower_dir, topic, len(targets), (host, int(port_text), metadata.node_id, epochs), targets,
        fetch_max_bytes, counter, child, profile))
    process.start()
    child.close()
    try:
        kind, payload = parent.recv()
        if kind != "ready":
            raise ApplianceError(f"the follower failed to start: {payload}")
        parent.send("go")
        while not parent.poll(0.05):
            if progress is not None:
                progress.update(counter.value)
            if not process.is_alive():
                break
        kind, payload = parent.recv()
        if kind != "done":
            raise ApplianceError(f"the follower failed: {payload}")
        start, end, cpu_ns, copied, runnable_ns, blocked_ns = payload
        elapsed_ns = max(end - start, 1)
        return ((end - start) / 1e9, copied, sum(targets), cpu_ns, runnable_ns / elapsed_ns,
                blocked_ns / elapsed_ns)
    finally:
        parent.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
        shutil.rmtree(follower_dir, ignore_errors=True)


def _isr_sizes(app: Appliance, topic: str) -> list[int]:
    reply = _raw_metadata(app, topic)
    return [len(p.get("isr", [0])) for p in reply["partitions"]]


def _raw_metadata(app: Appliance, topic: str) -> dict[str, Any]:
    with app.client() as client:
        reply = client.request({"op": "metadata", "topics": [topic]})
    topics = reply["topics"]
    found = topics[topic] if isinstance(topics, dict) else next(t for t in topics if t["name"] == topic)
    return dict(found)


def replica_children(app: Appliance) -> int:
    """How many replica processes the appliance runs (extra children named ``replica-N``)."""
    with app.client() as client:
        status = client.status()
    return sum(1 for child in status.get("children", []) if str(child.get("name", "")).startswith("replica-")
               and child.get("pid"))


def replicated_topic(app: Appliance, partitions: int, followers: int, *, wait_s: float = ISR_WAIT_S) -> str:
    """A fresh topic with ``followers`` followers (``min.insync.replicas`` 2), once every follower is in
    its ISR; ApplianceError saying why not (refused, or the ISR never filled)."""
    name = topic_name()
    with app.client() as client:
        client.create_topic(name, partitions, replication_factor=followers + 1,
                            configs={"min.insync.replicas": min(2, followers + 1)})
    deadline = time.monotonic() + wait_s
    while True:
        sizes = _isr_sizes(app, name)
        if min(sizes) >= followers + 1:
            return name
        if time.monotonic() > deadline:
            app.delete_topic(name)
            raise ApplianceError(
                f"the followers did not join the ISR within {wait_s:.0f} s (ISR sizes {sizes})")
        time.sleep(0.1)


def run_replicate(app: Appliance, settings: ProduceSettings, *, followers: int = 2, progress: bool = False,
                  bootstrap: str | None = None, keep_topic: bool = False) -> dict[str, Any]:
    started_at = time.time()
    notes: list[str] = []
    if bootstrap:
        app.bootstrap = bootstrap
    props = dict(settings.producer_props)
    fetch_max_bytes = int(props.pop("replica.fetch.max.bytes", DEFAULT_FETCH_MAX_BYTES))
    settings = replace(settings, producer_props=tuple(props.items()))
    topic = settings.topic or topic_name()
    fresh = settings.topic is None
    app.create_topic(topic, settings.partitions)
    limits: Limits | None = None
    try:
        fill_full_batches(app, settings, topic)
        segments = _segment_paths(app, topic)
        log_bytes = sum(os.path.getsize(p) for p in segments)
        leader_batches = batch_sizes(segments)
        if settings.measure_limits:
            limits = measure_limits(app.data_dir, log_bytes)
            os.sync()
        line = Progress(settings.records, settings.record_size, enabled=progress, label="catch-up: ")
        rounds = []
        for index in range(CATCH_UP_ROUNDS):
            sendfile_bytes_per_s = 0.0
            if limits is not None:
                sent, sendfile_s = loopback_sendfile(segments)  # the same bytes the follower will fetch
                sendfile_bytes_per_s = sent / sendfile_s
                limits.sendfile_probe_bytes = sent
            if settings.recycle_pages:  # the follower writes the log's size into its own page cache
                recycle_pages(log_bytes)
            last = index == CATCH_UP_ROUNDS - 1
            rounds.append((*catch_up(app, topic, fetch_max_bytes, line if index == 0 else None,
                                     settings.profile if last else None), sendfile_bytes_per_s))
            if index == 0:
                line.finish()
    finally:
        if limits is not None:
            limits.remove_probe_files()
        if fresh and not keep_topic:
            app.delete_topic(topic)
    # the round of the median ratio to its own sendfile (of the median time without limits)
    key = (lambda r: r[1] / r[0] / r[6]) if limits is not None else (lambda r: -r[0])
    seconds, copied, records, follower_cpu, runnable_share, blocked_share, sendfile_bytes_per_s = sorted(
        rounds, key=key)[len(rounds) // 2]
    if limits is not None:
        limits.loopback_sendfile_bytes_per_s = sendfile_bytes_per_s
    acks = acks_comparison(app, settings, followers, notes)
    extra: dict[str, Any] = {
        "topic": topic, "log_bytes": log_bytes, "copied_bytes": copied,
        "replica_fetch_max_bytes": fetch_max_bytes, "leader_batches": len(leader_batches),
        "leader_batch_bytes_median": int(statistics.median(leader_batches)) if leader_batches else 0,
        "follower_cpu_ns_per_record": round(follower_cpu / max(records, 1), 1),
        "follower_cpu_s_per_gb": round(follower_cpu / max(copied, 1), 3),
        "follower_runnable_share": round(runnable_share, 3),
        "follower_blocked_share": round(blocked_share, 3),
        "catch_up_rounds": [
            {"catch_up_mb_per_s": round(r[1] / r[0] / 1e6, 1), "sendfile_mb_per_s": round(r[6] / 1e6, 1),
             "ratio": round(r[1] / r[0] / r[6], 4) if r[6] else None,
             "follower_cpu_s_per_gb": round(r[3] / max(r[1], 1), 3), "runnable_share": round(r[4], 3),
             "blocked_share": round(r[5], 3)} for r in rounds],
        "payload_mb_per_s": round(records * settings.record_size / seconds / 1e6, 2),
        "acks": acks,
    }
    notes.insert(0, "catch-up: a follower process (replicas.fetcher.PartitionFetcher per partition, as "
                    "`appliance replica` runs) copied the log from empty; bytes are log bytes; the "
                    "loopback_sendfile limit is a plain sendfile of the same segment files, measured "
                    f"before each of {CATCH_UP_ROUNDS} rounds; the figures are the round of the median "
                    "ratio")
    result = make_result("replicate", records=records, payload_bytes=copied, seconds=seconds,
                         latency=latency_summary([], "none"), config={**settings.as_json(),
                                                                       "followers": followers},
                         limits=limits, primary_limit="loopback_sendfile", extra=extra, notes=notes,
                         started_at=started_at)
    result["extra"]["acks_all_to_acks_1"] = acks.get("ratio")
    return result


def acks_comparison(app: Appliance, settings: ProduceSettings, followers: int, notes: list[str]
                     ) -> dict[str, Any]:
    """Two produce runs, acks=1 then acks=all, on a topic with ``followers`` followers in its ISR: on
    ``app`` when it runs that many replica processes, else on an appliance started here with
    ``appliance.replica.dirs``.  Without replication, both on a topic without followers (and a note)."""
    target: Appliance | None = None
    started: Appliance | None = None
    replica_root: Path | None = None
    why = ""
    try:
        if replica_children(app) >= followers:
            target = app
        else:
            replica_root = Path(tempfile.mkdtemp(prefix="la-perf-replicas-"))
            dirs = ", ".join(f'"{replica_root / f"replica-{i}"}"' for i in range(followers))
            started = Appliance.start(None, overrides=[f"appliance.replica.dirs=[{dirs}]"])
            if replica_children(started) >= followers:
                target = started
            else:
                why = "appliance serve started no replica processes for appliance.replica.dirs"
    except ApplianceError as exc:
        why = str(exc)
    runs: dict[str, Any] = {}
    try:
        topic = None
        if target is not None:
            try:
                topic = replicated_topic(target, settings.partitions, followers)
            except ApplianceError as exc:
                why = str(exc)
        for acks in ("1", "all"):
            props = (*settings.producer_props, ("delivery.timeout.ms", "30000"))
            run_settings = replace(settings, acks=acks, topic=topic, measure_limits=False, profile=None,
                                   producer_props=props, recycle_pages=False)
            if settings.recycle_pages:  # the leader and every follower write the run's volume
                recycle_pages(settings.records * settings.record_size * (1 + (followers if topic else 0)))
            result = run_produce(target if topic is not None and target is not None else app, run_settings)
            runs[acks] = {"records_per_s": result["records_per_s"], "mb_per_s": result["mb_per_s"],
                          "latency_ms": result["latency_ms"], "errors": result["extra"]["errors"],
                          "notes": result["notes"]}
        if topic is not None and target is not None:
            target.delete_topic(topic)
    finally:
        if started is not None:
            started.close()
        if replica_root is not None:
            shutil.rmtree(replica_root, ignore_errors=True)
    ratio = round(runs["all"]["records_per_s"] / max(runs["1"]["records_per_s"], 1e-9), 4)
    available = topic is not None
    out = {"followers": followers if available else 0, "replication_available": available,
           "acks_1": runs["1"], "acks_all": runs["all"], "ratio": ratio}
    if not available:
        out["why_not"] = why
        notes.append(f"replication is not available here ({why}): acks=all and acks=1 both ran on a topic "
                     f"without followers (the ratio {ratio} compares a path with itself)")
    elif runs["all"]["errors"]:
        notes.append(f"acks=all: {runs['all']['errors']} sampled sends failed: {runs['all']['notes']}")
    return out


def _segment_paths(app: Appliance, topic: str) -> list[str]:
    paths = []
    for part in app.topic(topic).partitions:
        paths += sorted(str(p) for p in Path(part.directory).glob("*.log"))
    return paths
