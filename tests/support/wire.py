"""Speaking the Kafka protocol to a broker in tests: a blocking wire client, a broker forked against a fixed
topic list, and readers of what it answers."""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import resource
import signal
import socket
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.broker.broker import Broker
from appliance.broker.cluster import ClusterError, TopicChange
from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import Config
from ipc.kafka import (
    ApiKey,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_response,
    encode_request,
)
from storage.batch_reader import iter_batches, iter_records


class WireClient:
    """Blocking Kafka protocol client over TCP or a Unix socket, built on the codec."""

    def __init__(self, address: tuple[str, int] | str, client_id: str = "wire-test", timeout_s: float = 10.0):
        family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(address)
        except OSError:
            self.sock.close()
            raise
        self.client_id = client_id
        self.correlation_id = 0

    def send(self, api_key: int, version: int, body: Any) -> int:
        self.correlation_id += 1
        header = RequestHeader(api_key, version, self.correlation_id, self.client_id)
        self.sock.sendall(encode_request(header, body))
        return self.correlation_id

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._exactly(4))[0]
        return self._exactly(size)

    def recv(self, api_key: int, version: int) -> tuple[int, Any]:
        response = decode_response(self.recv_frame(), api_key, version)
        return response.correlation_id, response.body

    def call(self, api_key: int, version: int, body: Any) -> Any:
        sent = self.send(api_key, version, body)
        correlation_id, response = self.recv(api_key, version)
        assert correlation_id == sent
        return response

    def _exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the broker")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def is_closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """True once the broker closed the connection (EOF or reset) within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


class StaticCluster:
    """A metadata owner with a fixed topic list: stands in for the supervisor in these tests."""

    def __init__(self, topics: Mapping[str, TopicMeta]) -> None:
        self._topics = dict(topics)
        self.session = 0

    def topics(self) -> Mapping[str, TopicMeta]:
        return dict(self._topics)

    def create_topic(
        self, name: str, partitions: int | None, replication_factor: int | None, configs: Mapping[str, str],
        *, timeout_ms: int | None = None, internal: bool = False,
    ) -> TopicMeta:
        raise ClusterError(
            f"topic {name!r}: this test's cluster creates no topics", ErrorCode.POLICY_VIOLATION
        )

    def submit(self, change: TopicChange) -> None:
        change.finish(ClusterError(f"topic {change.name!r}: this test's cluster changes no topics",
                                   ErrorCode.POLICY_VIOLATION))  # fmt: skip

    def withdraw(self, change: TopicChange) -> None:
        pass

    def selectables(self) -> tuple[()]:
        return ()

    def poll(self, now_s: float) -> None:
        pass

    def next_timer_s(self) -> None:
        return None

    def init_producer_id(self) -> tuple[int, int]:
        return 4242, 0

    def attach(self, topic: str, partition: int) -> Any:
        raise ClusterError("no writer in this test", ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def attach_many(self, partitions: Any, *, ahead: Any = ()) -> list[Any]:
        return [ClusterError("no writer in this test", ErrorCode.NOT_LEADER_OR_FOLLOWER) for _ in partitions]

    def attach_later(self, partitions: Any, *, ahead: Any = (), on_reply: Any) -> None:
        on_reply(self.attach_many(partitions, ahead=ahead))

    def detach_later(self, rings: Any) -> None:
        pass

    def topics_later(self, on_reply: Any) -> None:
        on_reply(self.topics())

    def detach(self, ring: str) -> None:
        pass

    def detach_many(self, rings: Any) -> None:
        pass

    def close(self) -> None:
        pass


def serve_broker(
    config: Config, topics: Mapping[str, TopicMeta], ready: Any, log_path: str, free_descriptors: int | None
) -> None:
    os.setpgrp()  # a ^C on the test run is the test's to handle
    logging.getLogger("appliance").addHandler(logging.FileHandler(log_path))
    # numba set up (its first kernel call imports ~80 modules), as `appliance serve`'s children inherit it
    # from the supervisor, whose recovery has called kernels before it forks
    importlib.import_module("storage.log")
    importlib.import_module("storage.index_file").count_used_entries(np.zeros(16, np.uint8), 2, 8)
    if free_descriptors is not None:
        # RLIMIT_NOFILE bounds descriptor numbers (new ones take the lowest free number; open ones above it
        # stay open): the lowest limit that leaves this many numbers free under it, whatever the test
        # process held when it forked (that depends on what ran before in the same pytest run)
        in_use = {int(fd) for fd in os.listdir("/proc/self/fd")}
        limit = free = 0
        while free < free_descriptors:
            free += limit not in in_use
            limit += 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    broker = Broker(config, StaticCluster(topics))
    signal.signal(signal.SIGTERM, lambda *_: broker.stop())
    ready.send(broker.bind())
    ready.close()
    broker.serve()


def start_broker(
    config: Config, topics: Mapping[str, TopicMeta], log_path: str, free_descriptors: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """A `Broker` over a static cluster in a child process; returns the process and its listeners' addresses.

    The child is spawned, not forked: a fork of the test process (numba, pyarrow and client threads loaded by
    earlier tests) can crash in the child's first garbage collection.
    """
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=serve_broker, args=(config, dict(topics), child, log_path, free_descriptors), daemon=True
    )
    process.start()
    child.close()
    try:
        if not parent.poll(60):
            raise AssertionError(f"the broker did not start; its log: {log_path}")
        addresses = parent.recv()
    except BaseException:
        process.terminate()
        process.join(10)
        raise
    finally:
        parent.close()
    return process, addresses


def offsets_in(records: Any) -> list[int]:
    """Offsets of every record in a fetch response's records (whole batches only)."""
    data = bytes(records or b"")
    out = []
    for position, _ in iter_batches(data):
        out += [r.offset for r in iter_records(data, position)]
    return out


def produce(acks: int, *parts: tuple[str, int, Any], transactional_id: str | None = None) -> ProduceRequest:
    topics: dict[str, list[PartitionProduceData]] = {}
    for topic, partition, records in parts:
        topics.setdefault(topic, []).append(PartitionProduceData(index=partition, records=records))
    return ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=10_000,
        topic_data=[TopicProduceData(name, data) for name, data in topics.items()],
    )


def answers(response: Any) -> dict[tuple[str, int], tuple[int, int]]:
    return {
        (t.name, p.index): (p.error_code, p.base_offset)
        for t in response.responses
        for p in t.partition_responses
    }


def values_in(wire: WireClient, topic: str, partition: int) -> list[bytes | None]:
    request = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 24,
        topics=[
            FetchTopic(
                topic, [FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=1 << 24)]
            )
        ],
    )
    data = bytes(wire.call(ApiKey.FETCH, 11, request).responses[0].partitions[0].records or b"")
    return [r.value for position, _ in iter_batches(data) for r in iter_records(data, position)]
