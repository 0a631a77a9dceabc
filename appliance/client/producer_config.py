"""The producer's settings: Kafka's names, Kafka's defaults where they fit, checked once at construction.

Settings (``Producer({...})`` with Kafka's dotted names, or keyword arguments with ``_`` for ``.``):

=========================================== ================ =============================================
``acks``                                    ``all``          0: never wait; 1 / all / -1: the writer's ack
                                                             (the same while partitions have no followers)
``linger.ms``                               5                seal a batch this long after its first record
``batch.size``                              1048576          bytes per batch (Kafka: 16384; see below)
``compression.type``                        ``none``         none, gzip, zstd (snappy and lz4: no)
``compression.zstd.level``                  3                zstd level
``enable.idempotence``                      true             producer id, epoch, sequences: exactly once
``max.block.ms``                            60000            longest wait for ring space / metadata
``delivery.timeout.ms``                     120000           a batch not acked by then fails (outcome unknown)
``request.timeout.ms``                      30000            control-socket requests
``max.in.flight.requests.per.connection``   5                unacknowledged batches per partition
``max.request.size``                        1048576          largest batch (and record) sent
``retries``                                 2147483647       resends of a batch refused with a retriable code
``retry.backoff.ms``                        100              pause before such a resend
``client.id``                               ""               (informational)
``bootstrap.servers``                       ""               a broker over TCP instead of the rings
``appliance.data.dir``                      ``./data``       the appliance's first log dir: its control
                                                             socket is ``<dir>/.appliance.sock``
``appliance.control.socket``                ""               the control socket itself (wins over the dir)
=========================================== ================ =============================================

Why ``batch.size`` defaults to 1 MiB: a batch is built by one numba call straight into the ring, and the fixed
cost per batch (sizing, header, CRC, publish, ack handling: ~30-60 us) is best spread over many records; at
1 MiB it is under 10 ns per 100-byte record.  1 MiB is also Kafka's ``max.request.size``.  ``linger.ms`` still
bounds how long a record waits, so small volumes are not delayed by the larger size.  ``send_many`` cuts its
records into batches of this size; nothing else about it depends on the setting.

Idempotence follows Kafka's rules: it needs ``acks=all``, at most 5 batches in flight and retries.  Left at
its default it is switched off when those are not met (``acks=1`` gives a producer without sequence numbers,
as in Kafka); asked for explicitly (``enable.idempotence=true``) a conflict is a :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from appliance.client.accumulator import RECORD_ESTIMATE_BYTES
from storage.batch_header import COMPRESSION_NONE, COMPRESSION_ZSTD, HEADER_SIZE
from storage.compression import COMPRESSION_GZIP, compress_bound
from storage.errors import ConfigError

__all__ = ["DEFAULTS", "ProducerConfig"]

DEFAULTS: Final[Mapping[str, object]] = {
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1_048_576,  # Kafka: 16384; see the module docstring
    "compression.type": "none",
    "compression.zstd.level": 3,
    "enable.idempotence": True,
    "max.block.ms": 60_000,
    "delivery.timeout.ms": 120_000,
    "request.timeout.ms": 30_000,
    "max.in.flight.requests.per.connection": 5,
    "max.request.size": 1_048_576,
    "retries": 2_147_483_647,
    "retry.backoff.ms": 100,
    "client.id": "",
    "bootstrap.servers": "",
    # The appliance's own: where the local appliance is.  The control socket wins if both are given.
    "appliance.data.dir": "./data",
    "appliance.control.socket": "",
}
_COMPRESSION_CODECS = {"none": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "zstd": COMPRESSION_ZSTD}


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Resolved producer settings (Kafka's names in :data:`DEFAULTS`; see the module docstring)."""

    acks: int  # 0, 1 or -1 (all)
    linger_ms: int
    batch_size: int
    compression: int  # storage codec number
    compression_level: int | None
    idempotent: bool
    max_block_ms: int
    delivery_timeout_ms: int
    request_timeout_ms: int
    max_in_flight: int
    max_request_size: int
    retries: int
    retry_backoff_ms: int
    client_id: str
    bootstrap_servers: str
    control_socket: str

    def batch_room(self, max_message_bytes: int) -> int:
        """Records-section bytes a batch may hold for a topic: ``batch.size``, within ``max.request.size``
        and the topic's ``max.message.bytes``, less a batch header (and zstd/gzip's worst-case growth)."""
        limit = min(self.batch_size, self.max_request_size, max_message_bytes)
        if self.compression != COMPRESSION_NONE:  # incompressible records grow a little
            limit -= compress_bound(self.compression, limit) - limit
        return max(limit - HEADER_SIZE, 0)

    @classmethod
    def from_settings(cls, settings: Mapping[str, object] | None = None, **kwargs: object) -> ProducerConfig:
        """Defaults, then ``settings`` (Kafka names), then ``kwargs`` (``linger_ms=10`` = ``linger.ms``).

        Raises :class:`ConfigError` naming the setting for an unknown name or a bad value.
        """
        given: dict[str, object] = {}
        pairs = list((settings or {}).items()) + [(k.replace("_", "."), v) for k, v in kwargs.items()]
        for key, value in pairs:
            if key not in DEFAULTS:
                near = difflib.get_close_matches(key, list(DEFAULTS), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ConfigError(f"producer setting {key!r} is unknown{hint}")
            given[key] = value
        merged = {**DEFAULTS, **given}
        acks = _acks(merged["acks"])
        linger_ms = _int_setting(merged, "linger.ms", 0)
        max_request_size = _int_setting(merged, "max.request.size", HEADER_SIZE + RECORD_ESTIMATE_BYTES)
        batch_size = min(_int_setting(merged, "batch.size", 0), max_request_size)
        compression_name = str(merged["compression.type"]).lower()
        if compression_name not in _COMPRESSION_CODECS:
            raise ConfigError(
                f"producer setting compression.type={merged['compression.type']!r}: expected one of "
                f"{sorted(_COMPRESSION_CODECS)} (snappy and lz4 are not supported)"
            )
        compression = _COMPRESSION_CODECS[compression_name]
        level = _int_setting(merged, "compression.zstd.level", -131072, 22)
        max_in_flight = _int_setting(merged, "max.in.flight.requests.per.connection", 1)
        retries = _int_setting(merged, "retries", 0)
        explicit = "enable.idempotence" in given
        idempotent = _bool_setting(merged, "enable.idempotence")
        if idempotent:
            conflict = None
            if acks != -1:
                conflict = f"acks={merged['acks']!r} (it needs acks=all)"
            elif max_in_flight > 5:
                conflict = f"max.in.flight.requests.per.connection={max_in_flight} (at most 5)"
            elif retries == 0:
                conflict = "retries=0 (it needs retries)"
            if conflict is not None:
                if explicit:
                    raise ConfigError(f"producer setting enable.idempotence=true conflicts with {conflict}")
                idempotent = False
        data_dir = str(merged["appliance.data.dir"])
        control_socket = str(merged["appliance.control.socket"]) or os.path.join(data_dir, ".appliance.sock")
        return cls(
            acks=acks,
            linger_ms=linger_ms,
            batch_size=batch_size,
            compression=compression,
            compression_level=level if compression == COMPRESSION_ZSTD else None,
            idempotent=idempotent,
            max_block_ms=_int_setting(merged, "max.block.ms", 0),
            delivery_timeout_ms=_int_setting(merged, "delivery.timeout.ms", 1),
            request_timeout_ms=_int_setting(merged, "request.timeout.ms", 1),
            max_in_flight=max_in_flight,
            max_request_size=max_request_size,
            retries=retries,
            retry_backoff_ms=_int_setting(merged, "retry.backoff.ms", 0),
            client_id=str(merged["client.id"]),
            bootstrap_servers=str(merged["bootstrap.servers"]),
            control_socket=os.path.abspath(control_socket),
        )


def _acks(value: object) -> int:
    text = str(value).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ConfigError(f"producer setting acks={value!r}: expected 0, 1, all or -1")


def _int_setting(settings: Mapping[str, object], key: str, minimum: int, maximum: int = 2**63 - 1) -> int:
    value = settings[key]
    try:
        number = int(value) if not isinstance(value, bool) and isinstance(value, (int, str)) else None
    except ValueError:
        number = None
    if number is None or not minimum <= number <= maximum:
        raise ConfigError(
            f"producer setting {key}={value!r}: expected an integer between {minimum} and {maximum}"
        )
    return number


def _bool_setting(settings: Mapping[str, object], key: str) -> bool:
    value = settings[key]
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ConfigError(f"producer setting {key}={value!r}: expected true or false")
