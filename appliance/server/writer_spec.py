"""What the supervisor decides for a partition's writer before it forks it: :class:`WriterSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from storage.log_config import LogConfig
from storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS

__all__ = ["DEFAULT_PEEK_BYTES", "WriterSpec"]

DEFAULT_PEEK_BYTES: Final = 4 << 20  # per ring and round; a round appends at most rings x this


@dataclass(frozen=True, slots=True)
class WriterSpec:
    """Everything a writer needs, decided by the supervisor before the fork."""

    topic: str
    partition: int
    directory: str  # the partition's log directory
    log_config: LogConfig
    leader_epoch: int  # appends are stamped with it
    state_page: str  # shared-memory name of the partition state page (created by the supervisor)
    doorbell: str  # the writer's semaphore (created by the supervisor)
    publish_high_watermark: bool = True  # replication factor 1: HW = LEO, written by the writer
    retention_check_interval_ms: int = 300_000
    retention_enabled: bool = True  # cleanup.policy includes delete
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    peek_bytes: int = DEFAULT_PEEK_BYTES
    broker_wake_fd: int = -1  # the broker's wake-up eventfd, added to after each round with work (-1: none)
    log_dir_min_free_bytes: int = 0  # log.dir.min.free.bytes of the partition's log dir (0: no reserve)
    test_faults: tuple[str, ...] = ()  # appliance.test.faults (tests only; "writer.stall" is the writer's)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"
