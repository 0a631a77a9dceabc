"""Start-up after damage to a stopped appliance's files, with real processes: ``appliance serve`` (its
broker a child), the Kafka protocol through the wire codec and a real Kafka client, ``appliance repair``.

Topic ``t`` has three partitions; partition 1 is damaged while the appliance is stopped.  After each kind of
damage the appliance starts and partitions 0 and 2 take and serve new records; a damaged tail is cut (the
log line names the file and position); an index is rebuilt; corruption with acknowledged records after it
takes partition 1 offline (Metadata, Produce, Fetch, ListOffsets answer for it as Kafka does for an offline
replica) until ``appliance repair`` and a restart bring it back.  Every acknowledged record before the damage
stays readable.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harness import Appliance
from support.kafka_appliance import free_port
from support.wire import WireClient, answers, produce

from ipc.kafka import (
    ApiKey,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
)
from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.batch_reader import iter_batches, iter_records
from storage.errors import PartitionOfflineError

TOPIC = "t"
BATCHES = 30  # per partition: about two segments of log.segment.bytes
SETTINGS = ("topics.t.partitions=3", "log.segment.bytes=16384", "log.index.interval.bytes=512")


@pytest.fixture
def serve() -> Iterator[Appliance]:
    appliance = Appliance(None, *SETTINGS, f"listeners=127.0.0.1:{free_port()}")
    try:
        yield appliance.start()
    finally:
        appliance.close()


def _port(serve: Appliance) -> int:
    return int(next(o for o in serve.overrides if o.startswith("listeners=")).rsplit(":", 1)[1])


def _wire(serve: Appliance) -> WireClient:
    deadline = time.monotonic() + 20
    while True:
        try:
            return WireClient(("127.0.0.1", _port(serve)))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _values(partition: int, start: int, count: int) -> list[list[bytes]]:
    return [[b"p%d-b%03d-r%d-" % (partition, start + i, r) + b"x" * 80 for r in range(10)]
            for i in range(count)]


def _produce(wire: WireClient, partition: int, batches: list[list[bytes]]) -> int:
    """Produce each batch (acks=all); all must be acknowledged.  Returns the error code of a refusal."""
    for values in batches:
        response = wire.call(ApiKey.PRODUCE, 8, produce(-1, (TOPIC, partition, build_batch(values))))
        code, _ = answers(response)[(TOPIC, partition)]
        if code != ErrorCode.NONE:
            return code
    return ErrorCode.NONE


def _fill(serve: Appliance) -> dict[int, list[bytes]]:
    """BATCHES acknowledged batches in each partition; the acknowledged values per partition."""
    wire = _wire(serve)
    try:
        acked = {}
        for p in range(3):
            batches = _values(p, 0, BATCHES)
            assert _produce(wire, p, batches) == ErrorCode.NONE
            acked[p] = [v for values in batches for v in values]
        return acked
    finally:
        wire.close()


def _restart(serve: Appliance, *, clean: bool = True) -> None:
    if clean:
        assert serve.stop() == 0, serve.log()
    else:
        serve.kill_tree()
    serve.start()


def _partition_dir(serve: Appliance, partition: int = 1) -> Path:
    return serve.data / f"{TOPIC}-{partition}"


def _segments(serve: Appliance, partition: int = 1) -> list[Path]:
    return sorted(_partition_dir(serve, partition).glob("*.log"))


def _batch_positions(data: bytes) -> list[tuple[int, int]]:
    out, position = [], 0
    while position < len(data):
        size = parse_header(data, position).size
        out.append((position, size))
        position += size
    return out


def _read_all(wire: WireClient, partition: int) -> list[bytes | None]:
    """Every record value of the partition, fetched from offset 0 up to the high watermark."""
    values: list[bytes | None] = []
    offset = 0
    while True:
        request = FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 24, topics=[FetchTopic(TOPIC, [
            FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 24)])])
        answer = wire.call(ApiKey.FETCH, 11, request).responses[0].partitions[0]
        assert answer.error_code == ErrorCode.NONE
        data = bytes(answer.records or b"")
        if not data:
            return values
        for position, _ in iter_batches(data):
            for record in iter_records(data, position):
                values.append(record.value)
                offset = record.offset + 1


def _healthy_partitions_serve(serve: Appliance, acked: dict[int, list[bytes]]) -> None:
    """Partitions 0 and 2 still hold every acknowledged record and take and serve new ones."""
    wire = _wire(serve)
    try:
        for p in (0, 2):
            more = _values(p, BATCHES, 2)
            assert _produce(wire, p, more) == ErrorCode.NONE
            assert _read_all(wire, p) == acked[p] + [v for values in more for v in values]
    finally:
        wire.close()


@pytest.mark.parametrize("damage", ["garbage tail", "tail cut mid-batch", "index deleted", "index garbage"])
def test_start_up_repairs_a_damaged_tail_or_index_after_a_clean_stop(serve: Appliance, damage: str) -> None:
    acked = _fill(serve)
    assert serve.stop() == 0, serve.log()
    active = _segments(serve)[-1]
    data = active.read_bytes()
    last_position, last_size = _batch_positions(data)[-1]
    expected = acked[1]
    if damage == "garbage tail":
        active.write_bytes(data + os.urandom(333))
        cut_at = len(data)
    elif damage == "tail cut mid-batch":
        active.write_bytes(data[: last_position + last_size // 2])
        cut_at = last_position
        expected = acked[1][:-10]  # the torn batch is gone; everything before it stays
    elif damage == "index deleted":
        for segment in _segments(serve):
            segment.with_suffix(".index").unlink()
    else:
        for segment in _segments(serve):
            index = segment.with_suffix(".index")
            index.write_bytes(os.urandom(index.stat().st_size or 24) + b"junk")
    serve.start()
    log = serve.log()
    if damage in ("garbage tail", "tail cut mid-batch"):
        assert f"{active}: truncating the log tail at position {cut_at}" in log, log
        assert active.stat().st_size == cut_at
    else:
        assert "rebuilding indexes" in log and str(_segments(serve)[0]) in log, log
    _healthy_partitions_serve(serve, acked)
    wire = _wire(serve)
    try:
        assert _read_all(wire, 1) == expected
        assert _produce(wire, 1, _values(1, BATCHES, 1)) == ErrorCode.NONE
    finally:
        wire.close()


def _corrupt(segment: Path, which: int, *, header: bool) -> int:
    """Flip a byte of batch ``which`` of the segment file: its magic (``header``) or one of its records (its
    CRC no longer matches); returns the batch's position."""
    data = bytearray(segment.read_bytes())
    position, size = _batch_positions(bytes(data))[which]
    data[position + 16 if header else position + size - 20] ^= 0xFF
    segment.write_bytes(bytes(data))
    return position


