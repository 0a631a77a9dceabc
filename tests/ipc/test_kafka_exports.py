"""The public surface of ipc.kafka: what the broker and the clients build on.  Changing it is deliberate."""

from __future__ import annotations

import inspect

import ipc.kafka
from ipc.kafka import admin_messages, appliance_messages, group_messages, messages
from ipc.kafka.apis import APIS
from ipc.kafka.schema import Struct

FRONT_DOOR = {
    "APIS",
    "AlterConfigOp",
    "ConfigSource",
    "ConfigType",
    "ResourceType",
    "DEFAULT_MAX_FRAME_BYTES",
    "ApiKey",
    "ApiSpec",
    "ErrorCode",
    "FileRegion",
    "FrameReader",
    "FrameTooLargeError",
    "RecordsValue",
    "Request",
    "RequestHeader",
    "Response",
    "Struct",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "error_name",
    "frame_size",
    "maybe_unsupported_version_reply",
    "peek_correlation_id",
    "supported_api_versions",
}


def message_classes() -> set[str]:
    return {
        name
        for module in (messages, group_messages, admin_messages, appliance_messages)
        for name, obj in vars(module).items()
        if inspect.isclass(obj) and issubclass(obj, Struct) and obj is not Struct
    }


def test_all_is_the_front_door_plus_every_message_class() -> None:
    assert set(ipc.kafka.__all__) == FRONT_DOOR | message_classes()
    assert len(ipc.kafka.__all__) == len(set(ipc.kafka.__all__))
    for name in ipc.kafka.__all__:
        assert hasattr(ipc.kafka, name), name


def test_every_api_request_and_response_is_exported() -> None:
    for spec in APIS.values():
        assert getattr(ipc.kafka, spec.request.__name__) is spec.request
        assert getattr(ipc.kafka, spec.response.__name__) is spec.response
