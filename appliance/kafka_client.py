"""The blocking Kafka protocol client, re-exported from :mod:`ipc.kafka_client` (where ``replicas`` can use it
too) so ``from appliance.kafka_client import KafkaConnection`` keeps working.  ``BrokerConnectionError`` is
in the project's error tree, :mod:`storage.errors`."""

from __future__ import annotations

from ipc.kafka_client import (
    DEFAULT_CLIENT_ID,
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT_MS,
    BodyObserver,
    KafkaConnection,
    parse_bootstrap_servers,
)
from storage.errors import BrokerConnectionError

__all__ = [
    "DEFAULT_CLIENT_ID",
    "DEFAULT_CONNECT_TIMEOUT_MS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "BodyObserver",
    "BrokerConnectionError",
    "KafkaConnection",
    "parse_bootstrap_servers",
]