@pytest.mark.parametrize("case", ["crash, a record in the active segment",
                                  "clean stop, a header in a closed segment"])
def test_corruption_takes_one_partition_offline_until_repaired(serve: Appliance, case: str) -> None:
    acked = _fill(serve)
    if case.startswith("crash"):
        serve.kill_tree()  # the next start checks the logs from the recovery point
        active = _segments(serve)[-1]
        position = _corrupt(active, len(_batch_positions(active.read_bytes())) // 2, header=False)
    else:
        assert serve.stop() == 0
        active = _segments(serve)[0]  # its last batch, which its index names: the index check finds it
        position = _corrupt(active, -1, header=True)
    damaged_bytes = active.read_bytes()
    serve.start()
    log = serve.log()
    assert "partition t-1 is OFFLINE" in log, log
    assert f"{active}: invalid record batch at position {position}" in log
    assert f"appliance repair {_partition_dir(serve)}" in log
    assert active.read_bytes() == damaged_bytes  # nothing was cut
    _healthy_partitions_serve(serve, acked)
    _offline_answers(serve)
    _local_clients_refuse(serve)
    described = serve.cli("topics", "describe", TOPIC, "--data-dir", str(serve.data))
    line = next((x for x in described.stdout.splitlines() if "\tPartition: 1\t" in x),
                described.stdout + described.stderr)
    assert "Leader: none" in line and "Offline: 0" in line and f"OfflineReason: {active}" in line, line

    dry = serve.cli("repair", "--dry-run", str(_partition_dir(serve)))
    assert dry.returncode == 3, dry.stderr
    assert f"damaged: {active}: invalid record batch at position {position}" in dry.stdout
    assert "lost:" in dry.stdout and "dry run: nothing changed" in dry.stdout
    assert active.read_bytes() == damaged_bytes

    done = serve.cli("repair", str(_partition_dir(serve)))
    assert done.returncode == 0, done.stderr
    assert active.stat().st_size == position
    _restart(serve)
    wire = _wire(serve)
    try:
        survivors = _read_all(wire, 1)
        kept = acked[1][: len(survivors)]
        assert survivors == kept and len(survivors) > 0  # everything before the damage
        assert _produce(wire, 1, _values(1, 99, 1)) == ErrorCode.NONE
        assert _read_all(wire, 1)[len(survivors):] == _values(1, 99, 1)[0]
    finally:
        wire.close()
    assert "OFFLINE" not in serve.log()


def _offline_answers(serve: Appliance) -> None:
    wire = _wire(serve)
    try:
        metadata = wire.call(ApiKey.METADATA, 8, MetadataRequest(topics=[MetadataRequestTopic(TOPIC)],
                                                                 allow_auto_topic_creation=False))
        parts = {p.partition_index: p for p in metadata.topics[0].partitions}
        assert parts[1].error_code == ErrorCode.LEADER_NOT_AVAILABLE
        assert parts[1].leader_id == -1 and parts[1].offline_replicas == [0]
        assert parts[0].error_code == parts[2].error_code == ErrorCode.NONE
        assert parts[0].offline_replicas == []
        assert _produce(wire, 1, _values(1, 50, 1)) == ErrorCode.KAFKA_STORAGE_ERROR
        fetch = FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[
            FetchTopic(TOPIC, [FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20)])])
        answer = wire.call(ApiKey.FETCH, 11, fetch).responses[0].partitions[0]
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        offsets = wire.call(ApiKey.LIST_OFFSETS, 4, ListOffsetsRequest(topics=[
            ListOffsetsTopic(TOPIC, [ListOffsetsPartition(partition_index=1, timestamp=-1)])]))
        assert offsets.topics[0].partitions[0].error_code == ErrorCode.KAFKA_STORAGE_ERROR
    finally:
        wire.close()


