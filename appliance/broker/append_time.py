"""The append time a Produce response reports for a LogAppendTime topic: Kafka's ``log_append_time_ms``.

Kafka's broker answers each partition of a Produce (v2+) with the time it stamped the batch with when the
topic's ``message.timestamp.type`` is ``LogAppendTime``, and -1 for ``CreateTime``; producers hand that time
to the application (librdkafka's delivery report, the Java and kafka-python ``RecordMetadata.timestamp``).

Here the partition's writer stamps the batch (``storage.timestamp_rules``) and acknowledges through the ring
with the base offset only.  The broker learns the time by reading the stamped batch's header back from the
log at the acknowledged offset: the writer wrote those bytes before it acknowledged, so the header is in the
page cache and one offset-index lookup and a ``pread`` or two find it (``storage.log_reader.LogReader``,
read-only, safe while the writer appends).  Only batches of topics this broker sees as LogAppendTime are
read back; a CreateTime topic's batch costs one attribute test.  The stored header decides the answer: its
timestamp-type bit set, its ``maxTimestamp``; else -1 (a topic altered meanwhile answers what was stored).

Which topics are LogAppendTime: :class:`AppendTimeTopics` resolves a topic's effective
``message.timestamp.type`` (its overrides over the server's ``log.message.timestamp.type``) once per
metadata picture of the topic: a refreshed picture (after an AlterConfigs, say) is resolved again.  The
cache holds at most :data:`_CACHED_TOPICS` topics and starts over when full, so deleted topics' pictures do
not pile up in a long-lived broker.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Final

from storage.batch_header import HEADER_SIZE, TIMESTAMP_TYPE_MASK, parse_header
from storage.errors import ApplianceError

if TYPE_CHECKING:
    from appliance.broker.partitions import PartitionHandle, TopicMeta
    from appliance.config.server_config import Config

__all__ = ["NO_APPEND_TIME", "AppendTimeTopics", "stamped_append_time"]

NO_APPEND_TIME: Final = -1  # Kafka's answer for a CreateTime topic (RecordBatch.NO_TIMESTAMP)
_LOG_APPEND_TIME: Final = "LogAppendTime"
_CACHED_TOPICS: Final = 4096

log = logging.getLogger("appliance.broker")


class AppendTimeTopics:
    """Whether a topic's batches are stamped with the append time, per metadata picture of the topic."""

    __slots__ = ("_config", "_known")

    def __init__(self, config: Config) -> None:
        self._config = config
        self._known: dict[str, tuple[TopicMeta, bool]] = {}

    def stamped(self, topic: str, meta: TopicMeta | None) -> bool:
        """True when ``topic`` (described by ``meta``; None: unknown, False) is a LogAppendTime topic."""
        if meta is None:
            return False
        known = self._known.get(topic)
        if known is not None and known[0] is meta:
            return known[1]
        try:
            kind = self._config.topic(topic, meta.configs).message_timestamp_type
        except ApplianceError as e:  # settings the broker cannot read: the writer's own view still applies
            log.warning("produce to %s: cannot read its message.timestamp.type (%s); its Produce responses "
                        "carry log_append_time_ms -1", topic, e)
            kind = ""
        stamped = kind == _LOG_APPEND_TIME
        if len(self._known) >= _CACHED_TOPICS and topic not in self._known:
            self._known.clear()
        self._known[topic] = (meta, stamped)
        return stamped


def stamped_append_time(handle: PartitionHandle, base_offset: int) -> int:
    """The append time the writer stamped the batch at ``base_offset`` of ``handle``'s log with, or
    :data:`NO_APPEND_TIME` if that batch is a CreateTime batch or cannot be read (gone to retention)."""
    try:
        piece = handle.reader.read(base_offset, 1)
        if piece.size_bytes < HEADER_SIZE or piece.first_offset != base_offset:
            return NO_APPEND_TIME
        header = parse_header(os.pread(piece.fd, HEADER_SIZE, piece.position))
    except (ApplianceError, OSError) as e:
        log.debug("produce to %s: append time of offset %d not read back: %s", handle.name, base_offset, e)
        return NO_APPEND_TIME
    return header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else NO_APPEND_TIME
