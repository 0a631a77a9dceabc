"""Fuzzing a live appliance over loopback: thousands of malformed requests while a client is served.

The malformed requests are valid frames of every API and version (``ipc.kafka.samples``) bent by the
codec's mutator: truncated, bit-flipped, with absurd lengths, spliced, with trailing bytes.  Each goes on
its own connection until the broker closes it (as it must for a frame it cannot parse).  Meanwhile a
well-behaved client produces and fetches through the same broker and checks every answer.

What must hold: the broker process is never restarted, it logs no traceback (nothing but the protocol's
own errors escaped a decoder or a handler), every malformed frame that cannot be decoded closes its
connection, and the well-behaved client is answered correctly throughout.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from support.kafka_appliance import Appliance, start_appliance, stop_appliance
from support.wire import WireClient, offsets_in

from ipc.kafka import (
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    MetadataRequest,
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
    UnsupportedVersionError,
    decode_request,
    maybe_unsupported_version_reply,
)
from ipc.kafka.samples import mutate, sample_requests
from storage.batch_builder import build_batch
from storage.errors import ProtocolError

MALFORMED_REQUESTS = 3000
# APIs whose *valid* requests change the appliance (topics, producer ids): only their malformed variants
# are sent, so a mutation that happens to parse cannot create thousands of partitions.
_MUTATING = {ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.INIT_PRODUCER_ID}


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    running = start_appliance(
        tmp_path_factory.mktemp("fuzz"), {"fuzz": 1}, extra='"auto.create.topics.enable" = false'
    )
    try:
        yield running
    finally:
        stop_appliance(running)


def _malformed_frames(rng: random.Random, count: int) -> list[tuple[bytes, bool]]:
    """``count`` mutated request frames and, for each, whether the broker must close its connection: it
    cannot be decoded (except an unsupported ApiVersions version, which gets the v0 error reply)."""
    own = [s for s in sample_requests(rng, advertised_only=False) if not s.spec.advertised
           and s.spec.api_key == ApiKey.DESCRIBE_SEGMENTS]  # the appliance's own API: never advertised
    samples = sample_requests(rng) + sample_requests(rng) + own
    out = []
    while len(out) < count:
        sample = rng.choice(samples)
        body = mutate(sample.frame[4:], rng)
        try:
            decode_request(body)
            undecodable = False
        except UnsupportedVersionError as e:
            undecodable = maybe_unsupported_version_reply(e) is None
        except ProtocolError:
            undecodable = True
        if not undecodable and sample.spec.api_key in _MUTATING:
            continue
        out.append((struct.pack(">i", len(body)) + body, undecodable))
    return out


class GoodClient(threading.Thread):
    """Produces a batch and fetches it back, again and again, checking each answer."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        host, port = bootstrap.rsplit(":", 1)
        self.client = WireClient((host, int(port)), client_id="good")
        self.stop = threading.Event()
        self.rounds = 0
        self.failure: BaseException | None = None
        self.longest_s = 0.0

    def run(self) -> None:
        try:
            offset = 0
            while not self.stop.is_set():
                started = time.monotonic()
                batch = build_batch([b"good-%d" % (offset + i) for i in range(10)])
                request = ProduceRequest(
                    acks=1,
                    timeout_ms=10_000,
                    topic_data=[TopicProduceData("fuzz", [PartitionProduceData(index=0, records=batch)])],
                )
                answer = self.client.call(ApiKey.PRODUCE, 8, request).responses[0].partition_responses[0]
                assert (answer.error_code, answer.base_offset) == (0, offset), answer
                fetch = FetchRequest(
                    max_wait_ms=0,
                    min_bytes=1,
                    max_bytes=1 << 20,
                    topics=[
                        FetchTopic(
                            "fuzz",
                            [FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)],
                        )
                    ],
                )
                part = self.client.call(ApiKey.FETCH, 11, fetch).responses[0].partitions[0]
                assert offsets_in(part.records) == list(range(offset, offset + 10))
                assert self.client.call(ApiKey.METADATA, 8, MetadataRequest(topics=None)).topics
                offset += 10
                self.rounds += 1
                if self.rounds > 1:  # the first attaches the broker's ring to the writer
                    self.longest_s = max(self.longest_s, time.monotonic() - started)
        except BaseException as e:
            self.failure = e
        finally:
            self.client.close()


def _send_and_see(address: tuple[str, int], frame: bytes) -> str:
    """Send one frame on a fresh connection: "closed", "answered" or "silent"."""
    with socket.create_connection(address, timeout=2) as sock:
        try:
            sock.sendall(frame)
            sock.settimeout(0.5)
            data = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "silent"
        return "answered" if data else "closed"


@pytest.mark.slow
def test_malformed_requests_never_harm_the_broker_or_other_clients(appliance: Appliance) -> None:
    host, port = appliance.bootstrap.rsplit(":", 1)
    address = (host, int(port))
    good = GoodClient(appliance.bootstrap)
    good.start()
    rng = random.Random(20240611)
    outcomes = {"closed": 0, "answered": 0, "silent": 0}
    kept_open = []
    started = time.monotonic()
    for frame, undecodable in _malformed_frames(rng, MALFORMED_REQUESTS):
        outcome = _send_and_see(address, frame)
        outcomes[outcome] += 1
        if undecodable and outcome != "closed":
            kept_open.append(frame[:40])
        assert good.failure is None, good.failure
    good.stop.set()
    good.join(30)
    elapsed = time.monotonic() - started
    assert good.failure is None, good.failure
    assert good.rounds > 50, f"the good client made only {good.rounds} rounds in {elapsed:.1f} s"
    assert kept_open == [], f"{len(kept_open)} undecodable frames did not close their connection"
    assert outcomes["closed"] > MALFORMED_REQUESTS // 2, outcomes
    log = appliance.log_text()
    assert "Traceback" not in log
    assert "broker stopped" not in log and "restarting broker" not in log.lower()
    assert log.count("appliance.broker: broker listening on PLAINTEXT") == 1  # never restarted
    print(
        f"{MALFORMED_REQUESTS} malformed requests in {elapsed:.1f} s: {outcomes}; good client: "
        f"{good.rounds} rounds, slowest {good.longest_s * 1000:.0f} ms"
    )


def test_the_fuzz_corpus_is_mostly_undecodable() -> None:
    frames = _malformed_frames(random.Random(1), 500)
    assert sum(undecodable for _, undecodable in frames) > 300
