"""The service and its users: the supervisor (``appliance serve``), partition writers, the broker,
the CLI, and the client library: :class:`Producer` and :class:`Consumer`.

The names below are the package's public surface (guarded by tests/test_public_api.py).  They are
resolved lazily, so importing one submodule does not load the numba kernels of all the others.
"""

from __future__ import annotations

from storage.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "Producer": "appliance.client.producer",
    "RecordMetadata": "appliance.client.producer",
    "RecordHandle": "appliance.client.producer",
    "BulkHandle": "appliance.client.producer",
    "BulkMetadata": "appliance.client.producer",
    "Consumer": "appliance.client.consumer",
    "ConsumerRecord": "appliance.client.consumer",
    "RecordArrays": "appliance.client.consumer",
    "TopicPartition": "appliance.client.consumer",
    "GroupError": "appliance.client.group_member",
    "Config": "appliance.config.server_config",
    "load_config": "appliance.config.server_config",
    "ControlClient": "ipc.control",
    "ControlError": "ipc.control",
    "KafkaAdmin": "appliance.client.admin",
}

__all__ = [
    "BulkHandle",
    "BulkMetadata",
    "Config",
    "Consumer",
    "ConsumerRecord",
    "ControlClient",
    "ControlError",
    "GroupError",
    "KafkaAdmin",
    "Producer",
    "RecordArrays",
    "RecordHandle",
    "RecordMetadata",
    "TopicPartition",
    "load_config",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
