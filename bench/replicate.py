"""``appliance bench replicate``: follower catch-up against loopback sendfile, and acks=all against acks=1.

Two measurements:

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
   ``--recycle-pages`` each catch-up starts right after ``bench.limits.recycle_pages`` of the log's size:
   the ``sendfile`` limit writes no page cache at all, while the follower writes the log's size into its
   own, and on a virtual machine that hands free pages back to its host, pages the host must fault in
   first cost the follower what the limit never pays (``make bench`` sets it).

   Why full batches: a Fetch takes whole batches up to ``replica.fetch.max.bytes``, so a log whose
   neighbouring batches add up to just over it (a full batch, then a small one) costs a Fetch per batch,
   each one baring the leader's turnaround (wake, read, ``sendfile``) that fetching ahead overlaps only with
   the append of the answer before; a producer streaming records fills each batch
   (docs/performance.md gives the figures).  The leader's batches are counted in the output
   (``leader_batches``, ``leader_batch_bytes_median``), and so are the follower's shares of the time
   runnable but not running (a busy machine) and blocked (waiting for the leader), from
   ``/proc/self/task/<tid>/schedstat``.

2. **acks=all vs acks=1** (``bench.acks``): two produce runs, one per setting, to a topic with
   ``--followers`` followers in its ISR; under ``extra.acks``.

The catch-up's parts: :func:`run_replicate` fills the topic and reads the :class:`LeaderLog`;
:func:`_catch_up_rounds` runs the :class:`CatchUpSetup`'s rounds, each a :func:`catch_up`: a forked
follower process (:func:`_follow`) given a :class:`FollowerJob`, which reports a :class:`FollowerReport`.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from appliance.client.accumulator import RECORD_ESTIMATE_BYTES
from bench.acks import acks_comparison
from bench.harness import Appliance, topic_name
from bench.limits import loopback_sendfile, measure_limits, recycle_pages
from bench.produce import ProduceSettings, payload_pool, produce_into, producer_settings
from bench.stats import Progress, latency_summary, make_result, profiled, thread_schedstat
from storage.batch_header import BATCH_LENGTH_OFFSET, LOG_OVERHEAD
from storage.errors import ApplianceError
from storage.log_config import LogConfig

__all__ = ["CatchUp", "CatchUpRound", "CatchUpSetup", "FollowerJob", "FollowerReport", "LeaderLog",
           "batch_sizes", "catch_up", "fill_full_batches", "run_replicate"]

DEFAULT_FETCH_MAX_BYTES = 1_048_576  # Kafka's replica.fetch.max.bytes
CATCH_UP_TIMEOUT_S = 600.0
CATCH_UP_ROUNDS = 3  # each: loopback sendfile, recycle_pages, catch-up; the figure is the median round


@dataclass(frozen=True)
class FollowerJob:
    """What the follower process copies: ``topic``'s partitions from the broker at ``host:port`` (broker id
    ``leader_id``; partition ``i`` at leader epoch ``epochs[i]``) into ``directory``, until partition ``i``
    holds ``targets[i]`` records, ``fetch_max_bytes`` a Fetch; ``profile``: cProfile the copy into it."""

    directory: str
    topic: str
    host: str
    port: int
    leader_id: int
    epochs: list[int]
    targets: list[int]
    fetch_max_bytes: int
    profile: str | None = None


class FollowerReport(NamedTuple):
    """The follower process's copy: its start and end (``time.monotonic_ns``), its CPU time, the log bytes it
    holds, and the ns its thread was runnable but not running and blocked (waiting for the leader)."""

    start_ns: int
    end_ns: int
    cpu_ns: int
    copied_bytes: int
    runnable_ns: int
    blocked_ns: int


class CatchUp(NamedTuple):
    """One catch-up from empty: seconds, log bytes copied, records, the follower's CPU ns, and the shares of
    the time its thread was runnable but not running and blocked (waiting for the leader)."""

    seconds: float
    copied_bytes: int
    records: int
    cpu_ns: int
    runnable_share: float
    blocked_share: float

    @property
    def bytes_per_s(self) -> float:
        return self.copied_bytes / self.seconds


class CatchUpRound(NamedTuple):
    """A round: a loopback ``sendfile`` of the leader's segment files (0 bytes when limits are not measured),
    then a catch-up."""

    catch_up: CatchUp
    sendfile_bytes: int
    sendfile_bytes_per_s: float

    @property
    def ratio(self) -> float:
        """The catch-up's bytes/s as a share of the round's ``sendfile``."""
        return self.catch_up.bytes_per_s / self.sendfile_bytes_per_s

    def as_json(self) -> dict[str, Any]:
        done = self.catch_up
        return {"catch_up_mb_per_s": round(done.bytes_per_s / 1e6, 1),
                "sendfile_mb_per_s": round(self.sendfile_bytes_per_s / 1e6, 1),
                "ratio": round(self.ratio, 4) if self.sendfile_bytes_per_s else None,
                "follower_cpu_s_per_gb": round(done.cpu_ns / max(done.copied_bytes, 1), 3),
                "runnable_share": round(done.runnable_share, 3),
                "blocked_share": round(done.blocked_share, 3)}


@dataclass(frozen=True)
class LeaderLog:
    """The leader's copy of a topic: its segment files, their bytes, and each batch's size."""

    topic: str
    segments: list[str]
    log_bytes: int
    batch_sizes: list[int]

    @classmethod
    def of(cls, app: Appliance, topic: str) -> LeaderLog:
        segments = _segment_paths(app, topic)
        return cls(topic, segments, sum(os.path.getsize(p) for p in segments), batch_sizes(segments))


@dataclass(frozen=True)
class CatchUpSetup:
    """What every catch-up round of a run shares: the leader's log, the follower's Fetch size, whether to
    measure ``sendfile`` before each round and recycle pages before each catch-up, and the profile file of
    the last round."""

    leader: LeaderLog
    fetch_max_bytes: int
    measure_sendfile: bool
    recycle_pages: bool
    profile: str | None


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


# -- the follower process ---------------------------------------------------------------------------------


def _follow(job: FollowerJob, counter: Any, pipe: Any) -> None:
    """A follower process: a log and a fetcher per partition, settled, then ``ready``; on ``go`` fetch until
    every partition holds its target (records so far in ``counter``); report ``done`` with a
    :class:`FollowerReport` (or ``error``)."""
    logs: list[Any] = []
    fetchers: list[Any] = []
    try:
        _open_fetchers(job, logs, fetchers)
        for fetcher in fetchers:  # connect and settle the truncation phase before the clock starts
            while fetcher.phase.value != "fetching":
                outcome = fetcher.step()
                if outcome.backoff_ms:
                    time.sleep(outcome.backoff_ms / 1000)
        pipe.send(("ready", None))
        pipe.recv()
        pipe.send(("done", _timed_copy(job, logs, fetchers, counter)))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for fetcher in fetchers:
            fetcher.close()
        for log in logs:
            log.close()
        pipe.close()


def _open_fetchers(job: FollowerJob, logs: list[Any], fetchers: list[Any]) -> None:
    """Open the follower's log and fetcher of each partition into ``logs`` and ``fetchers`` (as they open, so
    the caller closes every one even when a later one fails)."""
    from replicas.fetcher import FetcherConfig, PartitionFetcher
    from replicas.leader_connection import LeaderInfo
    from storage.log import Log

    config = FetcherConfig(broker_id=1000 + os.getpid() % 1000, replica_fetch_max_bytes=job.fetch_max_bytes,
                           replica_fetch_wait_max_ms=100, replica_fetch_backoff_ms=50)
    for partition in range(len(job.targets)):
        log = Log.open(os.path.join(job.directory, f"{job.topic}-{partition}"),
                       topic_partition=(job.topic, partition))
        logs.append(log)
        leader = LeaderInfo(job.host, job.port, job.leader_id, job.epochs[partition])
        fetchers.append(PartitionFetcher(log, leader, config))


def _timed_copy(job: FollowerJob, logs: list[Any], fetchers: list[Any], counter: Any) -> FollowerReport:
    """Fetch until caught up, on the clock (and the profiler, when asked); the report."""
    with profiled(job.profile):
        cpu = time.process_time_ns()
        before = thread_schedstat()
        start = time.monotonic_ns()
        _fetch_until_caught_up(job, fetchers, counter, start)
        end = time.monotonic_ns()
        after = thread_schedstat()
    copied = sum(segment.size_bytes for log in logs for segment in log.segments)
    runnable_ns = after.waiting_ns - before.waiting_ns
    blocked_ns = max(0, end - start - (after.on_cpu_ns - before.on_cpu_ns) - runnable_ns)
    return FollowerReport(start, end, time.process_time_ns() - cpu, copied, runnable_ns, blocked_ns)


def _fetch_until_caught_up(job: FollowerJob, fetchers: list[Any], counter: Any, start_ns: int) -> None:
    """Step every fetcher not yet at its target, in turn, backing off when one says so; ApplianceError after
    ``CATCH_UP_TIMEOUT_S``."""
    deadline = start_ns + int(CATCH_UP_TIMEOUT_S * 1e9)
    pending = set(range(len(fetchers)))
    last_error = ""
    while pending:
        for partition in list(pending):
            fetcher = fetchers[partition]
            outcome = fetcher.step()
            if outcome.action == "backoff":
                last_error = outcome.detail
                time.sleep(outcome.backoff_ms / 1000)
            if fetcher.log_end_offset >= job.targets[partition]:
                pending.discard(partition)
        counter.value = sum(f.log_end_offset for f in fetchers)
        if time.monotonic_ns() > deadline:
            raise ApplianceError(f"follower not caught up after {CATCH_UP_TIMEOUT_S:.0f} s ({last_error})")


# -- catch-up ---------------------------------------------------------------------------------------------


def catch_up(app: Appliance, topic: str, fetch_max_bytes: int, progress: Progress | None,
             profile: str | None = None) -> CatchUp:
    """A follower process copies ``topic`` from empty into a temporary directory (removed afterwards)."""
    job = _follower_job(app, topic, fetch_max_bytes, profile)
    context = multiprocessing.get_context("fork")
    counter = context.RawValue("q", 0)
    parent, child = context.Pipe()
    process = context.Process(target=_follow, daemon=True, args=(job, counter, child))
    process.start()
    child.close()
    try:
        report = _await_follower(parent, process, counter, progress)
        elapsed_ns = max(report.end_ns - report.start_ns, 1)
        return CatchUp((report.end_ns - report.start_ns) / 1e9, report.copied_bytes, sum(job.targets),
                       report.cpu_ns, report.runnable_ns / elapsed_ns, report.blocked_ns / elapsed_ns)
    finally:
        parent.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
        shutil.rmtree(job.directory, ignore_errors=True)


def _follower_job(app: Appliance, topic: str, fetch_max_bytes: int, profile: str | None) -> FollowerJob:
    """The follower's job: the leader's address, epochs and log end offsets now, a fresh directory."""
    host, port_text = app.require_bootstrap().rsplit(":", 1)
    with app.client() as client:
        metadata = client.metadata([topic])
    partitions = metadata.topics[topic].partitions
    directory = tempfile.mkdtemp(prefix="la-perf-follower-", dir=app.data_dir.parent)
    return FollowerJob(directory, topic, host, int(port_text), metadata.node_id,
                       [p.leader_epoch for p in partitions], [p.log_end_offset for p in partitions],
                       fetch_max_bytes, profile)


def _await_follower(parent: Any, process: Any, counter: Any, progress: Progress | None) -> FollowerReport:
    """Wait for the follower's ``ready``, say ``go``, show its progress until it reports; its report."""
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
    report: FollowerReport = payload
    return report


