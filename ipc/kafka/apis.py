"""Which APIs and versions this codec speaks, and the header rules that depend on them.

One table, :data:`APIS`: api key -> :class:`ApiSpec` (request and response classes, the version range we
speak, and the first *flexible* version of that API in Apache Kafka).  Everything else -- the ApiVersions
response a broker sends, which request and response header version a frame carries, whether a version is
supported -- is derived from it.

Versions stay below each API's flexible version (so bodies use the classic encodings), except ApiVersions,
which we speak up to v3 (flexible) because kafka-python's version probe needs it, and DescribeConfigs,
spoken up to v4 (flexible), the version Kafka's own AdminClient asks for first.

**Advertised.** An API the codec speaks is in ApiVersions only when ``advertised``: the broker answers it,
up to ``advertised_max_version`` when that is lower than what the codec speaks.  DescribeConfigs is
advertised up to v3, its last non-flexible version (the broker answers the classic encodings); the codec's
v4 is for the admin client talking to brokers that offer it.  The configuration and partition-administration
APIs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions, DeleteRecords) are answered
by ``appliance.broker.config_requests`` and ``appliance.broker.partition_requests``.

Header versions (Kafka's ``MessageType.requestHeaderVersion`` / ``responseHeaderVersion``):

* request header v2 (with tagged fields) iff the API version is at or above the API's first flexible
  version in Kafka -- decided from Kafka's number even for versions we do not speak, so the header of an
  unsupported request still parses and its correlation id can be answered;
* response header v1 iff flexible, except ApiVersions, whose response header is always v0 (a client that
  does not yet know the broker's versions must be able to read it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ipc.kafka import admin_messages as a
from ipc.kafka import group_messages as g
from ipc.kafka import messages as m
from ipc.kafka.schema import Struct

__all__ = [
    "APIS",
    "ApiKey",
    "ApiSpec",
    "api_for_request",
    "api_for_response",
    "supported_api_versions",
]


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One API: its key, its messages and the versions we speak (inclusive)."""

    api_key: ApiKey
    request: type[Struct]
    response: type[Struct]
    min_version: int
    max_version: int
    first_flexible_version: int | None  # Kafka's, from the JSON's "flexibleVersions"; None = never
    advertised: bool = True  # listed in ApiVersions: the broker answers it (module docstring)
    advertised_max_version: int | None = None  # below max_version: the versions the broker answers

    @property
    def max_advertised(self) -> int:
        return self.max_version if self.advertised_max_version is None else self.advertised_max_version

    @property
    def name(self) -> str:
        return self.request.__name__.removesuffix("Request")

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible_version is not None and version >= self.first_flexible_version

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        if self.api_key == ApiKey.API_VERSIONS:
            return 0
        return 1 if self.is_flexible(version) else 0


