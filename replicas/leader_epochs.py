"""Leader epochs across a failover: where a follower's log stops agreeing with its leader's (KIP-101/279).

Theory of operation
-------------------
Every batch carries the ``partitionLeaderEpoch`` of the leader that appended it, and every log keeps a
leader-epoch cache (``storage.checkpoints.LeaderEpochCache``: epoch -> first offset written in it).  Two
logs that hold the same epoch for an offset hold the same batch there: only one leader writes in an epoch,
and a follower copies that leader's bytes unchanged.  So the first offset where two logs may differ is where
their epoch histories part, and a follower finds it by asking the leader, never by trusting its high
watermark (KIP-101: truncating to the high watermark loses acknowledged records or leaves logs diverged after
two fast failovers).

The exchange, before the follower fetches anything from a leader (on start, and whenever the leader epoch
changes)::

    follower                                              leader
    latest epoch E in my cache ----- OffsetsForLeaderEpoch(E) ---->
                                <--- (E', end) --------------------  E' = largest epoch <= E the leader
                                                                     knows, end = where E' ends in its log
                                                                     (its LEO if E' is its latest epoch)

:func:`follower_truncation` turns the answer into a :class:`TruncationStep` (Kafka's
``AbstractFetcherThread.getOffsetTruncationState``):

1. The leader knows no such epoch (``end == -1``): fall back to the follower's high watermark.
2. The leader answered an epoch the follower also has (E' is an epoch in the follower's cache, or older than
   all of them): both logs agree up to ``min(where E' ends here, end)``; truncate there.  Done.
3. The follower does not have E' (KIP-279: it missed that epoch, e.g. after two fast failovers): the logs
   agree at most up to where the follower's own epoch below E' ends.  Truncate there and ask again with the
   new latest epoch (the step is *not* complete), until case 2 or 1.

A follower whose cache is empty cannot ask (it has no epoch); it truncates to its high watermark
(:func:`truncation_without_epochs`), as Kafka does.

The leader's half is :func:`answer_offset_for_leader_epoch` (what the broker sends back) and
:func:`check_current_leader_epoch` (KIP-320 fencing: a request naming an older leader epoch than the
leader's is answered FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH).  :func:`begin_leader_epoch` is
what a replica does when it becomes leader: it records the new epoch at its log end offset *before* the first
append, so a returning old leader asking about the previous epoch learns where that epoch ended here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from ipc.kafka import EpochEndOffset, ErrorCode
from storage.checkpoints import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, LeaderEpochCache
from storage.errors import NotLeaderError
from storage.log import Log

__all__ = [
    "NO_CURRENT_LEADER_EPOCH",
    "EpochSource",
    "TruncationStep",
    "answer_offset_for_leader_epoch",
    "begin_leader_epoch",
    "check_current_leader_epoch",
    "follower_truncation",
    "truncation_without_epochs",
]

NO_CURRENT_LEADER_EPOCH = -1  # a request that does not name the leader epoch it believes in (not fenced)


class EpochSource(Protocol):
    """What a follower's truncation needs from its own leader-epoch cache (``LeaderEpochCache`` has it)."""

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]: ...


class TruncationStep(NamedTuple):
    """Where to truncate the follower log (drop every offset >= ``offset``) and whether that settles it."""

    offset: int
    complete: bool  # False: an intermediate truncation; ask the leader again with the new latest epoch
    reason: str  # one line for the log


def truncation_without_epochs(*, follower_log_end_offset: int,
                              follower_high_watermark: int) -> TruncationStep:
    """A follower with no leader epoch to ask about: keep what is known committed (its high watermark)."""
    offset = min(max(follower_high_watermark, 0), follower_log_end_offset)
    return TruncationStep(offset, True, f"no leader epoch in the follower's cache: truncate to the high "
                                        f"watermark {follower_high_watermark} "
                                        f"(log end {follower_log_end_offset})")


