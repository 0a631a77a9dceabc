"""The producer's settings: Kafka's names, Kafka's defaults where they fit, checked once at construction.

:data:`SETTINGS` declares them with the kit of ``appliance.config.settings`` (name, default, range, what
each does); ``Producer({...})`` takes Kafka's dotted names, or keyword arguments with ``_`` for ``.``.  As
in Kafka's clients, numbers and switches may be given as text (``{"linger.ms": "5", "acks": "1"}``).  An
unknown name or a bad value is a :class:`ConfigError` naming the setting.

``batch.size`` defaults to 1 MiB, not Kafka's 16 KiB: a batch is built by one numba call straight into the
ring, and the fixed cost of a batch (sizing, header, CRC, publish, ack handling) is best spread over many
records.  1 MiB is also Kafka's ``max.request.size``.  ``linger.ms`` still bounds how long a record waits,
so small volumes are not delayed by the larger size.  ``send_many`` cuts its records into batches of this
size; nothing else about it depends on the setting.

Idempotence follows Kafka's rules: it needs ``acks=all``, at most 5 batches in flight and retries.  Left at
its default it is switched off when those are not met (``acks=1`` gives a producer without sequence numbers,
as in Kafka); asked for explicitly (``enable.idempotence=true``) a conflict is a :class:`ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from appliance.client.accumulator import RECORD_ESTIMATE_BYTES
from appliance.config.settings import (
    Invalid,
    Origin,
    Setting,
    SettingTable,
    boolean,
    choice,
    client_pairs,
    did_you_mean,
    file_path,
    integer,
    read_settings,
    string_list,
    text,
)
from storage.batch_header import COMPRESSION_NONE, COMPRESSION_ZSTD, HEADER_SIZE
from storage.compression import CODECS_BY_NAME, compress_bound
from storage.errors import ConfigError

__all__ = ["DEFAULTS", "SETTINGS", "ProducerConfig"]

_COMPRESSION_CODECS: Final = CODECS_BY_NAME  # none, gzip, snappy, lz4, zstd
_ORIGIN: Final = Origin("producer setting")


def _acks(value: object) -> object:
    """0, 1, or -1 for all: as a number or as text (``"all"``, ``"-1"``, ``"1"``)."""
    if not isinstance(value, bool) and isinstance(value, int | str):
        word = str(value).strip().lower()
        if word in ("all", "-1"):
            return -1
        if word in ("0", "1"):
            return int(word)
    raise Invalid("expected 0, 1, all or -1")


def _servers(value: object) -> object:
    """HOST:PORT[,HOST:PORT...] as one comma-separated string or a list; "" for none."""
    return ",".join(string_list(value))


SETTINGS: Final = SettingTable((
    Setting("acks", "all", _acks, "0: never wait; 1 / all / -1: the writer's ack (the same while partitions "
                                  "have no followers)"),
    Setting("linger.ms", 5, integer(0, text=True), "seal a batch this long after its first record"),
    Setting("batch.size", 1_048_576, integer(0, text=True),
            "bytes per batch (Kafka: 16384; see the module docstring)"),
    Setting("compression.type", "none", choice(tuple(_COMPRESSION_CODECS)),
            "none, gzip, snappy, lz4 or zstd"),
    Setting("compression.zstd.level", 3, integer(-131072, 22, text=True), "zstd level"),
    Setting("enable.idempotence", True, boolean(text=True), "producer id, epoch, sequences: exactly once"),
    Setting("max.block.ms", 60_000, integer(0, text=True), "longest wait for ring space or metadata"),
    Setting("delivery.timeout.ms", 120_000, integer(1, text=True),
            "a batch not acknowledged by then fails (outcome unknown)"),
    Setting("request.timeout.ms", 30_000, integer(1, text=True), "control-socket requests"),
    Setting("max.in.flight.requests.per.connection", 5, integer(1, text=True),
            "unacknowledged batches per partition"),
    Setting("max.request.size", 1_048_576, integer(HEADER_SIZE + RECORD_ESTIMATE_BYTES, text=True),
            "largest batch (and record) sent"),
    Setting("retries", 2_147_483_647, integer(0, text=True),
            "resends of a batch refused with a retriable code"),
    Setting("retry.backoff.ms", 100, integer(0, text=True), "pause before such a resend"),
    Setting("client.id", "", text, "the producer's name (informational)"),
    Setting("bootstrap.servers", "", _servers, "a broker over TCP instead of the rings"),
    # The appliance's own: where the local appliance is.  The control socket wins if both are given.
    Setting("appliance.data.dir", "./data", file_path,
            "the appliance's first log dir: its control socket is <dir>/.appliance.sock"),
    Setting("appliance.control.socket", "", file_path, "the control socket itself (wins over the dir)"),
))
DEFAULTS: Final[Mapping[str, object]] = {setting.name: setting.default for setting in SETTINGS}


def _unknown(key: str) -> ConfigError:
    return ConfigError(f"producer setting {key!r} is unknown{did_you_mean(SETTINGS.nearest(key))}")


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Resolved producer settings (Kafka's names in :data:`SETTINGS`; see the module docstring)."""

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
        and the topic's ``max.message.bytes``, less a batch header (and the codec's worst-case growth)."""
        limit = min(self.batch_size, self.max_request_size, max_message_bytes)
        if self.compression != COMPRESSION_NONE:  # incompressible records grow a little
            limit -= compress_bound(self.compression, limit) - limit
        return max(limit - HEADER_SIZE, 0)

    @classmethod
    def from_settings(cls, settings: Mapping[str, object] | None = None, **kwargs: object) -> ProducerConfig:
        """Defaults, then ``settings`` (Kafka names), then ``kwargs`` (``linger_ms=10`` = ``linger.ms``).

        Raises :class:`ConfigError` naming the setting for an unknown name or a bad value.
        """
        pairs = client_pairs(settings, kwargs)
        given = read_settings(SETTINGS, pairs, _ORIGIN, _unknown)
        values = {**SETTINGS.defaults(), **given}
        compression = _COMPRESSION_CODECS[str(values["compression.type"])]
        idempotent = _idempotence(values, explicit="enable.idempotence" in given,
                                  acks_given=dict(pairs).get("acks", DEFAULTS["acks"]))
        control_socket = (str(values["appliance.control.socket"])
                          or os.path.join(str(values["appliance.data.dir"]), ".appliance.sock"))
        max_request_size = _int(values, "max.request.size")
        level = _int(values, "compression.zstd.level")
        return cls(
            acks=_int(values, "acks"),
            linger_ms=_int(values, "linger.ms"),
            batch_size=min(_int(values, "batch.size"), max_request_size),
            compression=compression,
            compression_level=level if compression == COMPRESSION_ZSTD else None,
            idempotent=idempotent,
            max_block_ms=_int(values, "max.block.ms"),
            delivery_timeout_ms=_int(values, "delivery.timeout.ms"),
            request_timeout_ms=_int(values, "request.timeout.ms"),
            max_in_flight=_int(values, "max.in.flight.requests.per.connection"),
            max_request_size=max_request_size,
            retries=_int(values, "retries"),
            retry_backoff_ms=_int(values, "retry.backoff.ms"),
            client_id=str(values["client.id"]),
            bootstrap_servers=str(values["bootstrap.servers"]),
            control_socket=os.path.abspath(control_socket),
        )


def _int(values: Mapping[str, object], name: str) -> int:
    value = values[name]
    assert isinstance(value, int)
    return value


def _idempotence(values: Mapping[str, object], *, explicit: bool, acks_given: object) -> bool:
    """``enable.idempotence``, switched off by a conflicting setting unless it was asked for explicitly."""
    if not values["enable.idempotence"]:
        return False
    conflict = None
    max_in_flight = values["max.in.flight.requests.per.connection"]
    if values["acks"] != -1:
        conflict = f"acks={acks_given!r} (it needs acks=all)"
    elif _int(values, "max.in.flight.requests.per.connection") > 5:
        conflict = f"max.in.flight.requests.per.connection={max_in_flight} (at most 5)"
    elif values["retries"] == 0:
        conflict = "retries=0 (it needs retries)"
    if conflict is not None and explicit:
        raise ConfigError(f"producer setting enable.idempotence=true conflicts with {conflict}")
    return conflict is None
