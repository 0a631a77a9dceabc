"""Keyless records in a batch, as a compacted topic refuses them: against the list of keys given."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_builder import build_batch
from storage.compression import COMPRESSION_GZIP, COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.errors import CorruptRecordError
from storage.record_checks import keyless_records, refusal, requires_keys


@settings(deadline=None)
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=8)), min_size=1, max_size=60),
       compression=st.sampled_from([COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_ZSTD]))
def test_keyless_records_are_the_null_keys(keys: list[bytes | None], compression: int) -> None:
    batch = build_batch([b"v"] * len(keys), keys, compression=compression)
    assert keyless_records(batch).tolist() == [i for i, key in enumerate(keys) if key is None]


def test_an_empty_key_is_a_key() -> None:
    assert keyless_records(build_batch([b"v", b"w"], [b"", None])).tolist() == [1]


def test_undecodable_records_raise_the_storage_error() -> None:
    batch = bytearray(build_batch([b"v"] * 3, [b"k"] * 3))
    batch[-4:] = b"\xff\xff\xff\xff"
    with pytest.raises(CorruptRecordError):
        keyless_records(bytes(batch))


def test_requires_keys_reads_kafka_policy_lists() -> None:
    assert requires_keys("compact") and requires_keys("compact,delete")
    assert requires_keys(("delete", "compact"))
    assert not requires_keys("delete") and not requires_keys(("delete",))


def test_refusal_names_partition_and_indexes() -> None:
    found = refusal("t-3", list(range(12)))
    assert found.indexes == tuple(range(12))
    assert found.record_messages[5].startswith("compacted topic t-3: record at batch index 5 has no key; ")
    assert "12 record(s) without a key (batch index 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...)" in found.message
    assert "not appended" in found.message
