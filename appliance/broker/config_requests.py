"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs: a topic's settings, and the broker's, over Kafka.

Each handler is a plain function ``(ctx, header, request body) -> response body``, as in
``appliance.broker.handlers``; each resource of a request is answered on its own (its error in its result).

**Describing a topic** lists every row of the settings catalog (``appliance.config.topic_configs``), or the
keys asked for (a key the catalog lacks is left out, as Kafka does), each with where its value comes from:

* ``TOPIC_CONFIG`` -- the topic's own override (CreateTopics, AlterConfigs, ``[topics.NAME]``);
* ``STATIC_BROKER_CONFIG`` -- the server's setting the topic falls back to, when it differs from the
  appliance's default (the broker cannot tell a value written in the file equal to the default from an
  absent one: both are ``DEFAULT_CONFIG``);
* ``DEFAULT_CONFIG`` -- the appliance's default (Kafka's, except where docs/configuration.md says).

Synonyms (v1+, when asked) list the sources most specific first: the topic's override, the broker setting
under Kafka's broker name (``log.retention.ms``), the default.  ``config_type`` and ``documentation`` (v3+)
come from the catalog: the documentation says what the appliance does with the setting.  No topic setting
is read-only or sensitive.

**Describing the broker** (resource name: this node's id, or ``""``) lists the server's settings, read-only:
they are changed in the configuration file, with a restart.  Another node's id is INVALID_REQUEST.

**Altering a topic**: AlterConfigs replaces the topic's stored overrides with the given set;
IncrementalAlterConfigs applies SET and DELETE to them, and APPEND / SUBTRACT to a list setting's current
value (``cleanup.policy``; another setting is INVALID_CONFIG).  The new set is validated whole by the
supervisor (``appliance.server.topic_admin``): a bad key or value is INVALID_CONFIG naming it, and nothing
changes; ``validate_only`` stops there.  The change takes effect without a restart; the broker reloads its
topic view before answering.  **Altering the broker** is INVALID_REQUEST: dynamic broker settings are not
built (set them in the configuration file and restart).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from appliance.broker.cluster import ClusterError
from appliance.broker.handlers import BrokerContext, Handler
from appliance.config.server_config import check_topic_name
from appliance.config.server_settings import SETTINGS
from appliance.config.settings import Setting
from appliance.config.topic_configs import CATALOG, Behaviour, TopicSetting, kafka_value
from ipc.kafka import (
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    ApiKey,
    ConfigSource,
    ConfigType,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
    ErrorCode,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    RequestHeader,
    ResourceType,
)

__all__ = ["CONFIG_HANDLERS", "NO_DYNAMIC_BROKER_CONFIGS"]

log = logging.getLogger("appliance.broker")

NO_DYNAMIC_BROKER_CONFIGS: Final = (
    "dynamic broker settings are not supported; set them in the server file and restart"
)
_LIST_SETTINGS: Final = frozenset(row.name for row in CATALOG if row.type == ConfigType.LIST)


# -- DescribeConfigs -------------------------------------------------------------------------------------


def describe_configs(
    ctx: BrokerContext, header: RequestHeader, body: DescribeConfigsRequest
) -> DescribeConfigsResponse:
    synonyms = header.api_version >= 1 and body.include_synonyms
    results = [_describe(ctx, resource, synonyms) for resource in body.resources]
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


def _describe(ctx: BrokerContext, resource: DescribeConfigsResource, synonyms: bool) -> DescribeConfigsResult:
    out = DescribeConfigsResult(error_code=ErrorCode.NONE, resource_type=resource.resource_type,
                                resource_name=resource.resource_name, configs=[])  # fmt: skip
    keys = None if resource.configuration_keys is None else set(resource.configuration_keys)
    if resource.resource_type == ResourceType.TOPIC:
        code, message, overrides = _topic_overrides(ctx, resource.resource_name)
        if code != ErrorCode.NONE:
            out.error_code, out.error_message = code, message
            return out
        out.configs = [_topic_entry(ctx, row, overrides, synonyms) for row in CATALOG
                       if keys is None or row.name in keys]  # fmt: skip
    elif resource.resource_type == ResourceType.BROKER:
        refusal = _other_broker(ctx, resource.resource_name)
        if refusal is not None:
            out.error_code, out.error_message = ErrorCode.INVALID_REQUEST, refusal
            return out
        values = ctx.config.settings()
        out.configs = [_broker_entry(ctx, s, values[s.name], synonyms) for s in SETTINGS
                       if keys is None or s.name in keys]  # fmt: skip
    else:
        out.error_code = ErrorCode.INVALID_REQUEST
        out.error_message = f"resource type {resource.resource_type}: only topics (2) and brokers (4)"
    return out


def _topic_overrides(ctx: BrokerContext, name: str) -> tuple[ErrorCode, str | None, Mapping[str, object]]:
    """(error, message, the topic's overrides) of a topic resource."""
    reason = check_topic_name(name)
    if reason is not None:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {reason}", {}
    ctx.refresh_topics()
    meta = ctx.table.topics.get(name)
    if meta is None:
        ctx.refresh_topics(soon=True)
        meta = ctx.table.topics.get(name)
    if meta is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist", {}
    return ErrorCode.NONE, None, meta.configs


def _topic_entry(ctx: BrokerContext, row: TopicSetting, overrides: Mapping[str, object],
                 synonyms: bool) -> DescribeConfigsResourceResult:  # fmt: skip
    chain = _topic_sources(ctx, row, overrides)
    value, source = chain[0][1], chain[0][2]
    documentation = row.behaviour.value + (": " + row.note if row.note else "")
    if row.behaviour is Behaviour.REFUSED:
        documentation = "refused " + row.note
    return DescribeConfigsResourceResult(
        name=row.name, value=value, read_only=False, is_default=source == ConfigSource.DEFAULT_CONFIG,
        config_source=source, is_sensitive=False,
        synonyms=[DescribeConfigsSynonym(n, v, s) for n, v, s in chain] if synonyms else [],
        config_type=row.type, documentation=documentation,
    )  # fmt: skip


def _topic_sources(ctx: BrokerContext, row: TopicSetting,
                   overrides: Mapping[str, object]) -> list[tuple[str, str | None, int]]:  # fmt: skip
    """(name, value, source) of every source of the topic setting ``row``, most specific first."""
    chain: list[tuple[str, str | None, int]] = []
    if row.name in overrides:
        chain.append((row.name, kafka_value(overrides[row.name]), ConfigSource.TOPIC_CONFIG))
    found = SETTINGS.find(row.broker) if row.broker else None
    if found is not None:
        setting = found.setting
        value = ctx.config.settings()[setting.name]
        default = _converted_default(setting)
        broker_name = row.broker or setting.name
        if value != default:
            chain.append((broker_name, kafka_value(value), ConfigSource.STATIC_BROKER_CONFIG))
        chain.append((broker_name, kafka_value(default), ConfigSource.DEFAULT_CONFIG))
    else:  # a setting the server file has no row for: Kafka's default applies
        chain.append((row.broker or row.name, row.kafka_default.split(" (")[0], ConfigSource.DEFAULT_CONFIG))
    return chain


def _broker_entry(ctx: BrokerContext, setting: Setting, value: object,
                  synonyms: bool) -> DescribeConfigsResourceResult:  # fmt: skip
    default = _converted_default(setting)
    static = default is not _UNKNOWN and value != default
    source = ConfigSource.STATIC_BROKER_CONFIG if static else ConfigSource.DEFAULT_CONFIG
    shown = None if value is None else kafka_value(value)
    return DescribeConfigsResourceResult(
        name=setting.name, value=shown, read_only=True, is_default=not static, config_source=source,
        is_sensitive=False,
        synonyms=[DescribeConfigsSynonym(setting.name, shown, source)] if synonyms else [],
        config_type=_config_type(value), documentation=setting.doc,
    )  # fmt: skip


_UNKNOWN: Final = object()  # a default computed from other settings (the sockets under the first log dir)


def _converted_default(setting: Setting) -> object:
    """The setting's default as :meth:`Config.settings` shows a value (lists as lists)."""
    try:
        value = setting.convert(setting.default)
    except Exception:  # a derived default: nothing to compare with
        return _UNKNOWN
    if isinstance(value, tuple):
        listeners = setting.attr in ("listeners", "advertised_listeners")
        value = [str(v) for v in value] if listeners else list(value)
    return value if type(value).__module__ == "builtins" else _UNKNOWN


def _config_type(value: object) -> int:
    if isinstance(value, bool):
        return ConfigType.BOOLEAN
    if isinstance(value, int):
        return ConfigType.LONG
    if isinstance(value, float):
        return ConfigType.DOUBLE
    if isinstance(value, list | tuple):
        return ConfigType.LIST
    return ConfigType.STRING


def _other_broker(ctx: BrokerContext, name: str) -> str | None:
    """Why a broker resource is not this node, or None."""
    if name in ("", str(ctx.node_id)):
        return None
    return f"broker {name!r} is not this node (node.id {ctx.node_id}): ask that broker"


# -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------------------


def alter_configs(
    ctx: BrokerContext, header: RequestHeader, body: AlterConfigsRequest
) -> AlterConfigsResponse:
    responses = []
    for resource in body.resources:
        given = {c.name: c.value for c in resource.configs}
        change = _Change(set={k: v for k, v in given.items() if v is not None},
                         delete=[k for k, v in given.items() if v is None], replace=True)  # fmt: skip
        name, kind = resource.resource_name, resource.resource_type
        responses.append(_alter(ctx, kind, name, change, body.validate_only))
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)


