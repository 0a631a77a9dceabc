"""Creating and deleting topics all-or-nothing, and finishing the deletions a failure interrupted.

Theory of operation
-------------------
A topic lives in three places: the topic metadata file (``appliance.server.metadata``), the supervisor's
partition table (writers, state pages, doorbells, rings) and the partition directories.  A change touches
all three in steps, and any step may fail (a full disk, an I/O error, a bug).  Each change has one *commit
point*, a write of the metadata file: a failure before it changes nothing, a failure after it is finished
later.  Clients only ever see a topic that exists whole or not at all.

Create::

    1. record the topic in the metadata file              commit point: a failure changes nothing
    2. per partition: recover its log (creating the directory), its state page and doorbell, its writer

  Step 2 runs in steps from the supervisor's loop (:meth:`TopicChanges.begin_create`,
  :meth:`TopicChanges.step`): a few partitions a turn, for at most :data:`STEP_BUDGET_S`, so the supervisor
  keeps answering other control requests (metadata, attach, status) while hundreds of partitions start.
  Until the last partition is served the topic is not listed (``being_created``) and cannot be deleted;
  the creator is answered when it is whole (or rolled back).  A failure in step 2 rolls the topic back:
  it is marked for deletion and deleted as below (so a partition
  already served stops and its directory goes), and the client gets the error.  If even the mark cannot be
  written, the roll-back is retried every second; a restart before that finds the topic recorded and
  serves it whole.

Add partitions (CreatePartitions)::

    1. record the new partition count in the metadata file  commit point: a failure changes nothing
    2. per new partition: recover its log, its state page and doorbell (as a new topic's)

  A failure in step 2 rolls the new partitions back: those served stop, their directories go, and the old
  count is written again (if that write fails too, the next start serves the topic with the new count,
  whole).  The caller is answered when every new partition is served, or with the error.

Delete::

    1. mark the topic for deletion in the metadata file   commit point: a failure changes nothing
    2. stop its writers; unlink its rings, state pages and doorbells
    3. rename each partition directory to <dir>.<uuid>-delete (as Kafka does), then remove it
    4. forget the topic in the metadata file

  From step 1 on the topic is gone for clients (no metadata lists it; creating the name again first
  finishes the deletion).  A failure in steps 2-4 leaves the mark: :meth:`TopicChanges.finish_pending` does
  the remaining steps again every second and at the next start, until they succeed; each step may be
  repeated.  The client is answered once step 1 is written (Kafka answers DeleteTopics once the topic is
  marked, too).  Directories named ``*.<32 hex>-delete`` in a log dir are what a crash between step 3's
  rename and removal left: they are removed at start and whenever a deletion is pending.

The steps call the fault points of ``appliance.server.faults`` between them, so tests fail them by name.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from appliance.config.topic_metadata import TopicMetadata
from appliance.server.faults import ControlFaults
from appliance.server.metadata import MetadataStore
from storage.atomic_file import fsync_directory
from storage.errors import ApplianceError, UnknownTopicOrPartitionError

__all__ = ["DELETED_DIR_RE", "STEP_BUDGET_S", "CreateRolledBack", "Done", "Lifecycle", "TopicChanges",
           "remove_deleted_directories"]  # fmt: skip

DELETED_DIR_RE: Final = re.compile(r".+-\d+\.[0-9a-f]{32}-delete")
STEP_BUDGET_S: Final = 0.05  # partitions started in one turn of the supervisor's loop, at most this long

Done = Callable[[TopicMetadata | None, BaseException | None], None]


@dataclass(eq=False)
class _Creating:
    """A topic recorded and being started, partition by partition, from the supervisor's loop."""

    topic: TopicMetadata
    done: Done  # called once: (the topic, None) when whole, (None, the error) when rolled back
    not_before_s: float  # the test seam create.slow: nothing starts before this
    next_partition: int = 0

_log = logging.getLogger("appliance.supervisor")


class CreateRolledBack(ApplianceError):
    """Creating a topic failed after it was recorded; it was rolled back (or will be).  Try again."""


