"""The producer rings of one appliance instance, as the supervisor keeps them, from ``attach`` to unlink.

A ring's life (``ipc.control``, "Lifetime of a ring")::

    attach     the ring is created (named after the partition and a session number unique in this run; its
               capacity the one asked for, within appliance.ring.initial.bytes..appliance.ring.bytes: a
               producer starts small and attaches a larger ring to grow, ``ipc.ring_publisher``), recorded
               under its partition and its control connection, and handed to the partition's writer
               ({"op": "attach", ...}); a restarted writer is handed every ring of its partition again
    detach     (the op, or its connection closed) the ring is marked detaching and the writer is told
               ({"op": "detach", ...}): it drains what was published, then reports {"op": "detached"}
    detached   the ring is forgotten and unlinked (at once, with no writer, if it was attached ahead of need
               and nothing was published into it: ``appliance.server.writer_demand``)
    otherwise  the rings of a deleted topic are unlinked once its writers stopped; every ring left is
               unlinked when the supervisor stops

The supervisor is the only process that creates or unlinks a ring; the producer writes its frames, the
writer reads them.
"""

from __future__ import annotations

import logging

from appliance.server.partitions import Partition, RingRecord
from ipc.ring import RingNames, create_ring, ring_has_frames, unlink_ring
from ipc.ring_layout import ack_slots_for
from ipc.shm import Permissions, ShmNames

__all__ = ["RingTable"]

_log = logging.getLogger("appliance.supervisor")


class RingTable:
    """Every producer ring of the instance, by ring name (each is also in its :attr:`Partition.rings`)."""

    def __init__(self, names: ShmNames, permissions: Permissions, ring_bytes: int) -> None:
        self.names = names
        self.permissions = permissions
        self.ring_bytes = ring_bytes  # the largest capacity a ring gets (appliance.ring.bytes)
        self._records: dict[str, RingRecord] = {}
        self._last_session = 0

    def __len__(self) -> int:
        return len(self._records)

    def get(self, ring: str) -> RingRecord | None:
        return self._records.get(ring)

    def of_connection(self, connection: int) -> list[RingRecord]:
        """The rings attached through control connection ``connection``."""
        return [record for record in self._records.values() if record.connection == connection]

    def attach(self, part: Partition, connection: int, producer_id: int,
               capacity_bytes: int | None = None, *, ahead: bool = False) -> RingRecord:
        """Create a ring of ``capacity_bytes`` (default and at most :attr:`ring_bytes`) on ``part`` for a
        producer on ``connection`` and hand it to the writer.  ``ahead``: attached ahead of need, its first
        frame posts the partition's doorbell (``ipc.ring_setup``)."""
        capacity = min(capacity_bytes or self.ring_bytes, self.ring_bytes)
        self._last_session += 1
        session = self._last_session
        names = RingNames.for_producer(self.names, part.topic, part.partition, session)
        create_ring(names, capacity_bytes=capacity, ack_slots=ack_slots_for(capacity),
                    permissions=self.permissions, wake_on_first_frame=ahead)
        record = RingRecord(names, part.topic, part.partition, session, connection, producer_id, ahead=ahead)
        part.rings[names.ring] = record
        self._records[names.ring] = record
        part.tell_writer(record.attach_command())
        return record

    def detach(self, record: RingRecord, part: Partition | None) -> None:
        """Let the ring go: its writer drains it first (``part``: its partition, None if deleted).  A ring
        attached ahead that no writer runs for and nothing was published into is unlinked at once."""
        if record.detaching:
            return
        record.detaching = True
        if part is None:
            unlink_ring(record.names)
            self._records.pop(record.names.ring, None)
            return
        writer = part.writer
        if record.ahead and not writer.pid and not writer.stopping:
            if not ring_has_frames(record.names):
                part.rings.pop(record.names.ring, None)
                self._records.pop(record.names.ring, None)
                unlink_ring(record.names)
                _log.debug("ring %s detached unused and removed", record.names.ring)
                return
            part.doorbell.ring()  # a producer that died before its post: the writer starts (writer_demand)
        part.tell_writer({"op": "detach", "ring": record.names.ring})

    def detached(self, part: Partition, ring: str) -> None:
        """The writer of ``part`` drained ``ring`` and let it go: unlink it."""
        record = part.rings.pop(ring, None)
        self._records.pop(ring, None)
        if record is not None:
            unlink_ring(record.names)
            _log.debug("ring %s detached and removed", ring)

    def drop_partition(self, part: Partition) -> None:
        """Unlink every ring of a partition being deleted (its writer has stopped)."""
        for record in part.rings.values():
            self._records.pop(record.names.ring, None)
            unlink_ring(record.names)

    def unlink_all(self) -> None:
        """Unlink every ring (the supervisor is stopping; the writers have stopped)."""
        for record in self._records.values():
            unlink_ring(record.names)
        self._records.clear()
