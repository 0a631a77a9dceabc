"""The service and its users: the supervisor (``appliance serve``), partition writers, the broker,
the CLI, and the client library: :class:`Producer` and :class:`Consumer`.

The names below are the package's public surface (guarded by tests/test_public_api.py).  They are
resolved lazily, so importing one submodule does not load the numba kernels of all the others.
"""

from __future__ import annotations

from storage.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "Producer": "appliance.producer",
    "RecordMetadata": "appliance.producer",
    "RecordHandle": "appliance.producer",
    "BulkHandle": "appliance.producer",
    "BulkMetadata": "appliance.producer",
    "Consumer": "appliance.consumer",
    "ConsumerRecord": "appliance.consumer",
    "RecordArrays": "appliance.consumer",
    "TopicPartition": "appliance.consumer",
    "Config": "appliance.config",
    "load_config": "appliance.config",
    "ControlClient": "appliance.control",
    "ControlError": "appliance.control",
    "KafkaAdmin": "appliance.kafka_admin",
}

__all__ = [
    "BulkHandle",
    "BulkMetadata",
    "Config",
    "Consumer",
    "ConsumerRecord",
    "ControlClient",
    "ControlError",
    "KafkaAdmin",
    "Producer",
    "RecordArrays",
    "RecordHandle",
    "RecordMetadata",
    "TopicPartition",
    "load_config",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
