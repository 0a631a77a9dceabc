"""The project's one exception tree.

Every error the appliance raises on a cold path derives from :class:`ApplianceError`.  Hot paths (numba
kernels, ring frame scans) return negative codes instead and are translated into these at the edge.

Messages name the file or partition, the offset or position, and the expected and actual values, so an
operator can act on one line of a log.  Each class says what the caller should do about it.

This module lives in ``storage`` because ``storage`` is the lowest package: every other package may import it.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "ApplianceError",
    "BackPressureError",
    "BrokerConnectionError",
    "ConfigError",
    "CorruptRecordError",
    "InvalidRecordError",
    "KafkaStorageError",
    "LogCorruptionError",
    "LogLockedError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "PartitionOfflineError",
    "ProtocolError",
    "RequestTimeoutError",
    "SwapInProgressError",
    "TopicExistsError",
    "UnknownTopicOrPartitionError",
    "describe_os_error",
    "is_disk_full",
]

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # a file system (or a quota) out of space


class ApplianceError(Exception):
    """Root of every error the appliance raises.  Catch this to catch them all."""


class ConfigError(ApplianceError):
    """A setting is missing, unknown or out of range.  Fix the configuration; nothing was started."""


class CorruptRecordError(ApplianceError):
    """Stored or received bytes fail validation (magic, length, CRC, varints).

    On a socket or ring: the sender's batch was rejected and nothing was appended; resend a valid batch.
    In a closed segment: the file is damaged; the message names the file, position and offsets.
    """


class LogCorruptionError(CorruptRecordError):
    """A partition log holds an invalid batch with valid batches after it: cutting the log there would drop
    records that were acknowledged, so it does not open.  ``damage`` (``storage.log_damage.LogDamage``)
    says where.  Restore the partition from a replica, or cut it by hand with ``appliance repair``."""

    def __init__(self, message: str, damage: object) -> None:
        super().__init__(message)
        self.damage = damage


class InvalidRecordError(CorruptRecordError):
    """A well-formed batch the log refuses (for example offsets that go backwards).  Nothing was appended."""


class OffsetOutOfRangeError(ApplianceError):
    """The requested offset is below the log start offset or above the log end offset.

    Reset the position (to the earliest or latest offset) and read again.
    """


class UnknownTopicOrPartitionError(ApplianceError):
    """No such topic or partition here.  Create it, or ask the broker's metadata where it lives."""


class TopicExistsError(ApplianceError):
    """A topic of that name exists already.  Use it as it is, or delete it first."""


class NotLeaderError(ApplianceError):
    """This appliance does not lead the partition.  Refresh metadata and send to the leader."""


class NotEnoughReplicasError(ApplianceError):
    """Fewer in-sync replicas than ``min.insync.replicas``: acks=all writes are refused.  Retry later."""


class BackPressureError(ApplianceError):
    """A ring or queue stayed full for ``max.block.ms``.  Nothing was dropped: slow down or retry."""


class RequestTimeoutError(ApplianceError):
    """No answer in time (``delivery.timeout.ms``, ``request.timeout.ms``).  The outcome is unknown:
    an idempotent producer may retry safely."""


class BrokerConnectionError(ApplianceError, ConnectionError):
    """The connection to a broker could not be made or broke (refused, reset, closed mid-response).

    The outcome of requests in flight is unknown.  Open a new connection and retry (an idempotent producer
    may resend the same batch; a fetcher fetches again from its position).  Also a ``ConnectionError`` (an
    ``OSError``), so code written for socket errors catches it too.
    """


class ProtocolError(ApplianceError):
    """Bytes on a socket do not form a valid Kafka request or response.  The connection is closed."""


class PartitionOfflineError(ApplianceError):
    """The partition is offline: its log is damaged and the appliance did not open it (the message says
    where).  Nothing can be produced to or read from it until a person repairs it (``appliance repair``)
    and the appliance restarts."""


class LogLockedError(ApplianceError):
    """Another process already writes this partition log.  A log has exactly one writer."""


class KafkaStorageError(ApplianceError):
    """A partition's log directory cannot take writes: the file system is full (``ENOSPC``), a quota is
    exhausted (``EDQUOT``), or its free space is below ``log.dir.min.free.bytes``.  Kafka's
    KAFKA_STORAGE_ERROR (code 56), retriable.

    Nothing of the refused batches was appended, and what an append had half-written was cut back.  Retry:
    writes resume by themselves, without a restart, once the log directory has room again (retention, a
    deleted topic, a person freeing space).  ``partition``, ``directory`` and ``cause`` say which partition,
    which log directory and why (empty where the refusal came from a remote writer that did not say).
    """

    def __init__(self, message: str, *, partition: str = "", directory: str = "", cause: str = "") -> None:
        super().__init__(message)
        self.partition = partition
        self.directory = directory
        self.cause = cause

    @classmethod
    def for_partition(cls, partition: str, directory: str, cause: str) -> KafkaStorageError:
        """The error for ``partition`` whose log directory ``directory`` cannot take writes because of
        ``cause`` (an ``os.strerror`` text, or the reserve's shortfall)."""
        return cls(
            f"partition {partition}: log directory {directory} cannot take writes: {cause}; nothing was "
            f"appended (KAFKA_STORAGE_ERROR, retriable).  Free space in {directory} (delete topics, lower "
            "retention.ms or retention.bytes): writes resume by themselves",
            partition=partition, directory=directory, cause=cause,
        )


class SwapInProgressError(KafkaStorageError):
    """A reader found a clean's swap (``storage.clean_swap``) unfinished in a partition directory for longer
    than it waits (``LogReader.swap_wait_s``): some offsets are in no ``.log`` file for now, so it read
    nothing rather than read around them.  Retriable: read again.  A swap takes a few fsyncs; one a crash
    left unfinished is finished or undone by the log's next open (restart the partition's writer)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a file system saying it has no room (ENOSPC, EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def describe_os_error(exc: OSError) -> str:
    """``exc`` as a cause: its errno name and text (``ENOSPC: No space left on device``)."""
    code = exc.errno or 0
    return f"{errno.errorcode.get(code, str(code))}: {os.strerror(code)}"