def incremental_alter_configs(
    ctx: BrokerContext, header: RequestHeader, body: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    responses = []
    for resource in body.resources:
        change = _incremental_change(ctx, resource.resource_type, resource.resource_name, resource.configs)
        if isinstance(change, AlterConfigsResourceResponse):
            responses.append(change)
            continue
        name, kind = resource.resource_name, resource.resource_type
        responses.append(_alter(ctx, kind, name, change, body.validate_only))
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)


@dataclass
class _Change:
    """What to ask the supervisor for: values to set, keys to reset, whether the rest is reset too."""

    set: dict[str, str]
    delete: list[str]
    replace: bool


def _incremental_change(ctx: BrokerContext, resource_type: int, name: str,
                        configs: Sequence[Any]) -> _Change | AlterConfigsResourceResponse:  # fmt: skip
    """The change IncrementalAlterConfigs asks for, APPEND / SUBTRACT resolved against the current value."""
    change = _Change({}, [], replace=False)
    seen: set[str] = set()
    for config in configs:
        if config.name in seen:
            return _refused(resource_type, name, ErrorCode.INVALID_REQUEST,
                            f"{config.name} appears more than once in the request")  # fmt: skip
        seen.add(config.name)
        op = config.config_operation
        if op == AlterConfigOp.SET and config.value is not None:
            change.set[config.name] = config.value
        elif op == AlterConfigOp.DELETE or op == AlterConfigOp.SET:
            change.delete.append(config.name)
        elif op in (AlterConfigOp.APPEND, AlterConfigOp.SUBTRACT):
            if config.name not in _LIST_SETTINGS:
                return _refused(resource_type, name, ErrorCode.INVALID_CONFIG,
                                f"{config.name}: {AlterConfigOp(op).name} applies to list settings only "
                                f"({', '.join(sorted(_LIST_SETTINGS))}); use SET")  # fmt: skip
            current = _current_list(ctx, name, config.name) if resource_type == ResourceType.TOPIC else []
            items = [item.strip() for item in (config.value or "").split(",") if item.strip()]
            if op == AlterConfigOp.APPEND:
                current += [item for item in items if item not in current]
            else:
                current = [item for item in current if item not in items]
            change.set[config.name] = ",".join(current)
        else:
            return _refused(resource_type, name, ErrorCode.INVALID_REQUEST,
                            f"{config.name}: unknown operation {op}")  # fmt: skip
    return change


