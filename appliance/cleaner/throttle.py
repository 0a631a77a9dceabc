"""The cleaner's I/O throttle: ``log.cleaner.io.max.bytes.per.second`` over the bytes read plus written.

Kafka's ``Throttler`` in one small class: :meth:`Throttle.__call__` is told the bytes just read or written
(``storage.cleaner.clean_log``'s ``io_throttle`` hook: after each segment read for the offset map and each
segment rewritten); once a check period has passed it compares the bytes of the period with what the rate
allows and sleeps off the excess.  A rate at or above :data:`NO_LIMIT_BYTES_PER_S` (Kafka's default, the
largest double) never sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

__all__ = ["NO_LIMIT_BYTES_PER_S", "Throttle"]

NO_LIMIT_BYTES_PER_S: Final = 1e300
_CHECK_PERIOD_S: Final = 0.3


class Throttle:
    """Sleeps so that the bytes reported average at most ``bytes_per_s``."""

    def __init__(self, bytes_per_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:  # fmt: skip
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._period_start_s = clock()
        self._period_bytes = 0
        self.slept_s = 0.0  # in total, for the cleaner's log line

    def __call__(self, nbytes: int) -> None:
        if self.bytes_per_s >= NO_LIMIT_BYTES_PER_S:
            return
        self._period_bytes += nbytes
        elapsed = self._clock() - self._period_start_s
        if elapsed < _CHECK_PERIOD_S and self._period_bytes < self.bytes_per_s * _CHECK_PERIOD_S:
            return
        wanted = self._period_bytes / self.bytes_per_s
        if wanted > elapsed:
            self._sleep(wanted - elapsed)
            self.slept_s += wanted - elapsed
        self._period_start_s = self._clock()
        self._period_bytes = 0
