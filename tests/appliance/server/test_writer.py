"""The partition writer in this process: real rings, state page, doorbell and log; no supervisor.

Each test opens a writer on a fresh partition directory and a fresh shared-memory instance, publishes
frames through real rings, runs drain rounds (or the whole loop in a thread) and checks what a producer and a
reader would see: acks, the state page, and the log's batches.  Crash points go through the writer's fault
seam; real SIGKILLs are in test_supervisor_crash.py.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.server.disk_space import RECHECK_INTERVAL_NS
from appliance.server.writer import PartitionWriter, WriterSpec
from ipc.control import LineDecoder, encode
from ipc.kafka.errors import ErrorCode
from ipc.ring import RingFailedError, RingNames, RingProducer, create_ring, warm_up
from ipc.shm import ShmNames, list_objects, reclaim
from ipc.state_page import StatePage
from ipc.wakeup import Doorbell
from storage.batch_builder import build_batch
from storage.batch_header import parse_header
from storage.batch_reader import iter_records
from storage.disk_faults import DISK_FAULTS
from storage.log_config import LogConfig
from storage.log_reader import LogReader
from storage.producer_state import list_snapshots

warm_up()

CORRUPT = -int(ErrorCode.CORRUPT_MESSAGE)
TOO_LARGE = -int(ErrorCode.MESSAGE_TOO_LARGE)
OUT_OF_ORDER = -int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


class Bench:
    """A partition, its shared memory, and helpers to make rings and read back the log."""

    def __init__(self, root: Path, names: ShmNames, topic: str = "orders", partition: int = 0) -> None:
        self.root = root
        self.names = names
        self.topic = topic
        self.partition = partition
        self.page_name = names.state_page(topic, partition)
        StatePage.create(self.page_name).close()
        Doorbell.create(names.doorbell(topic, partition)).close()
        self.page = StatePage.attach(self.page_name)
        self.rings = 0

    def spec(self, **log_settings: int) -> WriterSpec:
        return WriterSpec(
            topic=self.topic,
            partition=self.partition,
            directory=str(self.root / f"{self.topic}-{self.partition}"),
            log_config=LogConfig(**log_settings),
            leader_epoch=0,
            state_page=self.page_name,
            doorbell=self.names.doorbell(self.topic, self.partition),
        )

    def ring_names(self) -> RingNames:
        self.rings += 1
        names = RingNames.for_producer(self.names, self.topic, self.partition, self.rings)
        create_ring(names, capacity_bytes=1 << 18, ack_slots=256)
        return names

    def producer(self, writer: PartitionWriter) -> RingProducer:
        names = self.ring_names()
        writer.attach_ring(names)
        return RingProducer.attach(names, max_block_ms=2000)

    def batches(self, spec: WriterSpec) -> list[bytes]:
        with LogReader(spec.directory) as reader:
            return list(reader.batches())


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    names = ShmNames(secrets.token_hex(8))
    b = Bench(tmp_path, names)
    try:
        yield b
    finally:
        b.page.close()
        reclaim(names.instance)
        assert list_objects(names.instance) == ([], [])


def acks(producer: RingProducer) -> list[int]:
    _, results = producer.poll_acks()
    return results.tolist()


def idem(values: list[bytes], pid: int, seq: int, epoch: int = 0) -> bytes:
    return build_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def values_in(batch: bytes) -> list[bytes | None]:
    return [record.value for record in iter_records(batch)]


# -- the drain round ----------------------------------------------------------------------------------------


def test_batches_from_two_rings_are_appended_once_and_acked_with_their_offsets(bench: Bench) -> None:
    spec = bench.spec()
    writer = PartitionWriter.open(spec)
    try:
        a, b = bench.producer(writer), bench.producer(writer)
        for i in range(3):
            a.send(build_batch([b"a%d" % i] * (i + 1)))
        b.send(build_batch([b"b0", b"b1"]))
        assert writer.drain_round() == 4
        assert writer.drain_round() == 0
        assert acks(a) == [0, 1, 3]
        assert acks(b) == [6]
        assert bench.page.log_end_offset == 8 and bench.page.high_watermark == 8
        assert bench.page.writer_pid > 0
        logged = bench.batches(spec)
        assert [parse_header(x).base_offset for x in logged] == [0, 1, 3, 6]
        assert values_in(logged[2]) == [b"a2"] * 3
        assert values_in(logged[3]) == [b"b0", b"b1"]
        assert all(parse_header(x).partition_leader_epoch == 0 for x in logged)
        a.close()
        b.close()
    finally:
        writer.close()


def _bad_frames(max_message_bytes: int) -> dict[str, tuple[bytes, int]]:
    good = build_batch([b"v"])
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    control = build_batch([b"v"], is_control=True)
    transactional = build_batch([b"v"], producer_id=5, producer_epoch=0, base_sequence=0,
                                is_transactional=True)  # fmt: skip
    return {
        "bad crc": (bytes(flipped), CORRUPT),
        "wrong magic": (bytes(wrong_magic), CORRUPT),
        "garbage": (secrets.token_bytes(300), CORRUPT),
        "short": (good[:40], CORRUPT),
        "empty": (b"", CORRUPT),
        "truncated": (good[:-1], CORRUPT),
        "trailing bytes": (good + b"\x00\x00", CORRUPT),
        "two batches": (good + good, CORRUPT),
        "too large": (build_batch([b"x" * max_message_bytes]), TOO_LARGE),
        "control batch": (control, -int(ErrorCode.INVALID_RECORD)),
        "transactional": (transactional, -int(ErrorCode.INVALID_TXN_STATE)),
    }


@pytest.mark.parametrize("kind", sorted(_bad_frames(4096)))
def test_a_bad_frame_is_refused_appends_nothing_and_others_are_served(bench: Bench, kind: str) -> None:
    spec = bench.spec(max_message_bytes=4096)
    frame, expected = _bad_frames(4096)[kind]
    writer = PartitionWriter.open(spec)
    try:
        a, b = bench.producer(writer), bench.producer(writer)
        a.send(build_batch([b"before"]))
        a.send(frame)
        a.send(build_batch([b"after"]))
        b.send(build_batch([b"other"]))
        writer.drain_round()
        assert acks(a) == [0, expected, 1]
        assert acks(b) == [2]
        assert [values_in(x) for x in bench.batches(spec)] == [[b"before"], [b"after"], [b"other"]]
        assert writer.stats.rejected == 1
        a.send(build_batch([b"later"]))  # the ring goes on
        writer.drain_round()
        assert acks(a) == [3]
        a.close()
        b.close()
    finally:
        writer.close()


def test_a_frame_the_ring_cannot_trust_fails_only_that_ring(bench: Bench) -> None:
    spec = bench.spec()
    writer = PartitionWriter.open(spec)
    try:
        bad, good = bench.producer(writer), bench.producer(writer)
        bad.send(build_batch([b"doomed"]))
        bad.data.view(np.int32)[1] = 7  # the first frame's type word: neither data nor padding
        good.send(build_batch([b"fine"]))
        writer.drain_round()
        assert acks(good) == [0]
        with pytest.raises(RingFailedError, match="bad frame type"):
            bad.send(build_batch([b"more"]))
        good.send(build_batch([b"still fine"]))
        writer.drain_round()
        assert acks(good) == [1]
        assert writer.stats.rings_failed == 1
        assert [values_in(x) for x in bench.batches(spec)] == [[b"fine"], [b"still fine"]]
        bad.close()
        good.close()
    finally:
        writer.close()


def test_idempotent_retries_are_acked_with_the_original_offsets(bench: Bench) -> None:
    spec = bench.spec()
    writer = PartitionWriter.open(spec)
    try:
        p = bench.producer(writer)
        p.send(idem([b"a", b"b"], pid=7, seq=0))
        p.send(idem([b"c", b"d", b"e"], pid=7, seq=2))
        p.send(idem([b"a", b"b"], pid=7, seq=0))  # a retry in the same round
        writer.drain_round()
        p.send(idem([b"c", b"d", b"e"], pid=7, seq=2))  # a retry in a later round
        p.send(idem([b"z"], pid=7, seq=9))  # a gap
        p.send(idem([b"f"], pid=7, seq=5))
        p.send(idem([b"old epoch"], pid=7, seq=6, epoch=0))
        p.send(idem([b"new epoch"], pid=7, seq=0, epoch=1))
        p.send(idem([b"zombie"], pid=7, seq=7, epoch=0))
        writer.drain_round()
        assert acks(p) == [0, 2, 0, 2, OUT_OF_ORDER, 5, 6, 7, -int(ErrorCode.INVALID_PRODUCER_EPOCH)]
        assert len(bench.batches(spec)) == 5
        assert writer.stats.duplicates == 2
        p.close()
    finally:
        writer.close()


@pytest.mark.parametrize("point", ["appended", "acknowledged"])
def test_a_writer_stopped_after_appending_acks_every_batch_once_restarted(bench: Bench, point: str) -> None:
    """More than five batches of one producer in the round that died: older ones come from the resume map."""

    class Crash(Exception):
        pass

    def crash_at(name: str) -> None:
        if name == point:
            raise Crash(name)

    spec = bench.spec()
    writer = PartitionWriter.open(spec, faults=crash_at)
    names = bench.ring_names()
    writer.attach_ring(names)
    producer = RingProducer.attach(names, max_block_ms=2000)
    for seq in range(40):
        producer.send(idem([b"%d" % seq] * 2, pid=3, seq=2 * seq))
    with pytest.raises(Crash):
        writer.drain_round()
    writer.close(clean=False)  # what a SIGKILL leaves: no snapshot, no clean-shutdown marker
    assert bench.page.log_end_offset == 80

    restarted = PartitionWriter.open(spec)
    try:
        restarted.attach_ring(names)
        restarted.drain_round()
        assert producer.wait_acks(39, 1000)
        assert acks(producer) == [2 * seq for seq in range(40)]
        assert restarted.stats.appended_batches == 0
        assert restarted.stats.duplicates == 40 and restarted.stats.resume_hits == 35
        logged = bench.batches(spec)
        assert [parse_header(x).base_sequence for x in logged] == [2 * seq for seq in range(40)]
        producer.send(idem([b"next"], pid=3, seq=80))
        restarted.drain_round()
        assert acks(producer) == [80]
        producer.close()
    finally:
        restarted.close()


def test_producer_state_survives_a_clean_restart_and_rolls_leave_snapshots(bench: Bench) -> None:
    spec = bench.spec(segment_bytes=600)
    writer = PartitionWriter.open(spec)
    names = bench.ring_names()
    writer.attach_ring(names)
    producer = RingProducer.attach(names, max_block_ms=2000)
    for seq in range(12):
        producer.send(idem([b"x" * 100], pid=11, seq=seq))
        writer.drain_round()
    assert list_snapshots(spec.directory), "a roll writes a snapshot"
    writer.close()
    reopened = PartitionWriter.open(spec)
    try:
        reopened.attach_ring(names)
        producer.send(idem([b"x" * 100], pid=11, seq=11))  # the last batch again
        producer.send(idem([b"x" * 100], pid=11, seq=12))
        reopened.drain_round()
        assert acks(producer)[-2:] == [11, 12]
        assert bench.page.log_end_offset == 13
        producer.close()
    finally:
        reopened.close()


def test_retention_runs_in_the_writer_and_publishes_the_log_start_offset(bench: Bench) -> None:
    spec = bench.spec(segment_bytes=500, retention_bytes=600)
    writer = PartitionWriter.open(spec)
    try:
        producer = bench.producer(writer)
        for _ in range(10):
            producer.send(build_batch([b"y" * 200]))
            writer.drain_round()
        assert len(writer.log.segments) >= 5
        deleted = writer.run_retention()
        assert deleted >= 3
        assert bench.page.log_start_offset == writer.log.log_start_offset > 0
        with LogReader(spec.directory) as reader:
            assert reader.log_start_offset == writer.log.log_start_offset
        producer.close()
    finally:
        writer.close()


# -- the loop, driven through its channel --------------------------------------------------------------------


def test_the_loop_serves_commands_sleeps_when_idle_and_drains_on_stop(bench: Bench) -> None:
    spec = bench.spec()
    ours, theirs = socket.socketpair()
    writer = PartitionWriter.open(spec, theirs)
    doorbell = Doorbell.open(spec.doorbell)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(writer.run()))
    thread.start()
    decoder = LineDecoder()

    def command(message: dict[str, object]) -> None:
        ours.sendall(encode(message))
        doorbell.ring()

    try:
        names = bench.ring_names()
        command({"op": "attach", "ring": names.ring, "space": names.space, "doorbell": names.doorbell})
        producer = RingProducer.attach(names, max_block_ms=2000)
        seq = producer.send(build_batch([b"one"]))
        assert producer.wait_acks(seq, 2000)
        assert acks(producer) == [0]
        time.sleep(0.1)
        sleeps = writer._waiter.sleeps
        time.sleep(0.35)
        assert bench.page.writer_busy_ms < 0, "an idle writer is seen asleep in its state page"
        assert writer._waiter.sleeps == sleeps, "idle: asleep on the doorbell until rung, no timer wake-ups"
        for i in range(5):
            producer.send(build_batch([b"more %d" % i]))
        command({"op": "detach", "ring": names.ring})
        ours.settimeout(2)
        replies = decoder.feed(ours.recv(4096))
        assert replies == [{"op": "detached", "ring": names.ring}]
        assert acks(producer) == [1, 2, 3, 4, 5], "published frames are drained before the ring goes"
        producer.close()
        other = bench.ring_names()
        command({"op": "attach", "ring": other.ring, "space": other.space, "doorbell": other.doorbell})
        late = RingProducer.attach(other, max_block_ms=2000)
        late.send(build_batch([b"just before stop"]))
        command({"op": "stop", "timeout_ms": 2000})
        thread.join(5)
        assert not thread.is_alive() and codes == [0]
        assert late.acked_seq == 1, "stop drains every ring"
        late.close()
    finally:
        if thread.is_alive():
            writer.request_stop()
            doorbell.ring()
            thread.join(5)
        writer.close()
        doorbell.close()
        ours.close()
        theirs.close()
    assert bench.page.log_end_offset == 7


# -- against an oracle ---------------------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("new"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("new"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("retry"), st.integers(0, 1), st.integers(1, 8)),
    st.tuples(st.just("bad"), st.integers(0, 1), st.just(0)),
    st.tuples(st.just("drain"), st.just(0), st.just(0)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_acks_and_log_match_a_model_of_idempotence(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    """Two idempotent producers, one ring each: new batches, retries of any earlier batch, bad frames."""
    names = ShmNames(secrets.token_hex(8))
    b = Bench(tmp_path_factory.mktemp("oracle"), names)
    spec = b.spec()
    writer = PartitionWriter.open(spec)
    try:
        producers = [b.producer(writer), b.producer(writer)]
        sent: list[list[tuple[int, int]]] = [[], []]  # per producer: (first seq, records) of each new batch
        next_seq = [0, 0]
        pending: list[list[tuple[str, int, int]]] = [[], []]  # per ring, frames not yet drained
        appended: list[list[tuple[int, int]]] = [[], []]  # per producer: (first seq, base offset), log order
        log: list[tuple[int, int]] = []  # (producer, first seq) in log order
        expected: list[list[int]] = [[], []]
        next_offset = 0

        def model_drain() -> None:
            nonlocal next_offset
            for ring in (0, 1):
                for kind, first, count in pending[ring]:
                    if kind == "bad":
                        expected[ring].append(CORRUPT)
                        continue
                    recent = dict(appended[ring][-5:])
                    if first in recent:
                        expected[ring].append(recent[first])
                    elif first == (appended[ring][-1][0] + sent_count(ring, appended[ring][-1][0])
                                   if appended[ring] else 0):  # fmt: skip
                        expected[ring].append(next_offset)
                        appended[ring].append((first, next_offset))
                        log.append((ring, first))
                        next_offset += count
                    else:
                        expected[ring].append(OUT_OF_ORDER)
                pending[ring].clear()

        def sent_count(ring: int, first: int) -> int:
            return dict(sent[ring])[first]

        for kind, ring, n in ops:
            pid = 100 + ring
            if kind == "new":
                first = next_seq[ring]
                producers[ring].send(idem([b"%d-%d" % (ring, first + i) for i in range(n)], pid, first))
                sent[ring].append((first, n))
                next_seq[ring] += n
                pending[ring].append(("new", first, n))
            elif kind == "retry" and sent[ring]:
                first, count = sent[ring][-min(n, len(sent[ring]))]
                producers[ring].send(idem([b"%d-%d" % (ring, first + i) for i in range(count)], pid, first))
                pending[ring].append(("retry", first, count))
            elif kind == "bad":
                producers[ring].send(b"\x00" * 70)
                pending[ring].append(("bad", 0, 0))
            elif kind == "drain":
                writer.drain_round()
                model_drain()
        writer.drain_round()
        model_drain()
        for ring in (0, 1):
            assert acks(producers[ring]) == expected[ring]
        logged = [parse_header(x) for x in b.batches(spec)]
        assert [(h.producer_id - 100, h.base_sequence) for h in logged] == log
        assert b.page.log_end_offset == next_offset
        for p in producers:
            p.close()
    finally:
        writer.close()
        b.page.close()
        reclaim(names.instance)


# -- the zero-copy append: one round, many frames, rolls; refusal reasons ------------------------------------


def test_a_round_of_more_frames_than_one_writev_takes_is_appended_in_order_across_rolls(bench: Bench) -> None:
    """2,500 frames published before one drain round (more than IOV_MAX = 1024 buffers, and segments that
    roll inside the round): every frame acked with its offset, the log holds exactly the frames' bytes."""
    spec = bench.spec(segment_bytes=64 * 1024)
    writer = PartitionWriter.open(spec)
    names = RingNames.for_producer(bench.names, bench.topic, bench.partition, 99)
    create_ring(names, capacity_bytes=1 << 20, ack_slots=4096)
    writer.attach_ring(names)
    producer = RingProducer.attach(names, max_block_ms=2000)
    try:
        frames = []
        sequence = 0
        for i in range(2500):
            frames.append(idem([b"r%d-%d" % (i, k) for k in range(1 + i % 3)], 42, sequence))
            sequence += 1 + i % 3
            producer.send(frames[-1])
        assert writer.drain_round() == 2500
        offsets = [0]
        for i in range(2499):
            offsets.append(offsets[-1] + 1 + i % 3)
        assert acks(producer) == offsets
        logged = bench.batches(spec)
        assert [parse_header(x).base_offset for x in logged] == offsets
        from storage.batch_header import stamp

        expected = [bytearray(frame) for frame in frames]
        for frame, offset in zip(expected, offsets, strict=True):
            stamp(frame, 0, offset, spec.leader_epoch)
        assert logged == expected  # byte for byte: the frames as published, offsets and epoch stamped
        assert len(writer.log.segments) > 2
        assert bench.page.log_end_offset == offsets[-1] + 1 + 2499 % 3
        producer.close()
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("bad crc", "stored CRC"),
        ("wrong magic", "magic 1, expected 2"),
        ("short", "40 bytes, a record batch needs at least 61"),
        ("truncated", "available"),
        ("trailing bytes", "a frame carries exactly one batch"),
        ("too large", "larger than max.message.bytes 4096"),
    ],
)
def test_a_refused_frame_is_logged_with_the_reason(bench: Bench, kind: str, reason: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    spec = bench.spec(max_message_bytes=4096)
    frame, expected = _bad_frames(4096)[kind]
    writer = PartitionWriter.open(spec)
    try:
        producer = bench.producer(writer)
        producer.send(frame)
        with caplog.at_level("WARNING", logger="appliance.writer"):
            writer.drain_round()
        assert acks(producer) == [expected]
        assert f"frame 0 refused with {ErrorCode(-expected).name}" in caplog.text
        assert reason in caplog.text
        producer.close()
    finally:
        writer.close()


# -- a full log dir: refused, then resumed (free bytes through the writer's seam, ENOSPC through the disk's)

STORAGE_ERROR = -int(ErrorCode.KAFKA_STORAGE_ERROR)


class FreeBytes:
    """What the writer's ``statvfs`` seam answers: ``free`` bytes, changed by the test."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self) -> int:
        return self.free


def _wait_for_recheck() -> None:
    time.sleep(RECHECK_INTERVAL_NS / 1e9 + 0.02)


def test_below_the_reserve_new_batches_are_refused_and_resume_once_space_returns(bench: Bench) -> None:
    spec = dataclasses.replace(bench.spec(), log_dir_min_free_bytes=1 << 20)
    free = FreeBytes((1 << 20) + 100)  # the reserve and 100 bytes: room for one small batch
    writer = PartitionWriter.open(spec, free_bytes=free)
    try:
        p = bench.producer(writer)
        p.send(idem([b"a", b"b"], pid=7, seq=0))
        writer.drain_round()
        free.free = (1 << 20) + 10  # what is left (the batch, and others' writes)
        p.send(idem([b"c"], pid=7, seq=2))
        p.send(idem([b"a", b"b"], pid=7, seq=0))  # a retry of an appended batch: still its offset
        writer.drain_round()
        assert acks(p) == [0, STORAGE_ERROR, 0]
        assert bench.page.log_end_offset == 2 and len(bench.batches(spec)) == 1
        assert writer.disk.full and "below log.dir.min.free.bytes" in str(writer.disk.error)
        p.send(idem([b"c"], pid=7, seq=2))  # the producer's retry while still full
        writer.drain_round()
        free.free = 1 << 30
        p.send(idem([b"c"], pid=7, seq=2))  # measured again at most every RECHECK_INTERVAL_NS
        writer.drain_round()
        assert acks(p) == [STORAGE_ERROR, STORAGE_ERROR]
        _wait_for_recheck()
        p.send(idem([b"c"], pid=7, seq=2))
        writer.drain_round()
        assert acks(p) == [2] and not writer.disk.full
        assert [values_in(b) for b in bench.batches(spec)] == [[b"a", b"b"], [b"c"]]
        assert writer.stats.by_error[ErrorCode.KAFKA_STORAGE_ERROR] == 3
        p.close()
    finally:
        writer.close()


@pytest.mark.parametrize("point", ["segment.write", "segment.write.torn"])
def test_a_round_meeting_enospc_is_refused_whole_and_retried_appends_once(bench: Bench, point: str) -> None:
    """Two producers, several frames each (retries of one another's among them) in the round that fails:
    every frame given an offset in it is refused, the producer state forgets them, and the same frames
    sent again are appended once, in order, with dense offsets."""
    spec = bench.spec(index_interval_bytes=1)
    writer = PartitionWriter.open(spec, free_bytes=FreeBytes(1 << 30))
    try:
        a, b = bench.producer(writer), bench.producer(writer)
        a.send(idem([b"a0"], pid=1, seq=0))
        writer.drain_round()
        frames = [(a, idem([b"a1"], pid=1, seq=1)), (a, idem([b"a2", b"a3"], pid=1, seq=2)),
                  (a, idem([b"a1"], pid=1, seq=1)), (b, idem([b"b0"], pid=2, seq=0))]
        DISK_FAULTS.arm(point, times=-1)
        try:
            for producer, frame in frames:
                producer.send(frame)
            writer.drain_round()
        finally:
            DISK_FAULTS.disarm()
        assert acks(a)[-3:] == [STORAGE_ERROR] * 3 and acks(b) == [STORAGE_ERROR]
        assert bench.page.log_end_offset == 1 and len(bench.batches(spec)) == 1
        assert writer.disk.full and "ENOSPC" in str(writer.disk.error)
        _wait_for_recheck()
        for producer, frame in frames:
            producer.send(frame)
        writer.drain_round()
        assert acks(a) == [1, 2, 1] and acks(b) == [4]
        assert [values_in(x) for x in bench.batches(spec)] == [[b"a0"], [b"a1"], [b"a2", b"a3"], [b"b0"]]
        a.close()
        b.close()
    finally:
        writer.close()
    with LogReader(spec.directory) as reader:
        assert reader.log_end_offset == 5


def test_a_snapshot_that_finds_no_room_is_skipped_and_the_writer_goes_on(bench: Bench) -> None:
    spec = bench.spec(segment_bytes=600)
    writer = PartitionWriter.open(spec, free_bytes=FreeBytes(1 << 30))
    try:
        p = bench.producer(writer)
        DISK_FAULTS.arm("snapshot.write", times=-1)
        try:
            for seq in range(12):  # rolls, each with a snapshot that fails
                p.send(idem([b"x" * 100], pid=11, seq=seq))
                writer.drain_round()
        finally:
            DISK_FAULTS.disarm()
        assert acks(p) == list(range(12))
        assert list_snapshots(spec.directory) == []
        assert [n for n in os.listdir(spec.directory) if n.endswith(".snapshot.tmp")] == []
        p.close()
    finally:
        writer.close()
    assert list_snapshots(spec.directory), "the clean stop, with room again, writes one"


def test_retention_on_a_full_disk_is_put_off_then_frees_the_space_that_resumes_writes(bench: Bench) -> None:
    """Full, with no room even for the log start offset's checkpoint: retention deletes nothing and changes
    nothing; once that checkpoint fits, retention deletes, and the space it frees lets writes resume."""
    spec = dataclasses.replace(bench.spec(segment_bytes=500, retention_bytes=600), log_dir_min_free_bytes=1)
    free = FreeBytes(1 << 30)
    writer = PartitionWriter.open(spec, free_bytes=free)
    try:
        producer = bench.producer(writer)
        for _ in range(10):
            producer.send(build_batch([b"y" * 200]))
            writer.drain_round()
        free.free = 0
        DISK_FAULTS.arm("segment.write")  # the disk is full: the next write fails
        producer.send(build_batch([b"refused"]))
        writer.drain_round()
        assert acks(producer)[-1] == STORAGE_ERROR and writer.disk.full
        writer.log.flush()  # the rolled segments' background flushes are done: only retention meets the fault
        segments = writer.log.segments
        DISK_FAULTS.arm("checkpoint.write", times=-1)
        try:
            assert writer.run_retention() == 0
        finally:
            DISK_FAULTS.disarm()
        assert writer.log.segments == segments and writer.log.log_start_offset == 0
        assert writer.run_retention() >= 3
        assert bench.page.log_start_offset == writer.log.log_start_offset > 0
        free.free = 1 << 30  # what retention freed
        _wait_for_recheck()
        producer.send(build_batch([b"resumed"]))
        writer.drain_round()
        assert acks(producer) == [10]
        producer.close()
    finally:
        writer.close()