def follower_truncation(
    *,
    leader_epoch: int,
    leader_end_offset: int,
    follower_epochs: EpochSource,
    follower_log_end_offset: int,
    follower_high_watermark: int,
) -> TruncationStep:
    """The truncation a follower makes from the leader's OffsetsForLeaderEpoch answer ``(leader_epoch,
    leader_end_offset)``; see the module docstring for the three cases."""
    leo = follower_log_end_offset
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        step = truncation_without_epochs(follower_log_end_offset=leo,
                                         follower_high_watermark=follower_high_watermark)
        return step._replace(reason=f"the leader knows no such epoch: {step.reason}")
    if leader_epoch == UNDEFINED_EPOCH:
        # An answer without an epoch (OffsetsForLeaderEpoch v0): only the end offset can be used.
        offset = min(leader_end_offset, leo)
        return TruncationStep(offset, True, f"the leader's log ends at {leader_end_offset} (no epoch given)")
    found_epoch, found_end = follower_epochs.end_offset_for(leader_epoch, leo)
    if found_end == UNDEFINED_EPOCH_OFFSET:
        # We track no epoch at or below the leader's (a cache started later): the leader's end is the limit.
        offset = min(leader_end_offset, leo)
        return TruncationStep(offset, True, f"epoch {leader_epoch} is unknown here; the leader's log ends it "
                                            f"at {leader_end_offset}")
    if found_epoch != leader_epoch:
        offset = min(found_end, leo)
        return TruncationStep(offset, False, f"the leader's epoch {leader_epoch} (ending at "
                                             f"{leader_end_offset}) is missing here; epoch {found_epoch} "
                                             f"ends at {found_end} here: truncate there and ask again")
    offset = min(found_end, leader_end_offset, leo)
    return TruncationStep(offset, True, f"epoch {leader_epoch} ends at {leader_end_offset} on the leader "
                                        f"and at {found_end} here")


# --- the leader's half --------------------------------------------------------------------------------------


def check_current_leader_epoch(current_leader_epoch: int, leader_epoch: int) -> ErrorCode:
    """KIP-320 fencing of a Fetch or OffsetsForLeaderEpoch that names ``current_leader_epoch``.

    NONE when it names none (-1) or ours; FENCED_LEADER_EPOCH when it is older than ours (the sender must
    refresh its view of the leader); UNKNOWN_LEADER_EPOCH when it is newer (we have not learned it yet: the
    sender retries after a back-off).
    """
    if current_leader_epoch == NO_CURRENT_LEADER_EPOCH or current_leader_epoch == leader_epoch:
        return ErrorCode.NONE
    if current_leader_epoch < leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    return ErrorCode.UNKNOWN_LEADER_EPOCH


def answer_offset_for_leader_epoch(
    *,
    partition: int,
    requested_epoch: int,
    current_leader_epoch: int,
    leader_epoch: int,
    end_offset_for: Callable[[int], tuple[int, int]],
) -> EpochEndOffset:
    """The leader's OffsetsForLeaderEpoch answer for one partition.

    ``end_offset_for`` is the leader log's ``end_offset_for_epoch`` (``Log`` or ``LogReader``): ``epoch ->
    (largest known epoch <= it, where that epoch ends)``.  A request fenced by ``current_leader_epoch`` gets
    the error and no offsets.
    """
    error = check_current_leader_epoch(current_leader_epoch, leader_epoch)
    if error != ErrorCode.NONE:
        return EpochEndOffset(error_code=error, partition=partition, leader_epoch=UNDEFINED_EPOCH,
                              end_offset=UNDEFINED_EPOCH_OFFSET)
    epoch, end_offset = end_offset_for(requested_epoch)
    return EpochEndOffset(error_code=ErrorCode.NONE, partition=partition, leader_epoch=epoch,
                          end_offset=end_offset)


def begin_leader_epoch(log: Log | LeaderEpochCache, leader_epoch: int,
                       log_end_offset: int | None = None) -> int:
    """Record that ``leader_epoch`` starts at the log end offset, before the new leader's first append.

    Returns the epoch's start offset (publish it with the epoch in the state page).  Raises
    :class:`NotLeaderError` when a newer epoch is already recorded (a stale promotion).  For a bare
    ``LeaderEpochCache`` pass ``log_end_offset``.
    """
    if isinstance(log, Log):
        cache, end, name = log.leader_epoch_cache, log.log_end_offset, log.name
    else:
        if log_end_offset is None:
            raise ValueError("begin_leader_epoch on a LeaderEpochCache needs log_end_offset")
        cache, end, name = log, log_end_offset, log.path
    if leader_epoch < 0:
        raise ValueError(f"{name}: leader epoch {leader_epoch} must be >= 0")
    latest = cache.latest_epoch
    if leader_epoch < latest:
        raise NotLeaderError(f"partition {name}: cannot lead in epoch {leader_epoch}: epoch {latest} is "
                             f"already recorded in its leader-epoch cache")
    if leader_epoch == latest:
        return cache.entries[-1].start_offset
    cache.assign(leader_epoch, end)
    return end
