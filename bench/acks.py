"""acks=all against acks=1 (``appliance bench replicate``'s second measurement): what waiting for the
followers costs a producer.

Two produce runs of ``--records`` records (``appliance bench produce``'s path), one per setting, to one topic
with ``--followers`` followers (replication factor followers + 1, ``min.insync.replicas`` 2), measured once
every follower is in the ISR.  The followers are the replica processes of the appliance used
(``appliance.replica.dirs``); when it has fewer, a second appliance with that many replica dirs is started for
these two runs (:class:`Followers`).  When no follower joins (replication not built or broken in this tree),
both runs go to a topic without followers and the output says so: the ratio then compares a path with
itself.  With ``recycle_pages`` set each run starts right after ``bench.limits.recycle_pages`` of what the
leader and its followers will write.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.harness import Appliance, topic_name
from bench.limits import recycle_pages
from bench.produce import ProduceSettings, run_produce
from storage.errors import ApplianceError

__all__ = ["Followers", "acks_comparison", "replica_children", "replicated_topic"]

ISR_WAIT_S = 30.0  # for followers to join a new topic's ISR


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


@dataclass
class Followers:
    """Where the acks runs go: ``target``, an appliance running enough replica processes (the one given, or
    ``started`` here with replica dirs under ``replica_root``); None, and ``why``, when there is none."""

    target: Appliance | None = None
    started: Appliance | None = None
    replica_root: Path | None = None
    why: str = ""

    @classmethod
    def find(cls, app: Appliance, followers: int) -> Followers:
        """``app`` when it runs ``followers`` replica processes, else an appliance started here with as many
        ``appliance.replica.dirs``."""
        found = cls()
        try:
            if replica_children(app) >= followers:
                found.target = app
                return found
            found.replica_root = Path(tempfile.mkdtemp(prefix="la-perf-replicas-"))
            dirs = ", ".join(f'"{found.replica_root / f"replica-{i}"}"' for i in range(followers))
            found.started = Appliance.start(None, overrides=[f"appliance.replica.dirs=[{dirs}]"])
            if replica_children(found.started) >= followers:
                found.target = found.started
            else:
                found.why = "appliance serve started no replica processes for appliance.replica.dirs"
        except ApplianceError as exc:
            found.why = str(exc)
        except BaseException:
            found.close()
            raise
        return found

    def close(self) -> None:
        """Stop the appliance started here and remove its replica dirs."""
        try:
            if self.started is not None:
                self.started.close()
        finally:
            if self.replica_root is not None:
                shutil.rmtree(self.replica_root, ignore_errors=True)


def acks_comparison(app: Appliance, settings: ProduceSettings, followers: int, notes: list[str]
                    ) -> dict[str, Any]:
    """Two produce runs, acks=1 then acks=all, on a topic with ``followers`` followers in its ISR: on
    ``app`` when it runs that many replica processes, else on an appliance started here with
    ``appliance.replica.dirs``.  Without replication, both on a topic without followers (and a note)."""
    found = Followers.find(app, followers)
    topic: str | None = None
    runs: dict[str, Any] = {}
    try:
        if found.target is not None:
            try:
                topic = replicated_topic(found.target, settings.partitions, followers)
            except ApplianceError as exc:
                found.why = str(exc)
        where = found.target if topic is not None and found.target is not None else app
        for acks in ("1", "all"):
            runs[acks] = _acks_run(where, settings, acks, topic, followers)
        if topic is not None and found.target is not None:
            found.target.delete_topic(topic)
    finally:
        found.close()
    return _acks_summary(runs, followers, topic is not None, found.why, notes)


def _acks_run(app: Appliance, settings: ProduceSettings, acks: str, topic: str | None,
              followers: int) -> dict[str, Any]:
    """One produce run with ``acks`` to ``topic`` (None: a fresh topic without followers); its figures."""
    props = (*settings.producer_props, ("delivery.timeout.ms", "30000"))
    run_settings = replace(settings, acks=acks, topic=topic, measure_limits=False, profile=None,
                           producer_props=props, recycle_pages=False)
    if settings.recycle_pages:  # the leader and every follower write the run's volume
        recycle_pages(settings.records * settings.record_size * (1 + (followers if topic else 0)))
    result = run_produce(app, run_settings)
    return {"records_per_s": result["records_per_s"], "mb_per_s": result["mb_per_s"],
            "latency_ms": result["latency_ms"], "errors": result["extra"]["errors"], "notes": result["notes"]}


def _acks_summary(runs: dict[str, Any], followers: int, available: bool, why: str,
                  notes: list[str]) -> dict[str, Any]:
    """acks=all / acks=1 and both runs; when the runs had no followers (not ``available``), ``why`` and a
    note."""
    ratio = round(runs["all"]["records_per_s"] / max(runs["1"]["records_per_s"], 1e-9), 4)
    out = {"followers": followers if available else 0, "replication_available": available,
           "acks_1": runs["1"], "acks_all": runs["all"], "ratio": ratio}
    if not available:
        out["why_not"] = why
        notes.append(f"replication is not available here ({why}): acks=all and acks=1 both ran on a topic "
                     f"without followers (the ratio {ratio} compares a path with itself)")
    elif runs["all"]["errors"]:
        notes.append(f"acks=all: {runs['all']['errors']} sampled sends failed: {runs['all']['notes']}")
    return out
