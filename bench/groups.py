"""``appliance bench groups``: what consumer groups cost, with confluent-kafka consumers, unmodified.

One appliance (started here unless ``--data-dir`` names one), three measurements:

* **Rebalance time** (``--rounds`` rounds, each with a fresh group id on a ``--partitions`` topic): ``form``
  -- ``--members`` members subscribe to an empty group at once, until every one holds its assignment (this
  includes ``group.initial.rebalance.delay.ms``, which the run sets and reports); ``join`` -- one more member
  joins the stable group, from its ``subscribe()`` until every member holds its new assignment; ``leave`` --
  one member ``close()``\\ s (LeaveGroup), until the others hold the whole topic again.  Members are
  consumers in threads of this process, each polling (its callbacks run there), with the ``range``
  assignor and ``heartbeat.interval.ms`` 100 ms: an existing member learns of a rebalance by its next
  heartbeat, so the interval is part of every join and leave, in Kafka as here.  p50 and max in ms.
* **OffsetCommit round trips per second**: one member of a stable group commits one partition's offset,
  synchronously, ``--commits`` times (each commit is answered once it is in ``__consumer_offsets``).
* **Group against assign() consume throughput**: ``--records`` records of ``--record-size`` bytes in a
  4-partition topic, read from the start by 4 consumer processes, once as a group (``subscribe()``, a fresh
  group id) and once each with ``assign()`` of one partition, ``--pairs`` times alternating the order.  The
  processes start together (each creates its consumer, then waits for the word) and a member leaves only
  once all are done.  A run's throughput is the sum of its readers' rates, each its records over the time
  from its first record to its last (so neither the group's join, before a member's first record, nor the
  processes' uneven start counts); ``window_records_per_s`` is the run's records over its first to last
  record, for reference.  The ratio is the median
  of the pairs' group / assign (the target is at least 0.9).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import Appliance, topic_name

__all__ = ["run_groups"]

HEARTBEAT_MS = 100
SESSION_MS = 6000
INITIAL_DELAY_MS = 500
THROUGHPUT_PARTITIONS = 4
WAIT_S = 60.0


def _confluent() -> Any:
    import confluent_kafka  # the bench's client; a test dependency of the project

    return confluent_kafka


# -- members in threads ----------------------------------------------------------------------------------


@dataclass
class Member:
    """A confluent-kafka consumer polled by its own thread; its current assignment as the callbacks say."""

    consumer: Any
    assigned: frozenset[int] = frozenset()
    assigned_at: float = 0.0  # time.monotonic() of the last on_assign
    running: bool = True
    thread: threading.Thread | None = None

    def on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        self.assigned = frozenset(tp.partition for tp in partitions)
        self.assigned_at = time.monotonic()

    def on_revoke(self, _consumer: Any, _partitions: list[Any]) -> None:
        self.assigned = frozenset()

    def poll_loop(self) -> None:
        while self.running:
            self.consumer.poll(0.02)

    def stop_polling(self) -> None:
        self.running = False
        if self.thread is not None:
            self.thread.join()

    def close(self) -> None:
        """Stop the thread and leave the group (LeaveGroup)."""
        self.stop_polling()
        self.consumer.close()


def _member(bootstrap: str, group: str, topic: str, **extra: Any) -> Member:
    ck = _confluent()
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "heartbeat.interval.ms": HEARTBEAT_MS,
                            "session.timeout.ms": SESSION_MS, "partition.assignment.strategy": "range",
                            **extra})
    member = Member(consumer)
    consumer.subscribe([topic], on_assign=member.on_assign, on_revoke=member.on_revoke)
    member.thread = threading.Thread(target=member.poll_loop, daemon=True)
    member.thread.start()
    return member


def _settled(members: list[Member], partitions: int, since: float) -> bool:
    """Every member assigned after ``since``, the assignments disjoint and covering the topic."""
    owned = [m.assigned for m in members]
    return (all(m.assigned_at > since for m in members) and sum(len(a) for a in owned) == partitions
            and len(frozenset().union(*owned)) == partitions)


def _wait(condition: Callable[[], bool], what: str) -> float:
    """Poll ``condition`` until true; the monotonic time it became true.  TimeoutError after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench groups: {what} did not happen within {WAIT_S:.0f} s")
        time.sleep(0.002)
    return time.monotonic()


