"""A sans-IO codec for the Kafka wire protocol: no sockets, files or clocks, only bytes in and out.

Messages are plain dataclasses, one per Kafka struct, with Kafka's field names in snake_case (the same names
kafka-python uses).  Each is declared once (``messages.py``, ``group_messages.py``) with the version range of
every field; a generic engine (``schema.py``) encodes and decodes any of them at any version we speak.
A field absent from a version decodes to its default and is ignored when encoding.

Decode a Fetch request on the broker::

    from ipc.kafka import FrameReader, decode_request, ApiKey

    reader = FrameReader()                      # max_frame_bytes=104857600 (socket.request.max.bytes)
    reader.feed(data_from_socket)
    while (frame := reader.next_frame()) is not None:
        req = decode_request(frame)             # Request(header, body); raises only ProtocolError
        if req.header.api_key == ApiKey.FETCH:
            fetch = req.body                    # FetchRequest
            for topic in fetch.topics:          # FetchTopic(topic: str, partitions: list[FetchPartition])
                for part in topic.partitions:   # FetchPartition(partition, current_leader_epoch,
                    ...                         #   fetch_offset, log_start_offset, partition_max_bytes)

Answer it with record bytes sent by ``os.sendfile``::

    from ipc.kafka import (FetchResponse, FetchableTopicResponse, PartitionData, FileRegion,
                           encode_response_parts)

    body = FetchResponse(responses=[FetchableTopicResponse(topic="t", partitions=[
        PartitionData(partition_index=0, high_watermark=42, last_stable_offset=42, log_start_offset=0,
                      records=FileRegion(fd=segment_fd, position=4096, size=65536))])])
    for part in encode_response_parts(req.header, body):   # size prefix counts the region
        if isinstance(part, FileRegion):
            os.sendfile(sock.fileno(), part.fd, part.position, part.size)   # loop until all sent
        else:
            sock.sendall(part)

Client side: ``encode_request(RequestHeader(api_key, version, correlation_id, client_id), body) -> bytes``
(a whole frame) and ``decode_response(frame_body, api_key, version) -> Response(correlation_id, body)``.

Errors: decoders raise only :class:`storage.errors.ProtocolError` and its subclasses
:class:`UnknownApiKeyError` (close the connection), :class:`UnsupportedVersionError` (send
``maybe_unsupported_version_reply(err)`` if not None -- ApiVersions -- else close) and
:class:`FrameTooLargeError`.  Encoders raise ``ValueError`` for values that do not fit their fields.
"""

from ipc.kafka.apis import APIS, ApiKey, ApiSpec, supported_api_versions
from ipc.kafka.codec import (
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
    frame_size,
    maybe_unsupported_version_reply,
    peek_correlation_id,
)
from ipc.kafka.errors import (
    ErrorCode,
    FrameTooLargeError,
    UnknownApiKeyError,
    UnsupportedVersionError,
    error_name,
)
from ipc.kafka.framing import DEFAULT_MAX_FRAME_BYTES, FrameReader, RequestHeader
from ipc.kafka.group_messages import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    MemberIdentity,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    OffsetFetchResponse,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
    SyncGroupResponse,
)
from ipc.kafka.messages import (
    AbortedTransaction,
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BatchIndexAndErrorMessage,
    CreatableReplicaAssignment,
    CreatableTopic,
    CreatableTopicConfig,
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribableLogDirTopic,
    DescribeLogDirsPartition,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
    EpochEndOffset,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FinalizedFeatureKey,
    ForgottenTopic,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    OffsetForLeaderTopicResult,
    PartitionData,
    PartitionProduceData,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    RecordsValue,
    SupportedFeatureKey,
    TopicProduceData,
    TopicProduceResponse,
)
from ipc.kafka.regions import FileRegion
from ipc.kafka.schema import Struct

__all__ = [
    "APIS",
    "DEFAULT_MAX_FRAME_BYTES",
    "AbortedTransaction",
    "ApiKey",
    "ApiSpec",
    "ApiVersion",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "BatchIndexAndErrorMessage",
    "CreatableReplicaAssignment",
    "CreatableTopic",
    "CreatableTopicConfig",
    "CreatableTopicResult",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeletableTopicResult",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribableLogDirTopic",
    "DescribeLogDirsPartition",
    "DescribeLogDirsRequest",
    "DescribeLogDirsResponse",
    "DescribeLogDirsResult",
    "DescribeLogDirsTopic",
    "EpochEndOffset",
    "ErrorCode",
    "FetchPartition",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchableTopicResponse",
    "FileRegion",
    "FinalizedFeatureKey",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "ForgottenTopic",
    "FrameReader",
    "FrameTooLargeError",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "JoinGroupRequest",
    "JoinGroupRequestProtocol",
    "JoinGroupResponse",
    "JoinGroupResponseMember",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "MemberIdentity",
    "MemberResponse",
    "MetadataRequest",
    "MetadataRequestTopic",
    "MetadataResponse",
    "MetadataResponseBroker",
    "MetadataResponsePartition",
    "MetadataResponseTopic",
    "OffsetCommitRequest",
    "OffsetCommitRequestPartition",
    "OffsetCommitRequestTopic",
    "OffsetCommitResponse",
    "OffsetCommitResponsePartition",
    "OffsetCommitResponseTopic",
    "OffsetFetchRequest",
    "OffsetFetchRequestTopic",
    "OffsetFetchResponse",
    "OffsetFetchResponsePartition",
    "OffsetFetchResponseTopic",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderPartition",
    "OffsetForLeaderTopic",
    "OffsetForLeaderTopicResult",
    "PartitionData",
    "PartitionProduceData",
    "PartitionProduceResponse",
    "ProduceRequest",
    "ProduceResponse",
    "RecordsValue",
    "Request",
    "RequestHeader",
    "Response",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "Struct",
    "SupportedFeatureKey",
    "SyncGroupRequest",
    "SyncGroupRequestAssignment",
    "SyncGroupResponse",
    "TopicProduceData",
    "TopicProduceResponse",
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
]
