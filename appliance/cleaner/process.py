"""The cleaner process: its main loop (:class:`Cleaner`) and the supervisor's hook (:func:`child_spec`).

Theory of operation
-------------------
``appliance serve`` names :func:`child_spec` in ``appliance.server.children.EXTRA_CHILDREN``: with
``log.cleaner.enable`` (the default) the supervisor forks the cleaner after the writers ("appliance: cleaner"
in ``ps``), restarts it with the back-off of every child when it dies, and sends it SIGTERM at stop (it exits
at once, once a swap in flight has been answered: whatever else it was doing is abandoned, as after a
SIGKILL).  It holds one control connection to the supervisor, and runs at nice ``appliance.cleaner.nice``
(default 10; Kafka's cleaner threads share one process with the rest of the broker, which the scheduler
cannot tell apart, so Kafka has no such setting): on a busy host the partition writers and the broker get
the CPU first, the cleaner still its share (a nice 10 process gets about a tenth of a core a nice 0 one
competes for, nice 19 about a seventieth), never none: ``SCHED_IDLE`` would run it only when a core is idle,
so under a steady load ``max.compaction.lag.ms`` could not be kept.  For the same reason its I/O goes in
the best-effort class at its lowest level (``ioprio_set``, :func:`lower_io_priority`), not the idle class,
which a disk busy with the writers' I/O would starve: where the disk's scheduler honours I/O priorities
(BFQ) the writers' and the broker's reads and writes go first; with ``none`` or ``mq-deadline`` the setting
is accepted and changes nothing.  At nice 0 both stay as they were.

Each round (:meth:`Cleaner.round`) reads the topic metadata file, lists every partition of a topic whose
``cleanup.policy`` holds ``compact`` that this node serves (``appliance.cleaner.log_view``), measures them
(``appliance.cleaner.choice``) and cleans the one picked with ``storage.cleaner.clean_log``: the offset map in
this process (at most ``log.cleaner.dedupe.buffer.size``), the cleaned groups written aside as
``<base>.log.cleaned`` by this process, reads and writes throttled to ``log.cleaner.io.max.bytes.per.second``
(``appliance.cleaner.throttle``).  **The swap is the log's owner's**: for the groups of a pass (all of them,
or those gathered up to ``segment.bytes``: ``storage.clean_pass_swaps``) the view's ``swap_cleaned`` (on the
pass's swap thread) sends the control op ``swap_cleaned`` and waits; the supervisor has the partition's
running writer swap them in, in one swap (``Log.swap_cleaned``) or, with no writer running, swaps them
itself holding the log's lock (``appliance.server.clean_handoff``).  A refused swap (a replaced segment
deleted or changed meanwhile, a writer starting or stopping) ends the pass: this process unlinks its
``.cleaned`` files and the log is measured again next round.  The ``cleaner-offset-checkpoint`` is written by
this process only, after the pass's last swap.

A round that cleaned something is followed at once by the next; else the cleaner sleeps
``log.cleaner.backoff.ms``, waking early when the topic metadata directory changes (a topic created,
altered or deleted: ``ipc.dir_watch``'s inotify watch, so an idle cleaner wakes once a backoff).  A log
whose data does not parse (``CorruptRecordError``) is left alone until the cleaner restarts, with an
error naming it.

A SIGKILL of this process at any point leaves at most ``*.cleaned`` files (unlinked by the next pass over
that log, and by the log's next open) and a checkpoint that may be behind the swaps done (the next pass
cleans those segments again, to the same result).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from types import FrameType
from typing import Any, Final

from appliance.cleaner.choice import Dirt, dirtiest
from appliance.cleaner.log_view import LogView, list_view
from appliance.cleaner.throttle import Throttle
from appliance.config.server_config import Config, TopicConfig
from appliance.config.topic_metadata import TopicMetadata, read_topics
from appliance.server.children import ChildContext, ChildSpec
from ipc.control import ControlClient
from ipc.dir_watch import DirectoryWatch, wait_any
from ipc.shm import ShmNames
from ipc.state_page import StatePage
from storage.clean_swap import CLEANED_SUFFIX
from storage.cleaner import CleanResult, IoThrottle, clean_log
from storage.errors import ApplianceError, CorruptRecordError

__all__ = [
    "CleanRefusedError",
    "Cleaner",
    "child_spec",
    "clean_pass",
    "cleaner_child",
    "lower_io_priority",
    "unlink_cleaned",
]

_SWAP_TIMEOUT_S: Final = 60.0
_WAKE_CHECK_S: Final = 0.5  # how often a sleeping cleaner looks at the metadata file
_SYS_IOPRIO_SET: Final = 251  # x86-64 Linux
_IOPRIO_WHO_PROCESS: Final = 1
_IOPRIO_CLASS_BEST_EFFORT: Final = 2
_IOPRIO_LOWEST_LEVEL: Final = 7
_IOPRIO_CLASS_SHIFT: Final = 13

_log = logging.getLogger("appliance.cleaner")


class CleanRefusedError(ApplianceError):
    """The log's owner refused a swap (the log changed under the pass): the pass ends, nothing changed."""