@dataclass
class RebalanceTimes:
    form_ms: list[float] = field(default_factory=list)
    join_ms: list[float] = field(default_factory=list)
    leave_ms: list[float] = field(default_factory=list)


def _settle_ms(members: list[Member], partitions: int, action: Callable[[], None], what: str) -> float:
    """Do ``action`` and time it until ``members`` have settled (:func:`_settled`), in ms."""
    started = time.monotonic()
    action()
    return (_wait(lambda: _settled(members, partitions, started), what) - started) * 1000


def _rebalance_round(bootstrap: str, topic: str, partitions: int, count: int, times: RebalanceTimes) -> None:
    """Form a group of ``count``; one leaves; one joins (module docstring)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    members: list[Member] = []

    def form() -> None:
        members.extend(_member(bootstrap, group, topic) for _ in range(count))

    try:
        times.form_ms.append(_settle_ms(members, partitions, form, "forming the group"))
        leaver = members.pop()
        times.leave_ms.append(_settle_ms(members, partitions, leaver.close, "a leave"))
        times.join_ms.append(_settle_ms(members, partitions,
                                        lambda: members.append(_member(bootstrap, group, topic)), "a join"))
    finally:
        for m in members:
            m.close()


def _p50_max(values: list[float]) -> dict[str, Any]:
    return {"p50": round(statistics.median(values), 1), "max": round(max(values), 1),
            "samples": [round(v, 1) for v in values]}


# -- commits ---------------------------------------------------------------------------------------------


def _commit_rate(bootstrap: str, topic: str, partitions: int, commits: int) -> dict[str, Any]:
    ck = _confluent()
    member = _member(bootstrap, f"bench-commit-{uuid.uuid4().hex[:8]}", topic)
    try:
        started = time.monotonic()
        _wait(lambda: bool(member.assigned) and member.assigned_at > started, "the committer's assignment")
        partition = min(member.assigned)
        member.stop_polling()  # a synchronous commit waits for its own result, which a poll would take
        samples = []
        begun = time.perf_counter()
        for i in range(commits):
            t = time.perf_counter()
            member.consumer.commit(offsets=[ck.TopicPartition(topic, partition, i)], asynchronous=False)
            samples.append(time.perf_counter() - t)
        seconds = time.perf_counter() - begun
    finally:
        member.close()
    samples.sort()
    return {"commits": commits, "seconds": round(seconds, 4), "commits_per_s": round(commits / seconds, 1),
            "p50_ms": round(samples[len(samples) // 2] * 1000, 3), "max_ms": round(samples[-1] * 1000, 3)}


# -- consume throughput: group against assign() ----------------------------------------------------------

_READER = r"""
import json, sys, time
import confluent_kafka
bootstrap, topic, mode, which = sys.argv[1:5]
config = {"bootstrap.servers": bootstrap, "group.id": which if mode == "group" else "bench-assign",
          "enable.auto.commit": False, "auto.offset.reset": "earliest",
          "heartbeat.interval.ms": 100, "partition.assignment.strategy": "range"}
c = confluent_kafka.Consumer(config)
print("ready", flush=True)
sys.stdin.readline()  # every reader starts at once
if mode == "group":
    c.subscribe([topic])
else:
    c.assign([confluent_kafka.TopicPartition(topic, int(which), confluent_kafka.OFFSET_BEGINNING)])
count, first, last = 0, None, None
started = time.monotonic()
while time.monotonic() < started + 120:
    got = c.consume(num_messages=1000, timeout=0.2)
    now = time.time()
    good = sum(1 for m in got if m.error() is None)
    if good:
        count += good
        first = first or now
        last = now
    elif (last is not None and now - last > 2.0) or (last is None and time.monotonic() > started + 20):
        break  # done, or given no partition