class Lifecycle(Protocol):
    """What creating and deleting need of the supervisor."""

    @property
    def stopping(self) -> bool: ...

    def start_partition(self, topic: TopicMetadata, partition: int) -> None:
        """Recover one partition of a new topic and start its writer."""

    def stop_partitions(self, topic: TopicMetadata, first: int = 0) -> None:
        """Stop the writers of the topic's partitions from ``first`` on that run (any of them may not);
        unlink their rings, state pages and doorbells."""


class TopicChanges:
    """Topic creation and deletion for the supervisor's control operations.  See the module docstring."""

    def __init__(self, supervisor: Lifecycle, store: MetadataStore, faults: ControlFaults) -> None:
        self.supervisor = supervisor
        self.store = store
        self.faults = faults
        self._rollbacks: set[str] = set()  # created, failed, and not yet marked for deletion
        self._last_failure: dict[str, str] = {}  # topic -> why its pending change failed last (logged once)
        # topics whose deletion steps run now: the supervisor serves control requests while it waits for
        # writers to stop, so a request may arrive in the middle of a deletion; it must not start it again
        self._finishing: set[str] = set()
        self._creating: dict[str, _Creating] = {}  # recorded, partitions starting (module docstring)

    @property
    def pending(self) -> bool:
        """Whether a deletion or roll-back waits to be finished."""
        return bool(self._rollbacks or self.store.deleting)

    # -- create -------------------------------------------------------------------------------------------

    @property
    def being_created(self) -> frozenset[str]:
        """Topics recorded whose partitions are still starting: not listed, not deletable yet."""
        return frozenset(self._creating)

    def begin_create(self, name: str, partitions: int, replication: int, configs: Mapping[str, Any],
                     replicas: tuple[int, ...], done: Done, *, internal: bool = False,
                     assignments: tuple[tuple[int, ...], ...] = ()) -> TopicMetadata:
        """Record a topic (step 1) and start its partitions from :meth:`step`; ``done`` is called when it
        is whole or rolled back.  TopicExistsError, ConfigError, OSError: nothing changed, no ``done``.
        ``internal``: one of the appliance's own topics (its name may begin with ``__``).  ``assignments``:
        each partition's replicas (an explicit assignment), instead of ``replicas`` for all."""
        if self.supervisor.stopping:
            raise ApplianceError("the appliance is stopping")
        if name in self.store.deleting or name in self._rollbacks:
            self.finish_pending()
        topic = self.store.create_topic(name, partitions, replication, configs, replicas=replicas,
                                        assignments=assignments, internal=internal)
        delay_s = self.faults.delay_ms("create.slow") / 1000
        self._creating[name] = _Creating(topic, done, time.monotonic() + delay_s)
        return topic

    def next_step_s(self) -> float | None:
        """When :meth:`step` has work (a monotonic time), or None."""
        return min((job.not_before_s for job in self._creating.values()), default=None)

    def step(self, budget_s: float = STEP_BUDGET_S) -> None:
        """Start partitions of the topics being created, for about ``budget_s``; finish or roll back."""
        deadline = time.monotonic() + budget_s
        for job in list(self._creating.values()):
            if job.not_before_s > time.monotonic():
                continue
            try:
                self._start_some(job, deadline)
            except Exception as exc:
                del self._creating[job.topic.name]
                how = self._roll_back(job.topic, exc)
                why = f"topic {job.topic.name!r} was not created: {_describe(exc)}; {how}"
                job.done(None, CreateRolledBack(why))
                continue
            if job.next_partition >= job.topic.partitions:
                del self._creating[job.topic.name]
                _log.info("created topic %s with %d partitions", job.topic.name, job.topic.partitions)
                job.done(job.topic, None)
            if time.monotonic() >= deadline:
                return

    def _start_some(self, job: _Creating, deadline: float) -> None:
        if job.next_partition == 0:
            self.faults.hit("create.recorded")
        while job.next_partition < job.topic.partitions:
            if job.next_partition:
                self.faults.hit("create.partition")
            self.supervisor.start_partition(job.topic, job.next_partition)
            job.next_partition += 1
            if time.monotonic() >= deadline:
                return

    def abandon_creates(self) -> None:
        """The supervisor stops: the topics being created stay recorded (the next start serves them whole)."""
        for job in self._creating.values():
            job.done(None, ApplianceError(f"topic {job.topic.name!r}: the appliance stopped while its "
                                          "partitions started; it is served whole at the next start"))
        self._creating.clear()

    def create(self, name: str, partitions: int, replication: int, configs: Mapping[str, Any],
               replicas: tuple[int, ...]) -> TopicMetadata:  # fmt: skip
        """Record and start a topic (module docstring).  TopicExistsError, ConfigError, OSError (nothing
        changed), or :class:`CreateRolledBack`."""
        if self.supervisor.stopping:
            raise ApplianceError("the appliance is stopping")
        if name in self.store.deleting or name in self._rollbacks:
            self.finish_pending()  # the name's earlier deletion first; if it still fails, TopicExistsError
        topic = self.store.create_topic(name, partitions, replication, configs, replicas=replicas)
        try:
            self.faults.hit("create.recorded")
            for partition in range(topic.partitions):
                if partition:
                    self.faults.hit("create.partition")
                self.supervisor.start_partition(topic, partition)
        except Exception as exc:
            how = self._roll_back(topic, exc)
            raise CreateRolledBack(f"topic {name!r} was not created: {_describe(exc)}; {how}") from exc
        _log.info("created topic %s with %d partitions", name, partitions)
        return topic

    def _roll_back(self, topic: TopicMetadata, error: BaseException) -> str:
        """Undo a creation that failed after step 1; what happened, for the client."""
        _log.error("creating topic %s failed after it was recorded: %s; rolling it back", topic.name,
                   _describe(error))  # fmt: skip
        self._rollbacks.add(topic.name)
        try:
            self._mark(topic.name)
        except (ApplianceError, OSError) as exc:
            _log.error("topic %s: cannot record its roll-back yet (%s); retrying every second", topic.name,
                       _describe(exc))  # fmt: skip
            return "its roll-back is retried every second; try again later"
        if self._finish(topic):
            return "it was rolled back; try again"
        return "its deletion is retried every second; try again once it is gone"

    # -- add partitions -----------------------------------------------------------------------------------

    def add_partitions(self, name: str, count: int,
                       assignments: tuple[tuple[int, ...], ...] = ()) -> TopicMetadata:  # fmt: skip
        """Grow ``name`` to ``count`` partitions (module docstring, "Add partitions"); ``assignments``: each
        new partition's replicas (else partition 0's).  ConfigError or OSError before the commit point
        (nothing changed); :class:`CreateRolledBack` after it."""
        if self.supervisor.stopping:
            raise ApplianceError("the appliance is stopping")
        if name in self._creating:
            raise UnknownTopicOrPartitionError(f"topic {name!r} is still being created")
        old = self.store.get(name)
        topic = self.store.set_partition_count(name, count, assignments)
        try:
            self.faults.hit("partitions.recorded")
            for partition in range(old.partitions, count):
                self.supervisor.start_partition(topic, partition)
        except Exception as exc:
            _log.error("adding partitions %d..%d to topic %s failed after they were recorded: %s; rolling "
                       "them back", old.partitions, count - 1, name, _describe(exc))  # fmt: skip
            raise CreateRolledBack(f"topic {name!r} was not given {count} partitions: {_describe(exc)}; "
                                   f"{self._roll_back_partitions(topic, old.partitions)}") from exc
        _log.info("topic %s now has %d partitions (was %d)", name, count, old.partitions)
        return topic

    def _roll_back_partitions(self, topic: TopicMetadata, old_count: int) -> str:
        try:
            self.supervisor.stop_partitions(topic, old_count)
            for partition in range(old_count, topic.partitions):
                _remove_partition_directory(topic.directory(partition))
            self.store.set_partition_count(topic.name, old_count)
        except Exception as exc:
            _log.error("topic %s: rolling back its new partitions failed: %s; the next start serves all %d",
                       topic.name, _describe(exc), topic.partitions)  # fmt: skip
            return f"the roll-back failed ({_describe(exc)}): the next start serves all {topic.partitions}"
        return f"it still has {old_count}; try again"

    # -- delete -------------------------------------------------------------------------------------------

    def delete(self, name: str) -> str:
        """Delete a topic (module docstring).  UnknownTopicOrPartitionError or OSError before the commit
        point (nothing changed); after it, returns ``""`` if finished, else why it is still pending."""
        self.store.get(name)
        if name in self._creating:
            raise UnknownTopicOrPartitionError(f"topic {name!r} is still being created; delete it once "
                                               "it is listed")  # fmt: skip
        self._mark(name)
        topic = self.store.deleting[name]
        if self._finish(topic):
            _log.info("deleted topic %s (%d partitions)", name, topic.partitions)
            return ""
        return self._last_failure.get(name, "pending")

    def _mark(self, name: str) -> None:
        self.store.mark_deleting(name)
        self._rollbacks.discard(name)
        self.faults.hit("delete.recorded")

    def _finish(self, topic: TopicMetadata) -> bool:
        """Steps 2-4 of a deletion; False (logged once per distinct failure) if one failed or they are
        running already."""
        if topic.name in self._finishing:
            return False
        self._finishing.add(topic.name)
        try:
            self.supervisor.stop_partitions(topic)
            self.faults.hit("delete.stopped")
            for partition in range(topic.partitions):
                _remove_partition_directory(topic.directory(partition))
            self.faults.hit("delete.removed")
            self.store.forget_deleted(topic.name)
        except Exception as exc:  # a bug too: the mark stays, the step is retried, the supervisor lives
            why = _describe(exc)
            if not isinstance(exc, ApplianceError | OSError):
                _log.exception("deleting topic %s failed unexpectedly", topic.name)
            if self._last_failure.get(topic.name) != why:
                _log.error("topic %s is marked for deletion but its deletion did not finish: %s; retrying "
                           "every second and at the next start", topic.name, why)  # fmt: skip
            self._last_failure[topic.name] = why
            return False
        finally:
            self._finishing.discard(topic.name)
        self._last_failure.pop(topic.name, None)
        return True

    # -- what is left over --------------------------------------------------------------------------------

    def finish_pending(self) -> None:
        """Retry the roll-backs and deletions a failure left, and remove leftover ``-delete`` directories."""
        for name in list(self._rollbacks):
            try:
                self._mark(name)
            except (ApplianceError, OSError) as exc:
                self._last_failure[name] = _describe(exc)
        for topic in self.store.deleting.values():
            if self._finish(topic):
                _log.info("topic %s: its pending deletion finished", topic.name)
        remove_deleted_directories(self.store.log_dirs)


def _remove_partition_directory(directory: str) -> None:
    """Step 3: rename (a crash then leaves no half partition under the live name), then remove."""
    if os.path.isdir(directory):
        doomed = f"{directory}.{uuid.uuid4().hex}-delete"
        os.rename(directory, doomed)
        fsync_directory(os.path.dirname(directory))
        shutil.rmtree(doomed)


def remove_deleted_directories(log_dirs: tuple[str, ...]) -> list[str]:
    """Remove the ``<topic>-<partition>.<uuid>-delete`` directories in ``log_dirs``; the ones removed.
    One that cannot be removed is logged and left for the next call."""
    removed = []
    for log_dir in log_dirs:
        try:
            names = os.listdir(log_dir)
        except OSError:
            continue
        for name in names:
            if DELETED_DIR_RE.fullmatch(name):
                path = os.path.join(log_dir, name)
                try:
                    shutil.rmtree(path)
                except OSError as exc:
                    _log.warning("cannot remove %s (a deleted partition's directory): %s", path, exc)
                    continue
                removed.append(path)
    return removed


def _describe(error: BaseException) -> str:
    return str(error) if isinstance(error, ApplianceError | OSError) else repr(error)
