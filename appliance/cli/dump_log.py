"""``appliance dump-log PATH... [--verify] [--print-records]``: print segment files, like kafka-dump-log
(whose ``--files A,B``, ``--deep-iteration`` and ``--print-data-log`` work too).

For a ``.log`` file, one line per record batch::

    baseOffset: 0 lastOffset: 2 count: 3 position: 0 size: 120 crcValid: true compression: none ...

and with ``--print-records`` one line per record under it (``| offset: ...``), keys, values and header values
shown as JSON strings when they are printable UTF-8, as ``0x``-hex otherwise, ``null`` when null.  The CRC of
every batch is always checked; ``--verify`` (implied by ``--print-records``) also decodes every record, so
a malformed record inside a batch with a good CRC is found.

Records of ``__consumer_offsets`` (a file in a ``__consumer_offsets-N`` directory, or any file with
``--offsets-decoder``, Kafka's flag) are shown decoded, as JSON, in Kafka's schemas: an offset commit's key
``{"type": "offset_commit", "group", "topic", "partition"}`` and value (``offset``, ``leader_epoch``,
``metadata``, ``commit_timestamp``, and ``expire_timestamp`` for a version 1 value that has one); a group's
key ``{"type": "group_metadata", "group"}`` and value (``protocol_type``, ``generation``, ``protocol``,
``leader``, ``current_state_timestamp``, ``members`` with their ids, client, timeouts and the sizes of their
subscription and assignment); ``null`` for a tombstone. A record that does not decode is shown as any other,
with ``undecodable`` after it.

``.index`` and ``.timeindex`` files print their entries (``--verify`` checks that they increase).

Exit status: 0 when every file is sound; 1 when a batch is corrupt (bad magic, length, CRC or records) or a
file cannot be read, with the error on stderr naming the file, the position and the offsets; 3 when the only
fault is a torn tail, a partial batch at the end of a file (what a crash mid-append leaves; recovery
truncates it); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
from typing import Any, TextIO

from appliance.coordinator.group_records import decode_group_key, decode_group_value
from appliance.coordinator.offset_records import OFFSETS_TOPIC, decode_key, decode_value
from storage.batch_header import BatchHeader, compute_crc, validate_batch
from storage.batch_reader import decode_batch, iter_batches
from storage.compression import codec_name
from storage.errors import CorruptRecordError

__all__ = ["EXIT_CORRUPT", "EXIT_OK", "EXIT_TORN_TAIL", "EXIT_USAGE", "decode_offsets_record", "format_bytes",
           "main"]

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_TORN_TAIL = 3

_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


def format_bytes(data: bytes | None, max_bytes: int = 0) -> str:
    """Show a key or value safely on a terminal: ``null``, a JSON string, or ``0x`` hex; cut past
    ``max_bytes`` (0 = never) with the number of bytes left out."""
    if data is None:
        return "null"
    shown = data if max_bytes <= 0 else data[:max_bytes]
    suffix = f"...(+{len(data) - len(shown)} bytes)" if len(shown) < len(data) else ""
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(ch.isprintable() or ch in "\t\n\r" for ch in text):
        return json.dumps(text, ensure_ascii=False) + suffix
    return "0x" + shown.hex() + suffix


def _batch_line(position: int, header: BatchHeader, crc_valid: bool) -> str:
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count} "
        f"position: {position} size: {header.size} crcValid: {str(crc_valid).lower()} "
        f"compression: {codec_name(header.compression)} producerId: {header.producer_id} "
        f"producerEpoch: {header.producer_epoch} baseSequence: {header.base_sequence} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {str(header.is_transactional).lower()} "
        f"isControl: {str(header.is_control).lower()} "
        f"timestampType: {_TIMESTAMP_TYPES[header.timestamp_type]} baseTimestamp: {header.base_timestamp} "
        f"maxTimestamp: {header.max_timestamp} crc: {header.crc}"
    )


def _decoded_key(key: bytes) -> dict[str, Any] | None:
    offset_key = decode_key(key)
    if offset_key is not None:
        return {"type": "offset_commit", **offset_key._asdict()}
    group = decode_group_key(key)
    return None if group is None else {"type": "group_metadata", "group": group}


def _decoded_value(kind: str, value: bytes) -> dict[str, Any]:
    if kind == "offset_commit":
        commit = decode_value(value)
        decoded = {"offset": commit.offset, "leader_epoch": commit.leader_epoch, "metadata": commit.metadata,
                   "commit_timestamp": commit.commit_timestamp_ms}
        if commit.expire_timestamp_ms >= 0:  # value version 1: a commit that asked for its own retention
            decoded["expire_timestamp"] = commit.expire_timestamp_ms
        return decoded
    group = decode_group_value(value)
    members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                "client_host": m.client_host, "rebalance_timeout": m.rebalance_timeout_ms,
                "session_timeout": m.session_timeout_ms, "subscription_bytes": len(m.subscription),
                "assignment_bytes": len(m.assignment)} for m in group.members]
    return {"protocol_type": group.protocol_type, "generation": group.generation, "protocol": group.protocol,
            "leader": group.leader, "current_state_timestamp": group.current_state_timestamp_ms,
            "members": members}


def decode_offsets_record(key: bytes | None, value: bytes | None) -> tuple[str, str] | None:
    """A ``__consumer_offsets`` record's key and value as JSON text; None if it is not one this reader
    knows (or is malformed)."""
    if key is None:
        return None
    try:
        decoded = _decoded_key(key)
        if decoded is None:
            return None
        shown = None if value is None else _decoded_value(decoded["type"], value)
    except ValueError:
        return None
    return json.dumps(decoded, ensure_ascii=False), json.dumps(shown, ensure_ascii=False)


class _Dumper:
    def __init__(
        self, out: TextIO, err: TextIO, *, verify: bool, print_records: bool, max_bytes: int,
        offsets_decoder: bool = False,
    ) -> None:
        self.out = out
        self.err = err
        self.verify = verify or print_records
        self.print_records = print_records
        self.max_bytes = max_bytes
        self.offsets_decoder = offsets_decoder
        self.status = EXIT_OK

    def fail(self, message: str, status: int = EXIT_CORRUPT) -> None:
        print(f"appliance dump-log: error: {message}", file=self.err)
        if self.status != EXIT_CORRUPT:
            self.status = status

    def dump(self, path: str) -> None:
        print(f"Dumping {path}", file=self.out)
        try:
            with open(path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size == 0:
                    data: bytes | mmap.mmap = b""
                else:
                    data = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
        except OSError as exc:
            self.fail(f"{path}: cannot read: {exc.strerror or exc}")
            return
        view = memoryview(data)
        try:
            if path.endswith(".index") or path.endswith(".timeindex"):
                self._dump_index(path, view)
            else:
                self._dump_log(path, view)
        finally:
            try:
                view.release()  # every view derived from it was dropped when the dump helpers returned
                if isinstance(data, mmap.mmap):
                    data.close()
            except BufferError:  # an exception in flight still holds derived views: the mmap goes with it
                pass

    def _dump_log(self, path: str, data: memoryview) -> None:
        base = _base_offset(path)
        if base is not None:
            print(f"Log starting offset: {base}", file=self.out)
        batches = iter_batches(data, where=path, verify_crc=False, allow_truncated_tail=True)
        count = records = 0
        last_offset = None
        try:
            for position, header in batches:
                crc_valid = compute_crc(data, position, header.size) == header.crc
                print(_batch_line(position, header, crc_valid), file=self.out)
                count += 1
                records += header.records_count
                last_offset = header.last_offset
                if not crc_valid:
                    try:
                        validate_batch(data, position, where=path)
                    except CorruptRecordError as exc:  # the canonical message, stored and computed CRCs
                        self.fail(str(exc))
                if self.verify:
                    self._records(path, data, position)
        except CorruptRecordError as exc:
            self.fail(f"{exc}; {batches.position} valid bytes precede it")
            return
        finally:
            valid_bytes = batches.position
            tail = batches.truncated_tail_bytes
            del batches  # release its view of the map
        if tail:
            self.fail(
                f"{path}: torn tail: a partial batch of {tail} bytes at position {valid_bytes} "
                f"(after offset {'none' if last_offset is None else last_offset}); recovery truncates it",
                EXIT_TORN_TAIL,
            )
        print(
            f"Summary: {count} batches, {records} records, {valid_bytes} valid bytes of {len(data)}",
            file=self.out,
        )

    def _records(self, path: str, data: memoryview, position: int) -> None:
        try:
            decoded = decode_batch(data, position, where=path, verify_crc=False)
        except CorruptRecordError as exc:
            self.fail(str(exc))
            return
        if not self.print_records:
            return
        time_name = _TIMESTAMP_TYPES[decoded.header.timestamp_type]
        directory = os.path.basename(os.path.dirname(os.path.abspath(path)))
        offsets = self.offsets_decoder or directory.startswith(OFFSETS_TOPIC + "-")
        for record in decoded.records():
            headers = ", ".join(
                f"{json.dumps(k, ensure_ascii=False)}: {format_bytes(v, self.max_bytes)}"
                for k, v in record.headers
            )
            shown = decode_offsets_record(record.key, record.value) if offsets else None
            key, value = shown or (format_bytes(record.key, self.max_bytes),
                                   format_bytes(record.value, self.max_bytes))
            note = " undecodable" if offsets and not shown else ""
            print(
                f"| offset: {record.offset} {time_name}: {record.timestamp} "
                f"keySize: {-1 if record.key is None else len(record.key)} "
                f"valueSize: {-1 if record.value is None else len(record.value)} "
                f"key: {key} value: {value} headers: {{{headers}}}{note}",
                file=self.out,
            )

    def _dump_index(self, path: str, data: memoryview) -> None:
        import numpy as np

        from storage.offset_index import OFFSET_INDEX_DTYPE
        from storage.time_index import TIME_INDEX_DTYPE

        time_index = path.endswith(".timeindex")
        dtype = TIME_INDEX_DTYPE if time_index else OFFSET_INDEX_DTYPE
        base = _base_offset(path) or 0
        if len(data) % dtype.itemsize:
            self.fail(f"{path}: size {len(data)} is not a multiple of the {dtype.itemsize}-byte entry")
        entries = np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize).copy()
        nonzero = np.flatnonzero(entries.view(np.uint8).reshape(len(entries), -1).any(axis=1))
        used = int(nonzero[-1]) + 1 if len(nonzero) else min(len(entries), 1)  # unused tail is zero
        key = "timestamp" if time_index else "relative_offset"
        previous = None
        for i in range(used):
            entry = entries[i]
            if time_index:
                print(
                    f"timestamp: {int(entry['timestamp'])} offset: {base + int(entry['relative_offset'])}",
                    file=self.out,
                )
            else:
                print(
                    f"offset: {base + int(entry['relative_offset'])} position: {int(entry['position'])}",
                    file=self.out,
                )
            if self.verify and previous is not None and int(entry[key]) <= previous:
                self.fail(
                    f"{path}: index entry {i}: {key} {int(entry[key])} does not increase past {previous}"
                )
            previous = int(entry[key])
        print(f"Summary: {used} entries of {len(entries)} slots", file=self.out)


def _base_offset(path: str) -> int | None:
    stem = os.path.basename(path).split(".")[0]
    return int(stem) if len(stem) == 20 and stem.isdigit() else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance dump-log",
        description="Print the record batches of segment files (.log), or the entries of .index/.timeindex "
        "files, like kafka-dump-log.  Exit 0 sound, 1 corrupt, 3 torn tail only.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="segment (.log) or index file")
    parser.add_argument("--files", metavar="PATH[,PATH...]", action="append", default=[],
                        help="the files, as kafka-dump-log takes them (comma-separated)")
    parser.add_argument("--verify", "--deep-iteration", action="store_true",
                        help="also decode every record of every batch (kafka-dump-log: --deep-iteration)")
    parser.add_argument("--print-records", "--print-data-log", action="store_true",
                        help="print every record (implies --verify; kafka-dump-log: --print-data-log)")
    parser.add_argument("--offsets-decoder", action="store_true",
                        help="decode records as __consumer_offsets records (automatic in its directories)")
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=256,
        metavar="N",
        help="show at most N bytes of each key/value (0 = all; default 256)",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.paths += [path for given in args.files for path in given.split(",") if path]
    if not args.paths:
        parser.error("give the files: PATH... or --files PATH[,PATH...]")
    dumper = _Dumper(
        sys.stdout, sys.stderr, verify=args.verify, print_records=args.print_records,
        max_bytes=args.max_bytes, offsets_decoder=args.offsets_decoder,
    )
    for path in args.paths:
        dumper.dump(path)
    sys.stdout.flush()
    return dumper.status
