"""``appliance bench replicate``: follower catch-up against loopback sendfile, and acks=all against acks=1.

Two measurements (issue 5's benchmarks):

1. **Catch-up.**  A topic is filled with ``--records`` records (``send_many``, untimed).  Then a follower --
   a forked process running ``replicas.fetcher.PartitionFetcher`` per partition, the very code ``appliance
   replica`` runs: Fetch with its replica id from its log end offset, the leader's broker answers with
   ``sendfile`` from the segment files, CRCs checked, ``Log.append_as_follower`` into its own log in another
   directory -- copies the whole log, from empty until its log end offsets equal the leader's.  Bytes/s of log
   copied, against a plain loopback ``sendfile`` of the same segment files measured in the same run (the
   ``loopback_sendfile`` limit of this command).  ``replica.fetch.max.bytes`` is Kafka's 1 MiB unless
   ``--producer-prop replica.fetch.max.bytes=N`` says otherwise.

2. **acks=all vs acks=1.**  Two produce runs of ``--records`` records (``appliance bench produce``'s path),
   one per setting, to a topic with ``--followers`` followers (replication factor followers + 1,
   ``min.insync.replicas`` 2) on an appliance that runs replicas (``appliance.replica.dirs``).  When this tree
   cannot create such a topic (replication not wired into ``appliance serve`` yet), the runs go to a topic
   without followers and the output says so: the ratio then measures nothing but noise around 1.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from appliance.perf_consume import fill_topic
from appliance.perf_limits import Limits, loopback_sendfile, measure_limits
from appliance.perf_produce import ProduceSettings, run_produce
from appliance.perf_server import Appliance, topic_name
from appliance.perf_stats import Progress, latency_summary, make_result
from storage.errors import ApplianceError

__all__ = ["catch_up", "replication_status", "run_replicate"]

DEFAULT_FETCH_MAX_BYTES = 1_048_576  # Kafka's replica.fetch.max.bytes
CATCH_UP_TIMEOUT_S = 600.0


def _follow(directory: str, topic: str, partitions: int, leader: tuple[str, int, int, list[int]],
            targets: list[int], fetch_max_bytes: int, counter: Any, pipe: Any) -> None:
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
        cpu = time.process_time_ns()
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
        copied = sum(segment.size_bytes for log in logs for segment in log.segments)
        pipe.send(("done", (start, end, time.process_time_ns() - cpu, copied)))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for fetcher in fetchers:
            fetcher.close()
        for log in logs:
            log.close()
        pipe.close()


def catch_up(app: Appliance, topic: str, fetch_max_bytes: int, progress: Progress | None
             ) -> tuple[float, int, int, int]:
    """A follower copies ``topic`` from empty; (seconds, log bytes copied, records, follower CPU ns)."""
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
        fetch_max_bytes, counter, child))
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
        start, end, cpu_ns, copied = payload
        return (end - start) / 1e9, copied, sum(targets), cpu_ns
    finally:
        parent.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
        shutil.rmtree(follower_dir, ignore_errors=True)


def replication_status(app: Appliance, followers: int) -> tuple[bool, str]:
    """Whether ``app`` can hold a topic with ``followers`` followers (creates and deletes a probe topic)."""
    name = topic_name("perf-rf-probe")
    try:
        with app.client() as client:
            client.create_topic(name, 1, replication_factor=followers + 1,
                                configs={"min.insync.replicas": min(2, followers + 1)})
    except ApplianceError as exc:
        return False, str(exc)
    app.delete_topic(name)
    return True, ""


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
        fill_topic(app, settings, topic)
        segments = _segment_paths(app, topic)
        log_bytes = sum(os.path.getsize(p) for p in segments)
        if settings.measure_limits:
            limits = measure_limits(app.data_dir, log_bytes)
            sent, seconds = loopback_sendfile(segments)  # the same bytes the follower will fetch
            limits.loopback_sendfile_bytes_per_s = sent / seconds
            limits.sendfile_probe_bytes = sent
            os.sync()
        line = Progress(settings.records, settings.record_size, enabled=progress, label="catch-up: ")
        seconds, copied, records, follower_cpu = catch_up(app, topic, fetch_max_bytes, line)
        line.finish()
    finally:
        if limits is not None:
            limits.remove_probe_files()
        if fresh and not keep_topic:
            app.delete_topic(topic)
    acks = _acks_comparison(app, settings, followers, notes)
    extra: dict[str, Any] = {
        "topic": topic, "log_bytes": log_bytes, "copied_bytes": copied,
        "replica_fetch_max_bytes": fetch_max_bytes,
        "follower_cpu_ns_per_record": round(follower_cpu / max(records, 1), 1),
        "payload_mb_per_s": round(records * settings.record_size / seconds / 1e6, 2),
        "acks": acks,
    }
    notes.insert(0, "catch-up: a follower process (replicas.fetcher.PartitionFetcher per partition, as "
                    "`appliance replica` runs) copied the log from empty; bytes are log bytes; the "
                    "loopback_sendfile limit is a plain sendfile of the same segment files")
    result = make_result("replicate", records=records, payload_bytes=copied, seconds=seconds,
                         latency=latency_summary([], "none"), config={**settings.as_json(),
                                                                       "followers": followers},
                         limits=limits, primary_limit="loopback_sendfile", extra=extra, notes=notes,
                         started_at=started_at)
    result["extra"]["acks_all_to_acks_1"] = acks.get("ratio")
    return result


def _acks_comparison(app: Appliance, settings: ProduceSettings, followers: int, notes: list[str]
                     ) -> dict[str, Any]:
    """Two produce runs, acks=1 then acks=all, on a topic with followers if this tree can make one."""
    ok, why = replication_status(app, followers)
    target = app
    started: Appliance | None = None
    if not ok and app.owned:
        dirs = [str(app.data_dir.parent / f"replica-{i}") for i in range(followers)]
        try:
            started = Appliance.start(None, overrides=[f"appliance.replica.dirs={dirs!r}".replace("'", '"')])
            ok, why = replication_status(started, followers)
            target = started
        except ApplianceError as exc:
            why = f"{why}; with appliance.replica.dirs: {exc}"
            ok = False
    try:
        runs: dict[str, Any] = {}
        for acks in ("1", "all"):
            run_settings = replace(settings, acks=acks, topic=None, measure_limits=False)
            if ok:
                run_settings = replace(run_settings, producer_props=settings.producer_props)
            result = _produce_run(target, run_settings, followers if ok else 0)
            runs[acks] = {"records_per_s": result["records_per_s"], "mb_per_s": result["mb_per_s"],
                          "latency_ms": result["latency_ms"]}
        ratio = round(runs["all"]["records_per_s"] / max(runs["1"]["records_per_s"], 1e-9), 4)
        out = {"followers": followers if ok else 0, "replication_available": ok, "acks_1": runs["1"],
               "acks_all": runs["all"], "ratio": ratio}
        if not ok:
            out["why_not"] = why
            notes.append(f"replication is not available in this tree ({why}): acks=all and acks=1 both ran "
                         f"on a topic without followers (the ratio {ratio} compares a path with itself)")
        return out
    finally:
        if started is not None:
            started.close()


def _produce_run(app: Appliance, settings: ProduceSettings, followers: int) -> dict[str, Any]:
    if followers == 0:
        return run_produce(app, settings)
    name = topic_name()
    with app.client() as client:
        client.create_topic(name, settings.partitions, replication_factor=followers + 1,
                            configs={"min.insync.replicas": min(2, followers + 1)})
    try:
        return run_produce(app, replace(settings, topic=name))
    finally:
        app.delete_topic(name)


def _segment_paths(app: Appliance, topic: str) -> list[str]:
    paths = []
    for part in app.topic(topic).partitions:
        paths += sorted(str(p) for p in Path(part.directory).glob("*.log"))
    return paths
