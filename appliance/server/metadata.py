"""The topic metadata store: the supervisor's topic table, persisted in the file that
:mod:`appliance.config.topic_metadata` lays out.

Theory of operation
-------------------
**One writer.**  Only the supervisor changes the file (it holds the data dir's lock); every change rewrites it
whole and atomically: a temporary file, ``fsync``, ``rename`` over the old one, ``fsync`` of the directory.  A
crash leaves either the old or the new file, never a mix.  Other processes (the broker, tools) may read it at
any time with :func:`read_topics`, but they learn of changes through the control socket.

**Topics come from two places**: the configuration's ``[topics.NAME]`` tables (created at start when
missing) and create requests (``appliance topics create``, the broker's CreateTopics, auto-creation).
``configs`` holds only the overrides a create request gave; a declared topic's settings come from the
configuration file on every start, so editing the file changes them.

**Replicas.**  A topic with replication factor R > 1 is held by R nodes (``node.id``): the node that
creates it and the R - 1 smallest other ids (:func:`assign_replicas`: node 0 creating a topic of factor 3
assigns ``[0, 1, 2]``), every partition alike; or, given an explicit assignment (CreateTopics,
CreatePartitions: ``appliance.config.replica_assignment``), each partition by the nodes assigned to it, which
always include the creating node.  Whichever node runs ``appliance serve`` on its copy leads every partition
it holds; the others run ``appliance replica`` (or are replicas that ``appliance serve`` spawns on its
``appliance.replica.dirs``, which take the ids after its own in order) and copy the partitions that name
them.  A
replica keeps the same file in its own first log dir, copied from the leader's metadata, so it can be
promoted.  ``replicas`` is absent for a topic of factor 1 (held by whichever node serves it).

**Deletions in progress.**  A topic being deleted is first moved from ``"topics"`` to ``"deleting"``
(:meth:`MetadataStore.mark_deleting`), then, once its directories are gone, forgotten
(:meth:`MetadataStore.forget_deleted`); the steps between are ``appliance.server.topic_changes``.  A name
marked for deletion cannot be created again until the deletion finished.

**A full disk.**  Every rewrite goes through the meta directory's reserve (``appliance.server.meta_reserve``,
when the store is given one): a write that fails for lack of space releases the reserve and is tried again,
so a full disk never makes a deletion impossible.  A change whose write fails is undone in memory: the table
always equals the file.

**Placement.**  A new partition goes to the log dir holding the fewest partitions (Kafka's rule), ties to the
earlier dir.  A partition whose recorded dir is no longer in ``log.dirs`` is looked for in the others, by its
directory name ``<topic>-<partition>``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from appliance.config.server_config import check_new_topic_name
from appliance.config.topic_metadata import (
    MAX_PARTITIONS,
    VERSION,
    TopicMetadata,
    partition_directory,
    read_pending_deletes,
    read_topics,
    topics_path,
    with_replicas,
)
from appliance.server.faults import ControlFaults
from appliance.server.meta_reserve import MetaReserve
from storage.atomic_file import TMP_SUFFIX, write_atomically
from storage.errors import ConfigError, TopicExistsError, UnknownTopicOrPartitionError

__all__ = ["MetadataStore"]


class MetadataStore:
    """The supervisor's topic table, persisted on every change.  Not thread-safe; one process writes it."""

    def __init__(self, path: Path, log_dirs: tuple[str, ...], topics: dict[str, TopicMetadata],
                 deleting: dict[str, TopicMetadata] | None = None, *, reserve: MetaReserve | None = None,
                 faults: ControlFaults | None = None) -> None:  # fmt: skip
        self.path = path
        self.log_dirs = log_dirs
        self._topics = topics
        self._deleting = dict(deleting or {})
        self.reserve = reserve
        self.faults = faults or ControlFaults()

    @classmethod
    def open(cls, log_dirs: Iterable[str], *, reserve: bool = False,
             faults: ControlFaults | None = None) -> MetadataStore:  # fmt: skip
        """Load (or start) the store of an appliance with these ``log.dirs``; creates ``<first>/meta``.

        Partitions whose recorded log dir left ``log.dirs`` are relocated to where their directory is found
        (or to the emptiest dir) and the file is rewritten.  ``reserve``: keep the meta directory's
        reserve (``appliance.server.meta_reserve``) and write through it.
        """
        dirs = tuple(os.path.abspath(d) for d in log_dirs)
        if not dirs:
            raise ConfigError("metadata store: log.dirs is empty")
        path = topics_path(dirs)
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = path.with_name(path.name + ".tmp")
        if stale.exists():
            stale.unlink()  # a crash during a write: the previous version is intact
        ballast = None
        if reserve:
            ballast = MetaReserve(path.parent, path)
            ballast.ensure()
        store = cls(path, dirs, read_topics(path), read_pending_deletes(path), reserve=ballast, faults=faults)
        if store._relocate():
            store._save()
        return store

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def topics(self) -> dict[str, TopicMetadata]:
        """A copy of the table, by name, in creation order."""
        return dict(self._topics)

    @property
    def deleting(self) -> dict[str, TopicMetadata]:
        """A copy of the topics marked for deletion whose deletion has not finished."""
        return dict(self._deleting)

    def get(self, name: str) -> TopicMetadata:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return topic

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    # -- changing ------------------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, Any] | None = None,
        *,
        replicas: tuple[int, ...] = (),
        assignments: tuple[tuple[int, ...], ...] = (),
        topic_id: str | None = None,
        internal: bool = False,
    ) -> TopicMetadata:
        """Record a new topic and place its partitions; the caller has validated ``configs``.

        ``replicas`` lists the node ids holding a copy (replication factor > 1; :func:`assign_replicas`);
        ``assignments`` instead lists them per partition (an explicit assignment; recorded in the per-topic
        form when every partition has the same);
        ``topic_id`` keeps an id given elsewhere (a replica copying its leader's topic), else a new UUID.
        ``internal``: the name may begin with ``__`` (``check_new_topic_name``: the appliance's own topics,
        or a replica's copy of its leader's topics).

        Raises TopicExistsError (also while the name is marked for deletion), or ConfigError for a bad name
        or count.  Directories are not created here
        (the log creates its own when first opened).
        """
        reason = check_new_topic_name(name, internal=internal)
        if reason:
            raise ConfigError(f"topic {name!r}: {reason}")
        if name in self._deleting:
            raise TopicExistsError(f"topic {name!r} is marked for deletion and its deletion has not finished "
                                   "(the supervisor retries it every second; its log says why it failed); "
                                   "create it again once it is gone")
        if name in self._topics:
            raise TopicExistsError(
                f"topic {name!r} already exists ({self._topics[name].partitions} partitions)"
            )
        collision = self._colliding(name)
        if collision is not None:
            raise TopicExistsError(
                f"topic {name!r} collides with existing topic {collision!r}: names that differ only in '.' "
                "versus '_' would share metric names in Kafka, so Kafka refuses them too"
            )
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"topic {name!r}: {partitions} partitions, expected 1..{MAX_PARTITIONS}")
        if replication_factor < 1:
            raise ConfigError(f"topic {name!r}: replication factor {replication_factor}, expected >= 1")
        per_partition = list(assignments) or [tuple(replicas)] * partitions
        if len(per_partition) != partitions:
            raise ConfigError(f"topic {name!r}: {len(per_partition)} assignments for {partitions} partitions")
        for nodes in per_partition:
            if nodes and (len(nodes) != replication_factor or len(set(nodes)) != len(nodes)):
                raise ConfigError(f"topic {name!r}: replicas {list(nodes)} for replication factor "
                                  f"{replication_factor}: expected that many distinct node ids")
        load = self._partitions_per_dir()
        placement = []
        for _ in range(partitions):
            chosen = min(self.log_dirs, key=lambda d: (load[d], self.log_dirs.index(d)))
            load[chosen] += 1
            placement.append(chosen)
        topic = TopicMetadata(
            name, topic_id or str(uuid.uuid4()), partitions, replication_factor, dict(configs or {}),
            tuple(placement), tuple(replicas),
        )
        if assignments:
            topic = with_replicas(topic, per_partition)
        self._topics[name] = topic
        try:
            self._save()
        except BaseException:
            del self._topics[name]
            raise
        return topic

    def set_configs(self, name: str, configs: Mapping[str, Any]) -> TopicMetadata:
        """Replace the topic's overrides (AlterConfigs; the caller has validated them); if the write fails,
        nothing changed.  UnknownTopicOrPartitionError if there is no such topic."""
        return self._replace(self.get(name), configs=dict(configs))

    def set_partition_count(self, name: str, partitions: int,
                            assignments: tuple[tuple[int, ...], ...] = ()) -> TopicMetadata:  # fmt: skip
        """Give the topic ``partitions`` partitions (CreatePartitions, or its roll-back to the old count):
        new ones are placed like a new topic's, removed ones forgotten.  ``assignments``: the replicas of
        each new partition (an explicit assignment; the caller checked them), else those of partition 0.
        If the write fails, nothing changed.  ConfigError outside 1..MAX_PARTITIONS."""
        topic = self.get(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"topic {name!r}: {partitions} partitions, expected 1..{MAX_PARTITIONS}")
        added = max(0, partitions - topic.partitions)
        if assignments and len(assignments) != added:
            raise ConfigError(f"topic {name!r}: {len(assignments)} assignments for {added} new partitions")
        replicas = [topic.partition_replicas(p) for p in range(min(partitions, topic.partitions))]
        replicas += list(assignments) or [topic.partition_replicas(0)] * added
        placement = list(topic.log_dirs[:partitions])
        load = self._partitions_per_dir()
        for _ in range(topic.partitions, partitions):
            chosen = min(self.log_dirs, key=lambda d: (load[d], self.log_dirs.index(d)))
            load[chosen] += 1
            placement.append(chosen)
        resized = dataclasses.replace(topic, partitions=partitions, log_dirs=tuple(placement))
        resized = with_replicas(resized, replicas)
        return self._replace(topic, partitions=partitions, log_dirs=tuple(placement),
                             replicas=resized.replicas, assignments=resized.assignments)

    def _replace(self, topic: TopicMetadata, **changes: Any) -> TopicMetadata:
        changed = dataclasses.replace(topic, **changes)
        self._topics[topic.name] = changed
        try:
            self._save()
        except BaseException:
            self._topics[topic.name] = topic
            raise
        return changed

    def delete_topic(self, name: str) -> TopicMetadata:
        """Forget a topic at once (the caller removes its directories); UnknownTopicOrPartitionError if
        none.  (A replica forgetting its copy; the supervisor deletes through :meth:`mark_deleting`.)"""
        topic = self.get(name)
        del self._topics[name]
        try:
            self._save()
        except BaseException:
            self._topics[name] = topic
            raise
        return topic

    def mark_deleting(self, name: str) -> TopicMetadata:
        """Move a topic to the deletions in progress (the commit point of a deletion); if the write fails,
        nothing changed.  UnknownTopicOrPartitionError if there is no such topic."""
        topic = self.get(name)
        del self._topics[name]
        self._deleting[name] = topic
        try:
            self._save()
        except BaseException:
            del self._deleting[name]
            self._topics[name] = topic
            raise
        return topic

    def forget_deleted(self, name: str) -> None:
        """The deletion of ``name`` finished (its directories are gone): forget it.  If the write fails,
        the topic stays marked (and is forgotten by a later call)."""
        topic = self._deleting.pop(name)
        try:
            self._save()
        except BaseException:
            self._deleting[name] = topic
            raise

    # -- internals -----------------------------------------------------------------------------------------

    def _colliding(self, name: str) -> str | None:
        folded = name.replace(".", "_")
        for other in (*self._topics, *self._deleting):
            if other.replace(".", "_") == folded:
                return other
        return None

    def _partitions_per_dir(self) -> dict[str, int]:
        load = dict.fromkeys(self.log_dirs, 0)
        for topic in self._topics.values():
            for directory in topic.log_dirs:
                if directory in load:
                    load[directory] += 1
        return load

    def _relocate(self) -> bool:
        changed = False
        for name, topic in list(self._topics.items()):
            dirs = list(topic.log_dirs)
            for partition, directory in enumerate(dirs):
                if directory in self.log_dirs:
                    continue
                found = [d for d in self.log_dirs if os.path.isdir(partition_directory(d, name, partition))]
                if found:
                    dirs[partition] = found[0]
                else:
                    load = self._partitions_per_dir()
                    dirs[partition] = min(self.log_dirs, key=lambda d: (load[d], self.log_dirs.index(d)))
                changed = True
            if changed:
                self._topics[name] = dataclasses.replace(topic, log_dirs=tuple(dirs))
        return changed

    def _save(self) -> None:
        document: dict[str, Any] = {
            "version": VERSION,
            "topics": {name: topic.to_json() for name, topic in self._topics.items()},
        }
        if self._deleting:
            document["deleting"] = {name: topic.to_json() for name, topic in self._deleting.items()}
        data = (json.dumps(document, indent=2, sort_keys=False) + "\n").encode()

        def write() -> None:
            self.faults.hit("metadata.write")
            write_atomically(self.path, data, mode=0o600)

        if self.reserve is None:
            write()
        else:
            self.reserve.write(write, f"writing {self.path}", tmp=f"{self.path}{TMP_SUFFIX}")
