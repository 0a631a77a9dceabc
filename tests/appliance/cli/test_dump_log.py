"""``appliance dump-log``: the real console script on real segment files."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.codec_batches import garbage_batch

from appliance.cli.dump_log import format_bytes
from storage.batch_builder import build_batch
from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC_OFFSET, stamp, write_crc
from storage.compression import CODECS_BY_NAME, COMPRESSION_ZSTD

APPLIANCE = str(Path(sys.executable).with_name("appliance"))


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [APPLIANCE, "dump-log", *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def _segment() -> tuple[bytes, bytes]:
    first = bytearray(
        build_batch(
            [b"hello", None, b"\x00\xffbin"],
            keys=[b"k", None, b"line\nbreak"],
            headers=[[("trace", b"t1")], [], [("gone", None)]],
            timestamps=[1_700_000_000_000, 1_700_000_000_002, 1_700_000_000_001],
        )
    )
    second = bytearray(
        build_batch(
            [b"zstd value"] * 4,
            timestamp_ms=1_700_000_000_010,
            compression=COMPRESSION_ZSTD,
            producer_id=42,
            producer_epoch=1,
            base_sequence=0,
        )
    )
    stamp(first, 0, 100, partition_leader_epoch=3)
    stamp(second, 0, 103, partition_leader_epoch=3)
    return bytes(first), bytes(second)


@pytest.fixture
def segment(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    first, second = _segment()
    path = tmp_path / "00000000000000000100.log"
    path.write_bytes(first + second)
    return path, first, second


def test_prints_batches_and_records(segment: tuple[Path, bytes, bytes]) -> None:
    path, first, second = segment
    result = _run(path, "--print-records")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {path}"
    assert lines[1] == "Log starting offset: 100"
    assert lines[2] == (
        f"baseOffset: 100 lastOffset: 102 count: 3 position: 0 size: {len(first)} crcValid: true "
        "compression: none producerId: -1 producerEpoch: -1 baseSequence: -1 partitionLeaderEpoch: 3 "
        "isTransactional: false isControl: false timestampType: CreateTime baseTimestamp: 1700000000000 "
        f"maxTimestamp: 1700000000002 crc: {struct.unpack_from('>I', first, 17)[0]}"
    )
    assert lines[3:6] == [
        '| offset: 100 CreateTime: 1700000000000 keySize: 1 valueSize: 5 key: "k" value: "hello" '
        'headers: {"trace": "t1"}',
        "| offset: 101 CreateTime: 1700000000002 keySize: -1 valueSize: -1 key: null value: null headers: {}",
        '| offset: 102 CreateTime: 1700000000001 keySize: 10 valueSize: 5 key: "line\\nbreak" '
        'value: 0x00ff62696e headers: {"gone": null}',
    ]
    assert lines[6].startswith(
        f"baseOffset: 103 lastOffset: 106 count: 4 position: {len(first)} size: {len(second)}"
    )
    assert "compression: zstd producerId: 42 producerEpoch: 1 baseSequence: 0" in lines[6]
    assert lines[7:11] == [
        f"| offset: {o} CreateTime: 1700000000010 keySize: -1 valueSize: 10 key: null "
        'value: "zstd value" headers: {}'
        for o in range(103, 107)
    ]
    assert lines[11] == f"Summary: 2 batches, 7 records, {len(first) + len(second)} valid bytes of " + str(
        len(first) + len(second)
    )


def test_corrupt_crc_exits_non_zero_naming_file_position_offsets(segment: tuple[Path, bytes, bytes]) -> None:
    path, first, second = segment
    damaged = bytearray(first + second)
    damaged[len(first) + HEADER_SIZE + 2] ^= 0x40  # inside the second batch's compressed records
    path.write_bytes(damaged)
    result = _run(path)
    assert result.returncode == 1
    assert "crcValid: true" in result.stdout.splitlines()[2]
    assert "crcValid: false" in result.stdout.splitlines()[3]  # the walk goes on: the length is sound
    assert f"{path}: record batch at position {len(first)} (offsets 103..106): stored CRC" in result.stderr


def test_bad_magic_stops_the_walk_and_names_the_position(segment: tuple[Path, bytes, bytes]) -> None:
    path, first, second = segment
    damaged = bytearray(first + second)
    damaged[len(first) + MAGIC_OFFSET] = 7
    path.write_bytes(damaged)
    result = _run(path, "--verify")
    assert result.returncode == 1
    assert (
        f"{path}: record batch at position {len(first)} (base offset 103): magic 7, expected 2"
        in result.stderr
    )
    assert f"{len(first)} valid bytes precede it" in result.stderr


def test_torn_tail_is_reported_with_its_own_exit_status(segment: tuple[Path, bytes, bytes]) -> None:
    path, first, second = segment
    path.write_bytes(first + second[:40])
    result = _run(path)
    assert result.returncode == 3
    assert f"{path}: torn tail: a partial batch of 40 bytes at position {len(first)} (after offset 102)" in (
        result.stderr
    )
    assert result.stdout.splitlines()[
        -1
    ] == f"Summary: 1 batches, 3 records, {len(first)} valid bytes of " + str(len(first) + 40)


def test_verify_finds_malformed_records_under_a_good_crc(tmp_path: Path) -> None:
    records = b"\x0e\x00\x00\x00\x01\x05" + b"x" * 9  # one record whose value length (-3) is corrupt
    batch = bytearray(HEADER_SIZE + len(records))
    BATCH_HEADER.pack_into(batch, 0, 0, len(batch) - LOG_OVERHEAD, 0, 2, 0, 0, 0, 5, 5, -1, -1, -1, 1)
    batch[HEADER_SIZE:] = records
    write_crc(batch, 0, len(batch))
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(batch)
    assert _run(path).returncode == 0  # header and CRC are fine
    result = _run(path, "--verify")
    assert result.returncode == 1
    assert (
        f"{path}: record batch at position 0 (offsets 0..0): record 0 of 1 at position 66: negative length"
        in (result.stderr)
    )


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_print_records_reports_an_undecodable_batch_and_goes_on_with_the_next(tmp_path: Path,
                                                                              codec: str) -> None:
    number = CODECS_BY_NAME[codec]
    before = bytearray(build_batch([b"before-%d" % i for i in range(3)], timestamp_ms=5, compression=number))
    bad = bytearray(garbage_batch(number, 4))
    after = bytearray(build_batch([b"after-%d" % i for i in range(2)], timestamp_ms=6, compression=number))
    for batch, base in ((before, 0), (bad, 3), (after, 7)):
        stamp(batch, 0, base, partition_leader_epoch=0)
    path = tmp_path / "t-0" / "00000000000000000000.log"
    path.parent.mkdir()
    path.write_bytes(before + bad + after)
    result = _run(path, "--print-records")
    assert result.returncode == 1
    assert result.stderr.startswith(f"appliance dump-log: error: {path}: record batch at position "
                                    f"{len(before)} (offsets 3..6): not valid {codec} data: ")
    values = [line.split(" value: ")[1].split(" ")[0] for line in result.stdout.splitlines()
              if line.startswith("| offset:")]
    assert values == ['"before-0"', '"before-1"', '"before-2"', '"after-0"', '"after-1"']
    assert "Summary: 3 batches, 9 records" in result.stdout


def test_index_files_print_their_entries(tmp_path: Path) -> None:
    index = tmp_path / "00000000000000000100.index"
    index.write_bytes(struct.pack(">iiii", 0, 0, 7, 4096) + bytes(16))  # two entries, then the zero tail
    timeindex = tmp_path / "00000000000000000100.timeindex"
    timeindex.write_bytes(struct.pack(">qiqi", 1_700_000_000_000, 0, 1_700_000_000_500, 7) + bytes(24))
    result = _run(index, timeindex, "--verify")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"Dumping {index}",
        "offset: 100 position: 0",
        "offset: 107 position: 4096",
        "Summary: 2 entries of 4 slots",
        f"Dumping {timeindex}",
        "timestamp: 1700000000000 offset: 100",
        "timestamp: 1700000000500 offset: 107",
        "Summary: 2 entries of 4 slots",
    ]
    index.write_bytes(struct.pack(">iiii", 7, 0, 3, 4096))
    result = _run(index, "--verify")
    assert result.returncode == 1
    assert f"{index}: index entry 1: relative_offset 3 does not increase past 7" in result.stderr


def test_missing_file_and_empty_file_and_bad_arguments(tmp_path: Path) -> None:
    empty = tmp_path / "00000000000000000000.log"
    empty.write_bytes(b"")
    result = _run(tmp_path / "missing.log", empty)
    assert result.returncode == 1
    assert f"{tmp_path / 'missing.log'}: cannot read" in result.stderr
    assert (
        "Summary: 0 batches, 0 records, 0 valid bytes of 0" in result.stdout
    )  # the next file is still dumped
    assert _run().returncode == 2


@pytest.mark.parametrize(
    ("data", "max_bytes", "shown"),
    [
        (None, 0, "null"),
        (b"plain", 0, '"plain"'),
        (b'quote" tab\t', 0, '"quote\\" tab\\t"'),
        ("ключ".encode(), 0, '"ключ"'),
        (b"\x1b[31mred", 0, "0x1b5b33316d726564"),  # terminal escape: never printed raw
        (b"\xff\x00", 0, "0xff00"),
        (b"abcdef", 3, '"abc"...(+3 bytes)'),
    ],
)
def test_bytes_are_shown_safely(data: bytes | None, max_bytes: int, shown: str) -> None:
    assert format_bytes(data, max_bytes) == shown


def test_offsets_topic_records_are_decoded(tmp_path: Path) -> None:
    """In a ``__consumer_offsets-N`` directory (or with ``--offsets-decoder``) a commit, a group's metadata
    and a tombstone are shown in Kafka's schemas; a key of no known kind is shown as bytes, marked."""
    from appliance.coordinator.group_records import (
        GroupMetadata,
        GroupMetadataMember,
        encode_group_key,
        encode_group_value,
    )
    from appliance.coordinator.offset_records import OffsetKey, OffsetValue, encode_key, encode_value

    member = GroupMetadataMember("m-1", None, "c", "/h", 300, 100, b"sub", b"as")
    keys = [encode_key(OffsetKey("g", "t", 3)), encode_group_key("g"), encode_group_key("gone"), b"\x00\x09x",
            encode_key(OffsetKey("g", "t", 4))]
    values = [encode_value(OffsetValue(42, 5, "meta", 1_700_000_000_000)),
              encode_group_value(GroupMetadata("consumer", 4, "range", "m-1", 7, [member])), None, b"v",
              encode_value(OffsetValue(43, -1, "", 1_700_000_000_000, 1_700_000_060_000))]
    directory = tmp_path / "__consumer_offsets-0"
    directory.mkdir()
    segment = directory / "00000000000000000000.log"
    segment.write_bytes(build_batch(values, keys=keys))
    shown = _run("--print-records", segment)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("| offset")]
    commit = ('key: {"type": "offset_commit", "group": "g", "topic": "t", "partition": 3} '
              'value: {"offset": 42, "leader_epoch": 5, "metadata": "meta", '
              '"commit_timestamp": 1700000000000}')
    assert commit in lines[0]
    group = ('key: {"type": "group_metadata", "group": "g"} value: {"protocol_type": "consumer", '
             '"generation": 4, "protocol": "range", "leader": "m-1", "current_state_timestamp": 7, '
             '"members": [{"member_id": "m-1", "group_instance_id": null, "client_id": "c", '
             '"client_host": "/h", "rebalance_timeout": 300, "session_timeout": 100, '
             '"subscription_bytes": 3, "assignment_bytes": 2}]}')
    assert group in lines[1]
    assert 'key: {"type": "group_metadata", "group": "gone"} value: null' in lines[2]
    assert lines[3].endswith("undecodable") and "key: 0x000978" in lines[3]
    assert ('value: {"offset": 43, "leader_epoch": -1, "metadata": "", "commit_timestamp": 1700000000000, '
            '"expire_timestamp": 1700000060000}') in lines[4]  # value version 1: a commit's own retention
    elsewhere = tmp_path / "00000000000000000000.log"
    elsewhere.write_bytes(segment.read_bytes())
    assert '"offset_commit"' not in _run("--print-records", elsewhere).stdout
    assert '"offset_commit"' in _run("--print-records", "--offsets-decoder", elsewhere).stdout