def _catch_up_rounds(app: Appliance, setup: CatchUpSetup, line: Progress) -> list[CatchUpRound]:
    """``CATCH_UP_ROUNDS`` rounds of ``sendfile`` (when measured), page recycling (when asked), catch-up;
    ``line`` shows the first, the last is profiled (when asked)."""
    rounds = []
    for index in range(CATCH_UP_ROUNDS):
        sendfile_bytes, sendfile_bytes_per_s = 0, 0.0
        if setup.measure_sendfile:  # the same bytes the follower will fetch
            sent = loopback_sendfile(setup.leader.segments)
            sendfile_bytes, sendfile_bytes_per_s = sent.sent_bytes, sent.sent_bytes / sent.seconds
        if setup.recycle_pages:  # the follower writes the log's size into its own page cache
            recycle_pages(setup.leader.log_bytes)
        last = index == CATCH_UP_ROUNDS - 1
        done = catch_up(app, setup.leader.topic, setup.fetch_max_bytes, line if index == 0 else None,
                        setup.profile if last else None)
        rounds.append(CatchUpRound(done, sendfile_bytes, sendfile_bytes_per_s))
        if index == 0:
            line.finish()
    return rounds


def _median_round(rounds: list[CatchUpRound], by_ratio: bool) -> CatchUpRound:
    """The round of the median ratio to its own ``sendfile`` (``by_ratio``), else of the median time."""
    if by_ratio:
        return sorted(rounds, key=lambda r: r.ratio)[len(rounds) // 2]
    return sorted(rounds, key=lambda r: -r.catch_up.seconds)[len(rounds) // 2]


# -- the command ------------------------------------------------------------------------------------------


def run_replicate(app: Appliance, settings: ProduceSettings, *, followers: int = 2, progress: bool = False,
                  bootstrap: str | None = None, keep_topic: bool = False) -> dict[str, Any]:
    """Catch-up rounds, then the acks comparison (see the module doc); the JSON result (``bench.stats``)."""
    started_at = time.time()
    notes: list[str] = []
    if bootstrap:
        app.bootstrap = bootstrap
    props = dict(settings.producer_props)
    fetch_max_bytes = int(props.pop("replica.fetch.max.bytes", DEFAULT_FETCH_MAX_BYTES))
    settings = replace(settings, producer_props=tuple(props.items()))
    topic = settings.topic or topic_name()
    app.create_topic(topic, settings.partitions)
    limits = None
    try:
        fill_full_batches(app, settings, topic)
        leader = LeaderLog.of(app, topic)
        if settings.measure_limits:
            limits = measure_limits(app.data_dir, leader.log_bytes)
            os.sync()
        setup = CatchUpSetup(leader, fetch_max_bytes, limits is not None, settings.recycle_pages,
                             settings.profile)
        line = Progress(settings.records, settings.record_size, enabled=progress, label="catch-up: ")
        rounds = _catch_up_rounds(app, setup, line)
    finally:
        if limits is not None:
            limits.remove_probe_files()
        if settings.topic is None and not keep_topic:
            app.delete_topic(topic)
    chosen = _median_round(rounds, limits is not None)
    if limits is not None:
        limits.sendfile_probe_bytes = rounds[-1].sendfile_bytes
        limits.loopback_sendfile_bytes_per_s = chosen.sendfile_bytes_per_s
    acks = acks_comparison(app, settings, followers, notes)
    notes.insert(0, "catch-up: a follower process (replicas.fetcher.PartitionFetcher per partition, as "
                    "`appliance replica` runs) copied the log from empty; bytes are log bytes; the "
                    "loopback_sendfile limit is a plain sendfile of the same segment files, measured "
                    f"before each of {CATCH_UP_ROUNDS} rounds; the figures are the round of the median "
                    "ratio")
    done = chosen.catch_up
    return make_result("replicate", records=done.records, payload_bytes=done.copied_bytes,
                       seconds=done.seconds, latency=latency_summary([], "none"),
                       config={**settings.as_json(), "followers": followers}, limits=limits,
                       primary_limit="loopback_sendfile", extra=_extra(setup, rounds, chosen, settings, acks),
                       notes=notes, started_at=started_at)


def _extra(setup: CatchUpSetup, rounds: list[CatchUpRound], chosen: CatchUpRound, settings: ProduceSettings,
           acks: dict[str, Any]) -> dict[str, Any]:
    """The command's own figures: the leader's log, the chosen round's follower, every round, the acks."""
    done, batches = chosen.catch_up, setup.leader.batch_sizes
    return {
        "topic": setup.leader.topic, "log_bytes": setup.leader.log_bytes, "copied_bytes": done.copied_bytes,
        "replica_fetch_max_bytes": setup.fetch_max_bytes, "leader_batches": len(batches),
        "leader_batch_bytes_median": int(statistics.median(batches)) if batches else 0,
        "follower_cpu_ns_per_record": round(done.cpu_ns / max(done.records, 1), 1),
        "follower_cpu_s_per_gb": round(done.cpu_ns / max(done.copied_bytes, 1), 3),
        "follower_runnable_share": round(done.runnable_share, 3),
        "follower_blocked_share": round(done.blocked_share, 3),
        "catch_up_rounds": [r.as_json() for r in rounds],
        "payload_mb_per_s": round(done.records * settings.record_size / done.seconds / 1e6, 2),
        "acks": acks,
        "acks_all_to_acks_1": acks.get("ratio"),
    }


def _segment_paths(app: Appliance, topic: str) -> list[str]:
    paths = []
    for part in app.topic(topic).partitions:
        paths += sorted(str(p) for p in Path(part.directory).glob("*.log"))
    return paths
