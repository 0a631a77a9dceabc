"""The on-disk log: Kafka RecordBatch v2 batches, segments, indexes, the log, recovery, retention,
idempotent-producer state.  Files and bytes only: this package imports none of the others.

The names below are the package's public surface (guarded by tests/test_public_api.py).  They are
resolved lazily, so importing one submodule does not load the numba kernels of all the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ApplianceError": "storage.errors",
    "BackPressureError": "storage.errors",
    "BrokerConnectionError": "storage.errors",
    "ConfigError": "storage.errors",
    "CorruptRecordError": "storage.errors",
    "InvalidRecordError": "storage.errors",
    "LogLockedError": "storage.errors",
    "NotEnoughReplicasError": "storage.errors",
    "NotLeaderError": "storage.errors",
    "OffsetOutOfRangeError": "storage.errors",
    "ProtocolError": "storage.errors",
    "RequestTimeoutError": "storage.errors",
    "UnknownTopicOrPartitionError": "storage.errors",
    "BatchHeader": "storage.batch_header",
    "validate_batch": "storage.batch_header",
    "parse_header": "storage.batch_header",
    "ByteColumn": "storage.batch_builder",
    "HeaderColumns": "storage.batch_builder",
    "RecordColumns": "storage.batch_builder",
    "build": "storage.batch_builder",
    "build_batch": "storage.batch_builder",
    "build_into": "storage.batch_builder",
    "encoded_size": "storage.batch_builder",
    "max_encoded_size": "storage.batch_builder",
    "Record": "storage.batch_reader",
    "DecodedBatch": "storage.batch_reader",
    "decode_batch": "storage.batch_reader",
    "iter_batches": "storage.batch_reader",
    "iter_records": "storage.batch_reader",
    "Log": "storage.log",
    "AppendInfo": "storage.log",
    "SegmentInfo": "storage.log",
    "FetchSlice": "storage.log",
    "OffsetAndTimestamp": "storage.log",
    "EARLIEST_TIMESTAMP": "storage.log",
    "LATEST_TIMESTAMP": "storage.log",
    "LogReader": "storage.log_reader",
    "open_read_only": "storage.log_reader",
    "LogConfig": "storage.log_config",
    "ProducerStateManager": "storage.producer_state",
    "ProducerIdBlockAllocator": "storage.producer_state",
    "Verdict": "storage.producer_state",
}

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "AppendInfo",
    "ApplianceError",
    "BackPressureError",
    "BatchHeader",
    "BrokerConnectionError",
    "ByteColumn",
    "ConfigError",
    "CorruptRecordError",
    "DecodedBatch",
    "FetchSlice",
    "HeaderColumns",
    "InvalidRecordError",
    "Log",
    "LogConfig",
    "LogLockedError",
    "LogReader",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "ProducerIdBlockAllocator",
    "ProducerStateManager",
    "ProtocolError",
    "Record",
    "RecordColumns",
    "RequestTimeoutError",
    "SegmentInfo",
    "UnknownTopicOrPartitionError",
    "Verdict",
    "build",
    "build_batch",
    "build_into",
    "decode_batch",
    "encoded_size",
    "iter_batches",
    "iter_records",
    "max_encoded_size",
    "open_read_only",
    "parse_header",
    "validate_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
