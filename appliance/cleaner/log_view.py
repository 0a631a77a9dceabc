"""A read-only view of one partition log for the cleaner process, whose swaps go to the log's owner.

The cleaner never opens a :class:`storage.log.Log`: a log has one writer (its ``.lock``), the partition's
writer process or, while none runs, nobody.  :class:`LogView` is what ``storage.cleaner.clean_log`` needs
of a log (:class:`storage.cleaner.CleanableLog`) built from a listing of the directory and the partition's
state page:

* ``segments``: the ``.log`` files, oldest first; a closed segment's ``next_offset`` is the next segment's
  base offset (segments cover the offsets without holes between them), its ``max_timestamp`` the file's
  modification time (when its last batch was appended: what ``min.compaction.lag.ms`` and
  ``max.compaction.lag.ms`` measure here); the last one is the active segment;
* ``log_start_offset`` and ``log_end_offset``: the state page's (their writers publish them);
* ``swap_cleaned``: the ``Swap`` callable given, which asks the supervisor to have the owner swap the
  pass's groups (``appliance.server.clean_handoff``), with the sizes of the replaced segments as listed, so a
  segment
  deleted or replaced since (retention, DeleteRecords) refuses the swap instead of losing data.

:func:`list_view` returns None while a swap is in flight in the directory (``*.deleted`` or ``*.swap``
files): the pass is left for a later round.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ipc.state_page import StatePage
from storage.clean_swap import DELETED_SUFFIX, SWAP_SUFFIX, SwapGroup
from storage.log_config import LogConfig
from storage.log_dir import segment_base_offsets
from storage.segment import LOG_SUFFIX, segment_path
from storage.segment_list import SegmentInfo

__all__ = ["LogView", "Swap", "list_view"]

# groups, each [base offset, replaced base offsets, their sizes as listed] -> None, or raises CleanRefused
Swap = Callable[[list[list[Any]]], None]


@dataclass
class LogView:
    """One partition log as the cleaner sees it (see the module docstring)."""

    directory: str
    config: LogConfig
    topic_partition: tuple[str, int]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    segments: list[SegmentInfo]
    swap: Swap

    def swap_cleaned(self, groups: Sequence[SwapGroup]) -> None:
        sizes = {s.base_offset: s.size_bytes for s in self.segments}
        self.swap([[base, list(replaced), [sizes[b] for b in replaced]] for base, replaced in groups])

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)


def list_view(directory: str, config: LogConfig, topic_partition: tuple[str, int], page: StatePage,
              swap: Swap) -> LogView | None:
    """The log in ``directory`` as listed now, or None while a swap is in flight there (or it has no
    segment); FileNotFoundError if a segment went while it was listed (try again later)."""
    names = os.listdir(directory)
    if any(n.endswith((DELETED_SUFFIX, SWAP_SUFFIX)) for n in names):
        return None
    bases = segment_base_offsets(names)
    if not bases:
        return None
    end = page.log_end_offset
    infos = []
    for i, base in enumerate(bases):
        path = segment_path(directory, base, LOG_SUFFIX)
        stat = os.stat(path)
        last = i == len(bases) - 1
        next_offset = max(end, base) if last else bases[i + 1]
        infos.append(SegmentInfo(base, path, stat.st_size, next_offset, stat.st_mtime_ns // 1_000_000, last))
    start = max(page.log_start_offset, bases[0])
    return LogView(directory, config, topic_partition, start, max(end, start), page.high_watermark, infos,
                   swap)
