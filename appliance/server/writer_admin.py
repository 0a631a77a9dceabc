"""Commands a partition's writer runs between rounds on its log for others.

* DeleteRecords: the log start offset moved forward, published in the state page.  The supervisor sends
  ``{"op": "delete_records", "offset": N}`` (the broker's DeleteRecords, ``appliance topics
  delete-records``); the reply's fields go back as ``{"op": "records_deleted", ...}``.
* Cleaned segments swapped in, in one swap: ``{"op": "swap_cleaned", "groups": [[B, [replaced...],
  [sizes...]], ...]}`` (the cleaner process wrote them aside: ``appliance.server.clean_handoff``); the
  reply's fields go back as ``{"op": "cleaned_swapped", ...}``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from ipc.kafka.errors import ErrorCode
from ipc.state_page import StatePage
from storage.clean_swap import SwapGroup, cleaned_paths
from storage.errors import ApplianceError, describe_os_error
from storage.log import Log

__all__ = ["check_replaced", "delete_records", "swap_cleaned"]

_log = logging.getLogger("appliance.writer")


def delete_records(log: Log, page: StatePage, name: str, offset: int) -> dict[str, Any]:
    """Move ``log``'s start offset to ``offset`` (segments wholly below it are deleted) and publish it in
    ``page``; the reply's fields (``low_watermark``, or the error: above the high watermark, a failed
    write)."""
    high_watermark = page.high_watermark
    if offset > high_watermark:
        return {"ok": False, "error": ErrorCode.OFFSET_OUT_OF_RANGE.name,
                "message": f"partition {name}: offset {offset} is above the high watermark "
                           f"{high_watermark}; records can be deleted up to it"}  # fmt: skip
    try:
        log.increment_log_start_offset(offset)
    except OSError as exc:
        return {"ok": False, "error": ErrorCode.KAFKA_STORAGE_ERROR.name,
                "message": f"partition {name}: moving the log start offset to {offset}: "
                           f"{describe_os_error(exc)}"}  # fmt: skip
    start = log.log_start_offset
    page.log_start_offset = start
    _log.info("writer %s: records deleted below offset %d (DeleteRecords)", name, start)
    return {"ok": True, "low_watermark": start}


def swap_cleaned(log: Log, name: str, groups: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Swap each group's segment, cleaned at ``base_offset``, in for ``replaced`` (``groups``: ``[base_offset,
    replaced, sizes]``), in one swap (``Log.swap_cleaned``), if they all are still closed segments of ``log``
    of ``sizes`` bytes; the reply's fields (or why it was refused)."""
    infos = {s.base_offset: s for s in log.segments}
    for base_offset, replaced, sizes in groups:
        refused = check_replaced(log.directory, list(infos), name, int(base_offset), list(replaced),
                                 list(sizes), lambda base: infos[base].size_bytes)
        if refused is not None:
            return {"ok": False, "error": ErrorCode.KAFKA_STORAGE_ERROR.name, "message": refused}
    try:
        log.swap_cleaned([SwapGroup(int(g[0]), tuple(g[1])) for g in groups])
    except (OSError, ValueError, ApplianceError) as exc:  # a full log dir refuses it: KafkaStorageError
        why = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        return {"ok": False, "error": ErrorCode.KAFKA_STORAGE_ERROR.name,
                "message": f"partition {name}: swapping in the segments cleaned at {[g[0] for g in groups]}: "
                           f"{why}"}  # fmt: skip
    return {"ok": True}


def check_replaced(directory: str, bases: Sequence[int], name: str, base_offset: int, replaced: Sequence[int],
                   sizes: Sequence[int], size_of: Callable[[int], int]) -> str | None:
    """Why the swap of ``replaced`` (of ``sizes``) by the segment cleaned at ``base_offset`` is refused,
    given the log's segment ``bases`` (the last is the active segment) and ``size_of(base)``; None: go."""
    if replaced[0] != base_offset or base_offset not in bases:
        return f"partition {name}: no segment at offset {base_offset} any more (retention or DeleteRecords)"
    i = bases.index(base_offset)
    if list(bases[i:i + len(replaced)]) != list(replaced) or i + len(replaced) >= len(bases):
        return (f"partition {name}: segments {list(replaced)} are no longer consecutive closed segments "
                f"of the log (it has {list(bases)})")
    for base, size in zip(replaced, sizes, strict=True):
        if size_of(base) != size:
            return f"partition {name}: segment {base} changed since the cleaner read it ({size} bytes then)"
    if not os.path.exists(cleaned_paths(directory, base_offset)[0]):
        return f"partition {name}: the cleaned segment at {base_offset} is gone (the log was opened again)"
    return None