class _Stop(BaseException):
    """SIGTERM: leave the loop."""


class _Target:
    """A compacted partition this node serves, with its state page (attached once)."""

    def __init__(self, topic: TopicMetadata, partition: int, settings: TopicConfig, page: StatePage,
                 config: Config) -> None:  # fmt: skip
        self.name = f"{topic.name}-{partition}"
        self.topic_id = topic.topic_id
        self.topic_partition = (topic.name, partition)
        self.directory = topic.directory(partition)
        self.settings = settings
        self.page = page
        self.log_config = config.log_config(topic.name, topic.configs)


class Cleaner:
    """The cleaner's loop (see the module docstring)."""

    def __init__(self, config: Config, names: ShmNames, metadata_path: str, control: ControlClient) -> None:
        self.config = config
        self._names = names
        self._metadata_path = metadata_path
        self._control = control
        self._throttle = Throttle(config.cleaner_io_max_bytes_per_second)
        self._pages: dict[tuple[str, str, int], StatePage] = {}  # by (topic id, topic, partition)
        self._uncleanable: set[tuple[str, int]] = set()
        self._watch = DirectoryWatch.open(os.path.dirname(metadata_path))  # None: poll the file's mtime
        self.passes = 0

    def close(self) -> None:
        for page in self._pages.values():
            page.close()
        self._pages.clear()
        if self._watch is not None:
            self._watch.close()
        self._control.close()

    def run(self) -> None:
        """Rounds until SIGTERM."""
        while True:
            if self.round() is None:
                self._sleep(self.config.cleaner_backoff_ms / 1000)

    def round(self) -> CleanResult | None:
        """Measure every compacted partition and clean the one picked; its result, or None (nothing to
        clean, or the pass was refused or failed: logged)."""
        if self._watch is not None:
            self._watch.drain()  # changes up to now are read by this round; later ones end the next sleep
        now_ms = time.time_ns() // 1_000_000
        views = ((target, self._view(target)) for target in self._targets())
        chosen = dirtiest(((t, view, t.settings) for t, view in views if view is not None), now_ms)
        return None if chosen is None else self._clean(*chosen, now_ms)

    def _clean(self, target: _Target, view: LogView, dirt: Dirt, now_ms: int) -> CleanResult | None:
        try:
            result = clean_pass("cleaner", target.name, view, dirt, now_ms=now_ms, config=self.config,
                                delete_retention_ms=target.settings.delete_retention_ms,
                                io_throttle=self._throttle)  # fmt: skip
        except CorruptRecordError as exc:
            self._uncleanable.add(target.topic_partition)
            _log.error("cleaner: %s is not cleaned until the cleaner restarts: %s", target.name, exc)
            return None
        if result is not None:
            self.passes += 1
        return result

    def _targets(self) -> list[_Target]:
        try:
            topics = read_topics(self._metadata_path)
        except (OSError, ApplianceError) as exc:
            _log.warning("cleaner: cannot read the topic metadata %s: %s", self._metadata_path, exc)
            return []
        targets: list[_Target] = []
        for topic in topics.values():
            try:
                settings = self.config.topic(topic.name, topic.configs)
            except ApplianceError as exc:
                _log.warning("cleaner: topic %s: its settings do not load: %s", topic.name, exc)
                continue
            if "compact" not in settings.cleanup_policy:
                continue
            for partition in range(topic.partitions):
                if (topic.name, partition) in self._uncleanable:
                    continue
                page = self._page((topic.topic_id, topic.name, partition))
                if page is not None:
                    targets.append(_Target(topic, partition, settings, page, self.config))
        self._forget_pages({(t.topic_id, *t.topic_partition) for t in targets})
        return targets

    def _page(self, key: tuple[str, str, int]) -> StatePage | None:
        """The partition's state page, attached the first time (keyed by the topic's id: a topic deleted
        and created again under its name gets a new page)."""
        page = self._pages.get(key)
        if page is None:
            try:
                page = StatePage.attach(self._names.state_page(key[1], key[2]))
            except (OSError, ApplianceError):
                return None  # not served here (yet)
            self._pages[key] = page
        return page

    def _forget_pages(self, keep: set[tuple[str, str, int]]) -> None:
        """Let go of the pages of partitions no longer compacted or served (a topic deleted or altered)."""
        for key in [k for k in self._pages if k not in keep]:
            self._pages.pop(key).close()

    def _view(self, target: _Target) -> LogView | None:
        try:
            return list_view(target.directory, target.log_config, target.topic_partition, target.page,
                             lambda groups: self._swap(target, groups))
        except FileNotFoundError:
            return None  # changed while listed: next round

    def _swap(self, target: _Target, groups: list[list[Any]]) -> None:
        try:
            self._control.swap_cleaned(target.topic_partition[0], target.topic_partition[1], groups,
                                       timeout_s=_SWAP_TIMEOUT_S)
        except ApplianceError as exc:
            bases = [group[0] for group in groups]
            raise CleanRefusedError(f"the swap of the segments cleaned at {bases} was refused: {exc}") \
                from None

    def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the metadata directory changes (inotify; else its file's inode and
        mtime, replaced by a rename, are looked at every :data:`_WAKE_CHECK_S`)."""
        if self._watch is not None:
            wait_any([self._watch], seconds)
            return
        deadline = time.monotonic() + seconds
        before = _identity(self._metadata_path)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _WAKE_CHECK_S))
            if _identity(self._metadata_path) != before:
                return


def clean_pass(who: str, name: str, view: LogView, dirt: Dirt, *, now_ms: int, config: Config,
               delete_retention_ms: int, io_throttle: IoThrottle) -> CleanResult | None:
    """One pass of ``storage.cleaner.clean_log`` over ``view`` up to ``dirt.upper_bound``, logged as ``who``
    (the cleaner process; replicas adopt the leader's cleaned segments instead); its result, or
    None when a swap was refused or the pass abandoned (logged).  The ``*.cleaned`` files in the log's
    directory are unlinked before and after (their writer is the caller).  ``CorruptRecordError`` and any
    exception ``io_throttle`` raises propagate."""
    _log.info("%s: cleaning %s from offset %d to %d (dirty ratio %.2f%s)", who, name, dirt.first_dirty_offset,
              dirt.upper_bound, dirt.ratio, ", overdue" if dirt.overdue else "")
    unlink_cleaned(view.directory)
    started = time.monotonic()
    try:
        result = clean_log(view, upper_bound=dirt.upper_bound, now_ms=now_ms,
                           dedupe_buffer_bytes=config.cleaner_dedupe_buffer_size,
                           delete_retention_ms=delete_retention_ms, io_throttle=io_throttle)
    except CleanRefusedError as exc:
        _log.info("%s: %s: pass ended: %s; measured again next round", who, name, exc)
        return None
    except OSError as exc:  # a segment deleted under the pass (retention), a full disk ...
        _log.warning("%s: %s: pass abandoned: %s; measured again next round", who, name, exc)
        return None
    finally:
        unlink_cleaned(view.directory)
    _log.info("%s: %s cleaned offsets %d..%d in %.2f s: %d segments in %d groups, %d bytes read, "
              "%d written, %d keys%s", who, name, result.start_offset, result.end_offset,
              time.monotonic() - started, result.segments_cleaned, result.groups, result.bytes_read,
              result.bytes_written, result.keys, "" if result.done else " (more next pass)")  # fmt: skip
    return result


def _identity(path: str) -> tuple[int, int]:
    """A file's inode and mtime: a replacement in the same clock tick as the last keeps the mtime only."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0
    return st.st_ino, st.st_mtime_ns


def unlink_cleaned(directory: str) -> None:
    """Unlink the ``*.cleaned`` files in ``directory``: this process is their only writer."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.endswith(CLEANED_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))


def lower_io_priority() -> bool:
    """Put this process's I/O in the best-effort class at its lowest level (``ioprio_set(IOPRIO_WHO_PROCESS,
    0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 7))``); False, and a warning, when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    value = _IOPRIO_CLASS_BEST_EFFORT << _IOPRIO_CLASS_SHIFT | _IOPRIO_LOWEST_LEVEL
    if libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, 0, value) == 0:
        return True
    _log.warning("cleaner: its I/O priority stays as it was: ioprio_set failed: %s",
                 os.strerror(ctypes.get_errno()))
    return False


def cleaner_child(context: ChildContext) -> int:
    """The cleaner process's main: rounds until SIGTERM; exit 0."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    if context.config.cleaner_nice > 0:
        os.nice(context.config.cleaner_nice)
        lower_io_priority()
    cleaner = Cleaner(context.config, context.shm_names, context.metadata_path, context.connect())
    _log.info("cleaner: started (dedupe buffer %d bytes, backoff %d ms)",
              context.config.cleaner_dedupe_buffer_size, context.config.cleaner_backoff_ms)
    try:
        cleaner.run()
    except _Stop:
        pass
    finally:
        cleaner.close()
    return 0


def child_spec(config: Config) -> ChildSpec | None:
    """The supervisor's hook: the cleaner, unless ``log.cleaner.enable`` is false."""
    if not config.cleaner_enable:
        return None
    return ChildSpec(name="cleaner", target=cleaner_child, title="appliance: cleaner", stop_timeout_ms=5_000)