_K = ApiKey
APIS: dict[int, ApiSpec] = {
    spec.api_key: spec
    for spec in (
        ApiSpec(_K.PRODUCE, m.ProduceRequest, m.ProduceResponse, 3, 8, 9),
        ApiSpec(_K.FETCH, m.FetchRequest, m.FetchResponse, 4, 11, 12),
        ApiSpec(_K.LIST_OFFSETS, m.ListOffsetsRequest, m.ListOffsetsResponse, 1, 7, 6),
        ApiSpec(_K.METADATA, m.MetadataRequest, m.MetadataResponse, 1, 8, 9),
        ApiSpec(_K.OFFSET_COMMIT, g.OffsetCommitRequest, g.OffsetCommitResponse, 0, 7, 8),
        ApiSpec(_K.OFFSET_FETCH, g.OffsetFetchRequest, g.OffsetFetchResponse, 0, 5, 6),
        ApiSpec(_K.FIND_COORDINATOR, g.FindCoordinatorRequest, g.FindCoordinatorResponse, 0, 2, 3),
        ApiSpec(_K.JOIN_GROUP, g.JoinGroupRequest, g.JoinGroupResponse, 0, 5, 6),
        ApiSpec(_K.HEARTBEAT, g.HeartbeatRequest, g.HeartbeatResponse, 0, 3, 4),
        ApiSpec(_K.LEAVE_GROUP, g.LeaveGroupRequest, g.LeaveGroupResponse, 0, 3, 4),
        ApiSpec(_K.SYNC_GROUP, g.SyncGroupRequest, g.SyncGroupResponse, 0, 3, 4),
        ApiSpec(_K.DESCRIBE_GROUPS, g.DescribeGroupsRequest, g.DescribeGroupsResponse, 0, 4, 5),
        ApiSpec(_K.LIST_GROUPS, g.ListGroupsRequest, g.ListGroupsResponse, 0, 2, 3),
        ApiSpec(_K.DELETE_GROUPS, g.DeleteGroupsRequest, g.DeleteGroupsResponse, 0, 1, 2),
        ApiSpec(_K.OFFSET_DELETE, g.OffsetDeleteRequest, g.OffsetDeleteResponse, 0, 0, None),
        ApiSpec(_K.SASL_HANDSHAKE, g.SaslHandshakeRequest, g.SaslHandshakeResponse, 0, 1, None),
        ApiSpec(_K.API_VERSIONS, m.ApiVersionsRequest, m.ApiVersionsResponse, 0, 3, 3),
        ApiSpec(_K.CREATE_TOPICS, m.CreateTopicsRequest, m.CreateTopicsResponse, 0, 4, 5),
        ApiSpec(_K.DELETE_TOPICS, m.DeleteTopicsRequest, m.DeleteTopicsResponse, 0, 3, 4),
        ApiSpec(_K.INIT_PRODUCER_ID, m.InitProducerIdRequest, m.InitProducerIdResponse, 0, 1, 2),
        ApiSpec(
            _K.OFFSET_FOR_LEADER_EPOCH, m.OffsetForLeaderEpochRequest, m.OffsetForLeaderEpochResponse, 0, 3, 4
        ),
        ApiSpec(_K.DESCRIBE_LOG_DIRS, m.DescribeLogDirsRequest, m.DescribeLogDirsResponse, 0, 1, 2),
        ApiSpec(_K.SASL_AUTHENTICATE, g.SaslAuthenticateRequest, g.SaslAuthenticateResponse, 0, 1, 2),
        # the configuration and partition-administration APIs (module docstring)
        ApiSpec(_K.DELETE_RECORDS, a.DeleteRecordsRequest, a.DeleteRecordsResponse, 0, 1, 2),
        ApiSpec(_K.DESCRIBE_CONFIGS, a.DescribeConfigsRequest, a.DescribeConfigsResponse, 0, 4, 4,
                advertised_max_version=3),
        ApiSpec(_K.ALTER_CONFIGS, a.AlterConfigsRequest, a.AlterConfigsResponse, 0, 1, 2),
        ApiSpec(_K.CREATE_PARTITIONS, a.CreatePartitionsRequest, a.CreatePartitionsResponse, 0, 1, 2),
        ApiSpec(
            _K.INCREMENTAL_ALTER_CONFIGS,
            a.IncrementalAlterConfigsRequest,
            a.IncrementalAlterConfigsResponse,
            0,
            0,
            1,
        ),
    )
}
assert set(APIS) == set(ApiKey)

_BY_REQUEST: dict[type, ApiSpec] = {spec.request: spec for spec in APIS.values()}
_BY_RESPONSE: dict[type, ApiSpec] = {spec.response: spec for spec in APIS.values()}


def api_for_request(body: Struct) -> ApiSpec:
    """The API a request body belongs to (raises ValueError for a non-request object)."""
    spec = _BY_REQUEST.get(type(body))
    if spec is None:
        raise ValueError(f"{type(body).__name__} is not a request message")
    return spec


def api_for_response(body: Struct) -> ApiSpec:
    spec = _BY_RESPONSE.get(type(body))
    if spec is None:
        raise ValueError(f"{type(body).__name__} is not a response message")
    return spec


def supported_api_versions() -> list[m.ApiVersion]:
    """The ``api_keys`` list of an ApiVersions response: every advertised API, ascending by key."""
    specs = sorted((s for s in APIS.values() if s.advertised), key=lambda s: s.api_key)
    return [m.ApiVersion(s.api_key, s.min_version, s.max_advertised) for s in specs]