def _local_clients_refuse(serve: Appliance) -> None:
    from appliance.client.consumer import Consumer
    from appliance.client.producer import Producer

    client = serve.client()
    try:
        with pytest.raises(PartitionOfflineError, match=r"partition t-1 is offline: .*appliance repair"):
            client.attach(TOPIC, 1)
        client.attach(TOPIC, 0)  # the others attach as before
    finally:
        client.close()
    producer = Producer({"appliance.control.socket": str(serve.socket_path), "linger.ms": 0})
    try:
        with pytest.raises(PartitionOfflineError, match="partition t-1 is offline"):
            producer.send(TOPIC, b"refused", partition=1).get(10)
        producer.send(TOPIC, b"taken", partition=0).get(10)
        producer.flush(10)
    finally:
        producer.close()
    consumer = Consumer({"log.dirs": str(serve.data)})
    try:
        with pytest.raises(PartitionOfflineError, match="partition t-1 is offline"):
            consumer.assign([(TOPIC, 1)])
        consumer.assign([(TOPIC, 0)])
    finally:
        consumer.close()


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waiting for its new parent has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def test_children_of_a_killed_supervisor_do_not_claim_a_clean_stop(serve: Appliance) -> None:
    acked = _fill(serve)
    writers = serve.writers(3)
    os.kill(serve.pid, signal.SIGKILL)  # the supervisor alone: its writers drain and exit by themselves
    serve.process.wait(10)  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in writers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in writers)
    for p in range(3):
        assert not (_partition_dir(serve, p) / ".clean-shutdown").exists()
    assert "closing the log without the clean-shutdown marker" in serve.log()
    active = _segments(serve)[-1]
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(b"\x00garbage after an orphaned stop" * 10)
    serve.start()
    assert f"{active}: truncating the log tail at position {size}" in serve.log()
    _healthy_partitions_serve(serve, acked)
    wire = _wire(serve)
    try:
        assert _read_all(wire, 1) == acked[1]
    finally:
        wire.close()
