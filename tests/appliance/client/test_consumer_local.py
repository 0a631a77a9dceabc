"""The Consumer's local path against real segment files, a real state page and real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.consumer_fixtures import Rec, WrittenPartition, as_recs

from appliance.client.consumer import Consumer, TopicPartition
from appliance.client.local_fetch import _FileMap
from ipc.dir_watch import DirectoryWatch, wait_any
from ipc.state_page import StatePage
from storage.batch_header import COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.errors import (
    ConfigError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from storage.log_config import LogConfig

TP = TopicPartition("t", 0)


@pytest.fixture
def written(tmp_path):  # type: ignore[no-untyped-def]
    part = WrittenPartition(str(tmp_path), config=LogConfig(segment_bytes=4096, index_interval_bytes=256))
    yield part
    part.close()


def local(part: WrittenPartition, **settings_: object) -> Consumer:
    consumer = Consumer({"log.dirs": part.data_dir, "auto.offset.reset": "earliest", **settings_})
    consumer.assign([TP])
    return consumer


def drain(consumer: Consumer, *, max_records: int = 100_000, timeout_ms: int = 50) -> list[Rec]:
    out: list[Rec] = []
    while True:
        got = consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        if not got:
            return out
        out += as_recs(got)


# --------------------------------------------------------------------------------- exactly what was written

_bytes = st.binary(max_size=40)
_record = st.tuples(st.one_of(st.none(), _bytes), st.one_of(st.none(), _bytes),
                    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), _bytes)), max_size=2))
_batch = st.tuples(st.lists(_record, min_size=1, max_size=12),
                   st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]))


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_batch, min_size=1, max_size=15), cut=st.integers(0, 10_000),
       seeks=st.lists(st.integers(0, 200), max_size=3), data=st.data())
def test_reads_exactly_what_was_written_below_the_high_watermark(tmp_path_factory, batches, cut, seeks,
                                                                   data) -> None:  # type: ignore[no-untyped-def]
    part = WrittenPartition(str(tmp_path_factory.mktemp("p")),
                            config=LogConfig(segment_bytes=600, index_interval_bytes=100))
    try:
        for records, compression in batches:
            part.append([r[1] for r in records], [r[0] for r in records], [tuple(r[2]) for r in records],
                        compression=compression, publish=False)
        end = part.log.log_end_offset
        high_watermark = cut % (end + 1)
        part.publish(high_watermark)
        # Kafka hands out whole batches only: a batch reaching the high watermark is not readable yet.
        readable_end = max([b.last_offset + 1 for b in _batch_bounds(part) if b.last_offset < high_watermark],
                           default=0)
        visible = [r for r in part.records if r.offset < readable_end]
        max_records = data.draw(st.integers(1, 50))
        with local(part) as consumer:
            assert drain(consumer, max_records=max_records, timeout_ms=0) == visible
            for offset in seeks:
                if offset > end:
                    continue
                consumer.seek(TP, offset)
                assert drain(consumer, max_records=max_records, timeout_ms=0) == [
                    r for r in visible if r.offset >= offset
                ]
    finally:
        part.close()


class _Bounds:
    def __init__(self, base_offset: int, last_offset: int) -> None:
        self.base_offset, self.last_offset = base_offset, last_offset


def _batch_bounds(part: WrittenPartition) -> list[_Bounds]:
    from storage.batch_header import parse_header

    return [_Bounds(h.base_offset, h.last_offset) for h in map(parse_header, part.log.batches())]


def test_array_api_returns_views_of_the_segment_mapping(written: WrittenPartition) -> None:
    written.append([b"a" * 100] * 50, [b"k%d" % i for i in range(50)])
    with local(written) as consumer:
        chunks = consumer.poll_batch(timeout_ms=100)
        assert sum(len(c) for c in chunks) == 50
        chunk = chunks[0]
        assert chunk.offsets.tolist() == list(range(50))
        assert chunk.value(7) == b"a" * 100 and chunk.key(7) == b"k7"
        # zero copy: the value bytes live in a read-only memory map of the segment file
        base = chunk.data
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert isinstance(base, _FileMap)  # mapped past the file's end: not re-mapped per read
        assert not chunk.data.flags.writeable
        segment = written.log.active_segment.log_path
        with open(segment, "rb") as f:
            assert np.asarray(base)[:64].tobytes() == f.read(64)  # the segment's own bytes


def test_a_growing_segment_is_read_through_one_mapping_until_it_outgrows_it(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The segment is mapped past its end: appends are read through the same mapping (no re-map per read);
    once the file outgrows it, it is mapped again, and the chunks handed out before stay readable."""
    import appliance.client.local_fetch as local_fetch

    monkeypatch.setattr(local_fetch, "_MAP_HEADROOM_BYTES", 8192)
    part = WrittenPartition(str(tmp_path), config=LogConfig(segment_bytes=1 << 20))
    try:
        with local(part) as consumer:
            maps: list[object] = []
            kept = []
            for round_ in range(12):
                part.append([b"r%d-%d" % (round_, i) + b"x" * 200 for i in range(10)])
                chunks = consumer.poll_batch(timeout_ms=100)
                assert [c.value(i) for c in chunks for i in range(len(c))] == \
                    [b"r%d-%d" % (round_, i) + b"x" * 200 for i in range(10)]
                base = chunks[0].data
                while isinstance(base, np.ndarray) and base.base is not None:
                    base = base.base
                if not maps or maps[-1] is not base:
                    maps.append(base)
                kept.append(chunks[0])
            assert 2 <= len(maps) < 12  # ~24 KB appended: mapped again a few times, not once per read
            assert kept[0].value(0) == b"r0-0" + b"x" * 200  # an older mapping lives while referenced
    finally:
        part.close()