def _current_list(ctx: BrokerContext, topic: str, key: str) -> list[str]:
    """The topic's current value of the list setting ``key``, as items."""
    code, _, overrides = _topic_overrides(ctx, topic)
    row = next(r for r in CATALOG if r.name == key)
    value = _topic_sources(ctx, row, overrides)[0][1] if code == ErrorCode.NONE else ""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _alter(ctx: BrokerContext, resource_type: int, name: str, change: _Change,
           validate_only: bool) -> AlterConfigsResourceResponse:  # fmt: skip
    if resource_type == ResourceType.BROKER:
        return _refused(resource_type, name, ErrorCode.INVALID_REQUEST, NO_DYNAMIC_BROKER_CONFIGS)
    if resource_type != ResourceType.TOPIC:
        return _refused(resource_type, name, ErrorCode.INVALID_REQUEST,
                        f"resource type {resource_type}: only topics (2) can be altered")  # fmt: skip
    code, message, _ = _topic_overrides(ctx, name)
    if code != ErrorCode.NONE:
        return _refused(resource_type, name, code, message)
    try:
        ctx.cluster.alter_topic_configs(name, change.set, change.delete, replace=change.replace,
                                        validate_only=validate_only)  # fmt: skip
    except ClusterError as e:
        log.info("alter configs of topic %r refused: %s", name, e)
        return _refused(resource_type, name, e.code, str(e))
    if not validate_only:
        log.info("topic %r: settings altered (set %s, reset %s)", name, sorted(change.set), change.delete)
        ctx.reload_topics()
    return AlterConfigsResourceResponse(error_code=ErrorCode.NONE, resource_type=resource_type,
                                        resource_name=name)  # fmt: skip


def _refused(resource_type: int, name: str, code: int, message: str | None) -> AlterConfigsResourceResponse:
    return AlterConfigsResourceResponse(error_code=code, error_message=message, resource_type=resource_type,
                                        resource_name=name)  # fmt: skip


CONFIG_HANDLERS: dict[int, Handler] = {
    ApiKey.DESCRIBE_CONFIGS: describe_configs,
    ApiKey.ALTER_CONFIGS: alter_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: incremental_alter_configs,
}