print(json.dumps({"count": count, "first": first, "last": last}), flush=True)
sys.stdin.readline()  # a member leaves only once every reader is done: no rebalance during the reads
c.close()
"""


def _read_run(bootstrap: str, topic: str, mode: str) -> dict[str, Any]:
    """4 reader processes, as a group or each assign()ing a partition; records/s first to last record."""
    group = f"bench-tp-{uuid.uuid4().hex[:8]}"
    processes = [
        subprocess.Popen([sys.executable, "-c", _READER, bootstrap, topic, mode,
                          group if mode == "group" else str(p)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
        for p in range(THROUGHPUT_PARTITIONS)
    ]
    for process in processes:
        assert process.stdout is not None
        process.stdout.readline()  # "ready": imported, consumer created
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    reports = []
    for process in processes:
        assert process.stdout is not None
        reports.append(json.loads(process.stdout.readline()))
    for process in processes:
        process.communicate("stop\n", timeout=60)
    count = sum(r["count"] for r in reports)
    rates = [r["count"] / max(r["last"] - r["first"], 1e-3) for r in reports if r["first"] is not None]
    firsts = [r["first"] for r in reports if r["first"] is not None]
    window_s = max(max(r["last"] for r in reports if r["last"] is not None) - min(firsts), 1e-3)
    return {"records": count, "records_per_s": round(sum(rates), 1),
            "window_records_per_s": round(count / window_s, 1), "window_s": round(window_s, 4),
            "per_process": [r["count"] for r in reports]}


def _fill(bootstrap: str, topic: str, records: int, record_size: int) -> None:
    producer = _confluent().Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                      "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    value = b"v" * record_size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % THROUGHPUT_PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("bench groups: records of the throughput topic were not acknowledged")


def _throughput(app: Appliance, bootstrap: str, records: int, record_size: int, pairs: int) -> dict[str, Any]:
    topic = topic_name("perf-groups")
    app.create_topic(topic, THROUGHPUT_PARTITIONS)
    try:
        _fill(bootstrap, topic, records, record_size)
        runs: dict[str, list[dict[str, Any]]] = {"group": [], "assign": []}
        for pair in range(pairs):
            for mode in (("group", "assign") if pair % 2 == 0 else ("assign", "group")):
                runs[mode].append(_read_run(bootstrap, topic, mode))
    finally:
        app.delete_topic(topic)
    ratios = [g["records_per_s"] / max(a["records_per_s"], 1e-9)
              for g, a in zip(runs["group"], runs["assign"], strict=True)]
    return {"records": records, "record_size": record_size, "pairs": pairs, "group": runs["group"],
            "assign": runs["assign"], "ratios": [round(r, 3) for r in ratios],
            "ratio_median": round(statistics.median(ratios), 3)}


# -- the command -----------------------------------------------------------------------------------------


def run_groups(*, members: int, partitions: int, rounds: int, commits: int, records: int, record_size: int,
               pairs: int, data_dir: str | None, overrides: list[str]) -> dict[str, Any]:
    """The measurements of the module docstring; their JSON result."""
    settings = [f"group.initial.rebalance.delay.ms={INITIAL_DELAY_MS}", *overrides]
    app = Appliance.open(data_dir, overrides=settings)
    try:
        bootstrap = app.require_bootstrap()
        topic = topic_name("perf-groups")
        app.create_topic(topic, partitions)
        times = RebalanceTimes()
        try:
            for _ in range(rounds):
                _rebalance_round(bootstrap, topic, partitions, members, times)
            commit = _commit_rate(bootstrap, topic, partitions, commits)
        finally:
            app.delete_topic(topic)
        throughput = _throughput(app, bootstrap, records, record_size, pairs)
    finally:
        app.close()
    rebalance = {"form": _p50_max(times.form_ms), "join": _p50_max(times.join_ms),
                 "leave": _p50_max(times.leave_ms)}
    return {
        "command": "groups",
        "config": {"members": members, "partitions": partitions, "rounds": rounds, "commits": commits,
                   "records": records, "record_size": record_size, "pairs": pairs, "assignor": "range",
                   "heartbeat_interval_ms": HEARTBEAT_MS, "session_timeout_ms": SESSION_MS,
                   "group_initial_rebalance_delay_ms": INITIAL_DELAY_MS},
        "rebalance_ms": rebalance,
        "offset_commit": commit,
        "consume_throughput": throughput,
        "summary": (
            f"rebalance with {members} members (ms, p50 / max): form {rebalance['form']['p50']} / "
            f"{rebalance['form']['max']}, join {rebalance['join']['p50']} / {rebalance['join']['max']}, "
            f"leave {rebalance['leave']['p50']} / {rebalance['leave']['max']}; OffsetCommit "
            f"{commit['commits_per_s']:,.0f} round trips/s (p50 {commit['p50_ms']} ms); consume as a group "
            f"of 4 / with assign(): {throughput['ratio_median']:.3f} (median of {pairs})"),
    }