# --------------------------------------------------------------------------------------- the high watermark


def test_never_reads_at_or_above_the_high_watermark(written: WrittenPartition) -> None:
    for i in range(5):
        written.append([b"v%d" % i] * 10, publish=False)
    written.publish(high_watermark=20)  # LEO is 50
    with local(written) as consumer:
        assert [r.offset for r in drain(consumer)] == list(range(20))
        assert consumer.position(TP) == 20
        assert consumer.poll(timeout_ms=30) == []
        assert consumer.end_offsets([TP]) == {TP: 20}
        written.publish(high_watermark=35)  # mid-batch: the batch 30..39 is not wholly committed
        assert [r.offset for r in drain(consumer)] == list(range(20, 30))
        written.publish()
        assert [r.offset for r in drain(consumer)] == list(range(30, 50))


def test_bytes_past_the_high_watermark_are_never_looked_at(written: WrittenPartition) -> None:
    """The writer may be in the middle of writing the next batch: a reader bounded by the high watermark
    must not even parse its header (here: half a header of garbage, as a torn copy would look)."""
    written.append([b"a", b"b"])
    written.append([b"c"])
    with open(written.log.segments[-1].path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x03\xff\xff\x00\x00" + b"\x07" * 60)
    with local(written) as consumer:
        assert [r.value for r in drain(consumer)] == [b"a", b"b", b"c"]


def test_poll_wakes_up_when_the_writer_publishes(written: WrittenPartition) -> None:
    written.append([b"first"])
    with local(written) as consumer:
        assert [r.value for r in consumer.poll(timeout_ms=100)] == [b"first"]
        timer = threading.Timer(0.05, lambda: written.append([b"second"]))
        timer.start()
        started = time.monotonic()
        got = consumer.poll(timeout_ms=5000)
        timer.join()
        assert [r.value for r in got] == [b"second"]
        assert time.monotonic() - started < 2.0


def test_fetch_min_bytes_waits_for_more_then_gives_what_there_is(written: WrittenPartition) -> None:
    written.append([b"x" * 10])
    with local(written, **{"fetch.min.bytes": 1_000_000, "fetch.max.wait.ms": 100}) as consumer:
        started = time.monotonic()
        assert len(consumer.poll(timeout_ms=2000)) == 1
        assert time.monotonic() - started >= 0.09


# ------------------------------------------------------------------------------------- segments come and go


def test_reads_across_segment_rolls_while_the_writer_appends(written: WrittenPartition) -> None:
    with local(written) as consumer:
        seen: list[Rec] = []
        for round_ in range(30):
            written.append([b"r%d-%d" % (round_, i) * 20 for i in range(8)])
            seen += drain(consumer, timeout_ms=0)
        assert len(written.log.segments) > 5
        assert seen == written.records


def test_retention_below_the_position_resets_per_auto_offset_reset(written: WrittenPartition) -> None:
    for i in range(40):
        written.append([b"%d" % i * 50] * 4)
    with local(written, **{"max.partition.fetch.bytes": 1}) as consumer:  # one batch per fetch
        assert [r.offset for r in consumer.poll(timeout_ms=0)] == [0, 1, 2, 3]
        written.log.increment_log_start_offset(100)  # deletes the segment being read
        start = written.log.log_start_offset
        assert start == 100
        assert [r.offset for r in drain(consumer)] == list(range(100, 160))
    with local(written, **{"auto.offset.reset": "none"}) as strict:
        strict.seek(TP, 10)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 10 is out of range.*\[100, 160\)"):
            strict.poll(timeout_ms=0)


def test_offsets_past_the_end_are_out_of_range(written: WrittenPartition) -> None:
    written.append([b"a", b"b"])
    with local(written, **{"auto.offset.reset": "none"}) as consumer:
        consumer.seek(TP, 2)  # the high watermark itself: nothing yet, no error
        assert consumer.poll(timeout_ms=0) == []
        consumer.seek(TP, 3)
        with pytest.raises(OffsetOutOfRangeError, match="partition t-0: offset 3"):
            consumer.poll(timeout_ms=0)
    with local(written, **{"auto.offset.reset": "latest"}) as consumer:
        consumer.seek(TP, 99)
        assert consumer.poll(timeout_ms=0) == []
        assert consumer.position(TP) == 2


def test_positions_seek_to_beginning_and_end(written: WrittenPartition) -> None:
    for i in range(3):
        written.append([b"%d" % i] * 5)
    written.log.increment_log_start_offset(5)
    consumer = Consumer({"log.dirs": written.data_dir})
    consumer.assign([TP])
    with consumer:
        assert consumer.position(TP) == 15  # auto.offset.reset=latest (Kafka's default)
        consumer.seek_to_beginning()
        assert consumer.position(TP) == 5
        assert consumer.beginning_offsets([TP]) == {TP: 5}
        assert [r.offset for r in consumer.poll(timeout_ms=0, max_records=3)] == [5, 6, 7]
        assert consumer.position(TP) == 8
        consumer.seek_to_end(TP)
        assert consumer.poll(timeout_ms=0) == []
        with pytest.raises(UnknownTopicOrPartitionError, match="not assigned"):
            consumer.seek(("t", 1), 0)


# --------------------------------------------------------------------------------------------- many readers


_READER = textwrap.dedent("""
    import sys, hashlib
    from appliance.client.consumer import Consumer
    c = Consumer({"log.dirs": sys.argv[1], "auto.offset.reset": "earliest"})
    c.assign([("t", 0)])
    digest, count = hashlib.sha256(), 0
    while count < int(sys.argv[2]):
        for chunk in c.poll_batch(timeout_ms=5000):
            for offset, value in zip(chunk.offsets.tolist(), chunk.values()):
                digest.update(b"%d:%s;" % (offset, value))
                count += 1
    print(count, digest.hexdigest())
""")


@pytest.mark.slow
def test_concurrent_consumer_processes_read_the_same_records_while_it_grows(
    written: WrittenPartition,
) -> None:
    total = 3000
    readers = [subprocess.Popen([sys.executable, "-c", _READER, written.data_dir, str(total)],
                                stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        import hashlib

        for i in range(0, total, 30):
            written.append([b"value-%d" % (i + j) for j in range(30)])
            time.sleep(0.001)
        digest = hashlib.sha256()
        for r in written.records:
            digest.update(b"%d:%s;" % (r.offset, r.value))
        expected = f"{total} {digest.hexdigest()}"
        outputs = [reader.communicate(timeout=60)[0].strip() for reader in readers]
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    assert outputs == [expected] * 3


# ------------------------------------------------------------------------------------ bad bytes, bad config


def test_a_corrupt_batch_is_reported_with_file_and_position(written: WrittenPartition) -> None:
    written.append([b"good"] * 3)
    written.append([b"evil"] * 3)
    segment = written.log.segments[0].path
    with open(segment, "r+b") as f:
        data = f.read()
        at = data.rindex(b"evil")
        f.seek(at)
        f.write(b"EVIL")
    with local(written) as consumer, pytest.raises(CorruptRecordError) as info:
        consumer.poll(timeout_ms=0)
    message = str(info.value)
    assert "partition t-0" in message and segment in message and "CRC" in message
    with local(written, **{"check.crcs": False}) as lax:
        assert [r.value for r in drain(lax)] == [b"good"] * 3 + [b"evil"] * 2 + [b"EVIL"]


def test_missing_partition_or_state_page_is_a_clear_error(written: WrittenPartition, tmp_path) -> None:  # type: ignore[no-untyped-def]
    written.append([b"on disk"])
    consumer = Consumer({"log.dirs": written.data_dir})
    with pytest.raises(UnknownTopicOrPartitionError, match="no directory t-7"):
        consumer.assign([("t", 7)])
    written.page.unlink()
    with pytest.raises(UnknownTopicOrPartitionError, match=r"no state page .* is not running"):
        consumer.assign([TP])
    consumer.close()
    offline = Consumer({"log.dirs": written.data_dir, "appliance.local.offline": True,
                        "auto.offset.reset": "earliest"})
    offline.assign([TP])
    assert [r.value for r in offline.poll(timeout_ms=0)] == [b"on disk"]
    offline.close()
    written.page = StatePage.create(written.page_name)  # for the fixture's clean-up


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"log.dirs": "/x", "fetch.min.byte": 1}, r"'fetch.min.byte' \(did you mean 'fetch.min.bytes'"),
        ({"log.dirs": "/x", "partition.assignment.strategy": "sticky"}, "unknown assignor 'sticky'"),
        ({"log.dirs": "/x", "auto.offset.reset": "smallest"}, "expected one of earliest, latest, none"),
        ({}, r"set bootstrap.servers .* or appliance.data.dir"),
        ({"appliance.data.dir": "/x", "log.dirs": "/y"}, "appliance.data.dir and log.dirs both name"),
        ({"log.dirs": "/x", "bootstrap.servers": "h:1"}, "not both"),
        ({"bootstrap.servers": "nohost"}, "expected HOST:PORT"),
    ],
)
def test_bad_settings_are_refused(config: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Consumer(config)


def test_keyword_settings_and_string_values(written: WrittenPartition) -> None:
    written.append([b"kw"])
    consumer = Consumer(appliance_data_dir=written.data_dir, auto_offset_reset="earliest", check_crcs="false",
                        max_poll_records="7")
    assert consumer.config["check.crcs"] is False and consumer.config["max.poll.records"] == 7
    consumer.assign([TP])
    assert [r.value for r in consumer.poll(timeout_ms=0)] == [b"kw"]
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll()


# -------------------------------------------------------------------------------------------------- waiting


def test_a_restarted_appliance_is_followed_to_its_new_state_page(written: WrittenPartition) -> None:
    written.append([b"before"])
    with local(written) as consumer:
        assert [r.value for r in consumer.poll(timeout_ms=0)] == [b"before"]
        written.page.close()
        written.page.unlink()
        written.page = StatePage.create(written.page_name)  # the new run's page, same name
        written.append([b"after"])
        assert [r.value for r in consumer.poll(timeout_ms=5000)] == [b"after"]


def test_an_idle_poll_sleeps_rather_than_spins(written: WrittenPartition) -> None:
    written.append([b"x"])
    with local(written) as consumer:
        consumer.poll(timeout_ms=0)
        cpu_before, wall_before = time.thread_time(), time.monotonic()
        assert consumer.poll(timeout_ms=1000) == []
        cpu = time.thread_time() - cpu_before
        wall = time.monotonic() - wall_before
    assert wall >= 0.99
    # Measured ~0.6% on a quiet machine (the default 10 ms sleeps); a loaded VM's wake-ups cost more.  A
    # spinning consumer would use 100%.
    assert cpu / wall < 0.05, f"idle poll used {cpu / wall:.1%} of a core"


def test_a_write_wakes_a_sleeping_poll_at_once(written: WrittenPartition) -> None:
    """Past its spin, a waiting consumer sleeps up to appliance.poll.max.sleep.us (here 5 s; at most 1 s per
    futex sleep) between looks at the high watermark, but the publish wakes it (the futex on the high
    watermark; inotify on the segment's write where futexes are missing) within milliseconds."""
    written.append([b"x"])
    with local(written, **{"appliance.poll.max.sleep.us": 5_000_000}) as consumer:
        consumer.poll(timeout_ms=0)
        timer = threading.Timer(0.7, lambda: written.append([b"y"]))  # mid-way through a 0.5 s sleep
        timer.start()
        started = time.monotonic()
        got = consumer.poll(timeout_ms=10_000)
        woke = time.monotonic() - started
        timer.join()
    assert [r.value for r in got] == [b"y"]
    assert woke < 0.95, f"woke after {woke:.2f} s"  # its timer alone would wake it at ~1 s


def test_directory_watch_reports_writes_and_nothing_else(tmp_path) -> None:  # type: ignore[no-untyped-def]
    watch = DirectoryWatch.open(str(tmp_path))
    assert watch is not None
    try:
        assert not wait_any([watch], 0.05)
        with open(tmp_path / "00000000000000000000.log", "ab") as f:
            f.write(b"bytes")
        assert wait_any([watch], 1.0)
        assert not watch.drain()  # wait_any drained it
        (tmp_path / "00000000000000000000.log").read_bytes()  # reading is not an event
        assert not wait_any([watch], 0.05)
    finally:
        watch.close()


def test_many_in_process_consumers_share_a_partition(written: WrittenPartition) -> None:
    consumers = [local(written) for _ in range(8)]
    try:
        results: list[list[Rec]] = [[] for _ in consumers]
        for i in range(10):
            written.append([b"%d" % i] * 7)
            for consumer, got in zip(consumers, results, strict=True):
                got += as_recs(consumer.poll(timeout_ms=0, max_records=1 + i % 4))  # each at its own pace
        for consumer, got in zip(consumers, results, strict=True):
            got += drain(consumer)
    finally:
        for consumer in consumers:
            consumer.close()
    assert results == [written.records] * 8
