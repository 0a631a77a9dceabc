"""Group metadata records (GroupMetadataKey v2 / GroupMetadataValue v3): Kafka's layout, every version read,
and a group taken back from its record keeps its generation and members."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.coordinator import GroupCoordinator, GroupSettings, GroupState, JoinArgs
from appliance.coordinator.group_records import (
    GroupMetadata,
    GroupMetadataMember,
    decode_group_key,
    decode_group_value,
    encode_group_key,
    encode_group_value,
)
from appliance.coordinator.offset_records import OffsetKey, decode_key, encode_key
from ipc.kafka import ErrorCode

MEMBER = GroupMetadataMember("m-1", "static-1", "client", "/127.0.0.1", 30000, 10000, b"sub", b"assigned")
RECORD = GroupMetadata("consumer", 7, "range", "m-1", 1_700_000_000_000, [MEMBER])


def _s(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_the_layout_is_kafkas() -> None:
    assert encode_group_key("g") == b"\x00\x02" + _s("g")
    member = (_s("m-1") + _s("static-1") + _s("client") + _s("/127.0.0.1")
              + struct.pack(">iii", 30000, 10000, 3) + b"sub" + struct.pack(">i", 8) + b"assigned")
    assert encode_group_value(RECORD) == (b"\x00\x03" + _s("consumer") + struct.pack(">i", 7) + _s("range")
                                          + _s("m-1") + struct.pack(">q", 1_700_000_000_000)
                                          + struct.pack(">i", 1) + member)


def test_keys_of_each_kind_are_told_apart() -> None:
    offset_key = encode_key(OffsetKey("g", "t", 0))
    assert decode_group_key(encode_group_key("g")) == "g" and decode_group_key(offset_key) is None
    assert decode_key(encode_group_key("g")) is None


def test_version_0_has_no_timestamp_rebalance_timeout_or_instance_id() -> None:
    header = b"\x00\x00" + _s("consumer") + struct.pack(">i", 2) + b"\xff\xff" + b"\xff\xff"
    member = _s("m") + _s("c") + _s("h") + struct.pack(">iii", 6000, 0, 0)
    v0 = header + struct.pack(">i", 1) + member
    assert decode_group_value(v0) == GroupMetadata(
        "consumer", 2, None, None, -1, [GroupMetadataMember("m", None, "c", "h", 6000, 6000, b"", b"")])


@settings(max_examples=25, deadline=None)
@given(st.binary(max_size=64))
def test_malformed_values_are_value_errors(data: bytes) -> None:
    try:
        decode_group_value(data)
    except ValueError:
        pass


def test_a_truncated_value_and_a_newer_version_are_refused() -> None:
    good = encode_group_value(RECORD)
    with pytest.raises(ValueError, match="bytes"):
        decode_group_value(good[:-3])
    with pytest.raises(ValueError, match="version 4"):
        decode_group_value(b"\x00\x04" + good[2:])


def test_a_loaded_group_keeps_its_generation_and_its_members_sessions_start_again() -> None:
    c = GroupCoordinator(GroupSettings(initial_rebalance_delay_ms=0))
    c.load_group("g", RECORD, 50_000)
    g = c.groups["g"]
    assert (g.state, g.generation_id, g.leader_id, g.static_members) == (GroupState.STABLE, 7, "m-1",
                                                                         {"static-1": "m-1"})
    assert c.heartbeat("g", "m-1", 7, 55_000).error_code == ErrorCode.NONE
    assert c.describe("g").members[0].member_assignment == b"assigned"
    assert c.take_metadata(0) == []  # loading writes nothing
    c.tick(55_000 + 10_000)  # silent for its session: removed, the group empties at generation 8
    assert (g.state, g.generation_id) == (GroupState.EMPTY, 8)
    (written,) = c.take_metadata(1)
    assert written == ("g", GroupMetadata("consumer", 8, None, None, 1, []))
    c.load_group("g", None, 70_000)  # a tombstone
    assert "g" not in c.groups


def test_a_completed_rebalance_is_due_for_writing() -> None:
    c = GroupCoordinator(GroupSettings(initial_rebalance_delay_ms=0), new_member_id=lambda client: "m")
    args = JoinArgs(member_id="", session_timeout_ms=10_000, rebalance_timeout_ms=20_000,
                    protocol_type="consumer", protocols=[("range", b"sub")], client_id="c")
    (joined,) = c.join("g", args, "j", 0)
    assert c.take_metadata(0) == []  # CompletingRebalance: not yet
    c.sync("g", "m", joined.response.generation_id, [("m", b"a")], "s", 0)
    (written,) = c.take_metadata(5)
    member = GroupMetadataMember("m", None, "c", "", 20_000, 10_000, b"sub", b"a")
    assert written == ("g", GroupMetadata("consumer", 1, "range", "m", 5, [member]))
