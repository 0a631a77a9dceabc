"""DeleteRecords in a partition's writer: the log start offset moved forward, published in the state page.

The writer runs it between rounds when the supervisor sends ``{"op": "delete_records", "offset": N}`` (the
broker's DeleteRecords, ``appliance topics delete-records``); the reply's fields go back as
``{"op": "records_deleted", ...}``.
"""

from __future__ import annotations

import logging
from typing import Any

from ipc.kafka.errors import ErrorCode
from ipc.state_page import StatePage
from storage.errors import describe_os_error
from storage.log import Log

__all__ = ["delete_records"]

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
