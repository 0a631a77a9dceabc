"""Helpers shared by the consumer tests (no tests here): a real partition log and state page, written directly
with storage (Log + batch_builder) the way a partition writer does, so the consumer is tested on its own."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.batch_header import COMPRESSION_NONE
from storage.log import Log
from storage.log_config import LogConfig

Headers = tuple[tuple[str, bytes | None], ...]


class Rec(NamedTuple):
    """The oracle's view of a record."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass
class WrittenPartition:
    """A partition log in ``data_dir`` plus its state page, and the list of what was appended."""

    data_dir: str
    topic: str = "t"
    partition: int = 0
    config: LogConfig = field(default_factory=LogConfig)
    records: list[Rec] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names = ShmNames.for_data_dir(self.data_dir)
        self.page_name = self.names.state_page(self.topic, self.partition)
        unlink_shared_memory(self.page_name)
        self.page = StatePage.create(self.page_name)
        self.directory = os.path.join(self.data_dir, f"{self.topic}-{self.partition}")
        self.log = Log.open(self.directory, self.config, topic_partition=(self.topic, self.partition))

    def append(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Headers] | None = None,
        *,
        timestamp_ms: int = 1_700_000_000_000,
        compression: int = COMPRESSION_NONE,
        publish: bool = True,
    ) -> int:
        """Append one batch; publish LEO and HW (= LEO) unless told not to.  Returns its base offset."""
        timestamps = [timestamp_ms + i for i in range(len(values))]
        batch = build_batch(list(values), None if keys is None else list(keys),
                            None if headers is None else [list(h) for h in headers], timestamps,
                            compression=compression)
        info = self.log.append(batch, leader_epoch=0)
        for i, value in enumerate(values):
            self.records.append(Rec(info.first_offset + i, timestamps[i], None if keys is None else keys[i],
                                    value, tuple(headers[i]) if headers is not None else ()))
        if publish:
            self.publish()
        return info.first_offset

    def publish(self, high_watermark: int | None = None) -> None:
        self.page.log_end_offset = self.log.log_end_offset
        self.page.high_watermark = self.log.log_end_offset if high_watermark is None else high_watermark

    def close(self) -> None:
        self.log.close()
        self.page.close()
        self.page.unlink()


def as_recs(records: Sequence[object]) -> list[Rec]:
    """ConsumerRecords -> oracle records."""
    return [Rec(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]  # type: ignore[attr-defined]
