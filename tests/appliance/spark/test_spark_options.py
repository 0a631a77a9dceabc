"""Every option mistake is a ConfigError naming the option, the value and what was expected (no Spark:
``appliance.spark.options`` is plain Python; test_spark_batch shows the same errors through Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.spark.options import EARLIEST, LATEST, OffsetSpec, parse_offsets, parse_options
from storage.errors import ConfigError

BASE = {"bootstrap.servers": "127.0.0.1:9092"}


@pytest.mark.parametrize(("options", "expected"), [
    ({}, "set option bootstrap.servers"),
    ({"bootstrap.servers": "localhost"}, "option bootstrap.servers: bootstrap server 'localhost': expected "
     "HOST:PORT"),
    ({**BASE, "failOnDataLos": "true"}, "unknown option 'failOnDataLos' (did you mean 'failOnDataLoss'?)"),
    ({**BASE, "subscribe": " , "}, "option subscribe names no topic"),
    ({**BASE, "subscribePattern": "(["}, "option subscribePattern '([' is not a regular expression"),
    ({**BASE, "minPartitions": "0"}, "option minPartitions='0': expected a whole number >= 1"),
    ({**BASE, "maxRecordsPerTrigger": "many"}, "option maxRecordsPerTrigger='many': expected a whole number"),
    ({**BASE, "failOnDataLoss": "maybe"}, "option failOnDataLoss='maybe': expected true or false"),
    ({**BASE, "compression.type": "lzo"},
     "option compression.type='lzo': expected one of none, gzip, snappy, lz4, zstd"),
    ({**BASE, "txnVersion": "-1"}, "option txnVersion='-1': expected a whole number >= 0"),
    ({**BASE, "startingOffsets": "[1]"}, "option startingOffsets: expected a JSON object of topics"),
    ({**BASE, "startingOffsets": '{"t": [0]}'}, "topic 't': expected an object of partition -> offset"),
    ({**BASE, "startingOffsets": '{"t": {"zero": 1}}'}, "partition 'zero' is not a partition number"),
    ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, "topic 't' partition 0: offset -3 is not an offset"),
    ({**BASE, "startingOffsets": '{"t": {"0": 1.5}}'}, "topic 't' partition 0: offset 1.5 is not an offset"),
    ({**BASE, "endingOffsets": "{"}, "option endingOffsets: '{' is not earliest, latest or valid JSON "
     "(Expecting property name enclosed in double quotes at line 1 column 2)"),
    ({**BASE, "appliance.test.faultPoint": "boom"}, "expected commit:<batchId> or kill:<batchId>"),
])
def test_malformed_options_name_the_option(options: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    assert expected in str(caught.value)


@pytest.mark.parametrize(("options", "kind", "expected"), [
    ({"subscribe": "a", "subscribePattern": "a"}, "batch", "exactly one of the options subscribe"),
    ({}, "stream", "exactly one of the options subscribe"),
    ({"subscribe": "a", "maxRecordsPerTrigger": "10"}, "batch", "maxRecordsPerTrigger applies to streaming"),
    ({"subscribe": "a", "maxBytesPerTrigger": "10"}, "batch", "maxBytesPerTrigger applies to streaming"),
    ({"subscribe": "a", "startingOffsets": "latest"}, "batch", "startingOffsets=latest makes a batch read"),
    ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "batch", "-1 (latest) is not allowed"),
    ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "batch", "-2 (earliest) is not allowed"),
    ({"subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, "batch", "names topic 'b', which is not "
     "subscribed (subscribe=a)"),
    ({"subscribePattern": "a.*", "startingOffsets": '{"b": {"0": 1}}'}, "stream", "names topic 'b', which "
     "does not match subscribePattern 'a.*'"),
    ({"subscribe": "a", "endingOffsets": "latest"}, "stream", "endingOffsets applies to batch reads"),
    ({}, "write", "a write needs a 'value' column"),
    ({}, "write-value", "set option topic, or give the DataFrame a 'topic' column"),
    ({"topic": "t", "txnAppId": "x"}, "write-value", "options txnAppId and txnVersion go together"),
    ({"topic": "t", "txnAppId": "x", "txnVersion": "1"}, "stream-write", "txnAppId/txnVersion are for batch"),
])
def test_options_that_do_not_fit_the_query(options: dict[str, str], kind: str, expected: str) -> None:
    parsed = parse_options({**BASE, **options})
    with pytest.raises(ConfigError) as caught:
        if kind == "batch":
            parsed.for_batch_read()
        elif kind == "stream":
            parsed.for_stream_read()
        elif kind == "write":
            parsed.for_write(["key"], streaming=False)
        elif kind == "write-value":
            parsed.for_write(["key", "value"], streaming=False)
        else:
            parsed.for_write(["value"], streaming=True)
    assert expected in str(caught.value)


def test_defaults_and_spark_own_options() -> None:
    parsed = parse_options({**BASE, "SUBSCRIBE": "a,b,a", "path": "/x", "checkpointLocation": "/c",
                            "kafka.compression.type": "ZSTD"})
    assert parsed.subscribe == ("a", "b") and parsed.compression == "zstd"
    batch, stream = parsed.for_batch_read(), parsed.for_stream_read()
    assert batch.starting_offsets == OffsetSpec(EARLIEST) and batch.ending_offsets == OffsetSpec(LATEST)
    assert stream.starting_offsets == OffsetSpec(LATEST)
    spec = parse_options({**BASE, "subscribe": "a", "startingOffsets": '{"a": {"1": 7}}'}).for_stream_read()
    assert spec.starting_offsets is not None
    assert (spec.starting_offsets.offset_for("a", 1), spec.starting_offsets.offset_for("a", 0)) == (7, LATEST)


partition_offsets = st.dictionaries(st.integers(0, 50), st.integers(-2, 10**12), min_size=1, max_size=4)
offset_maps = st.dictionaries(st.text("abc-._", min_size=1, max_size=5), partition_offsets, min_size=1,
                              max_size=3)


@settings(max_examples=100)
@given(offset_maps)
def test_offset_maps_parse_back_to_what_they_say(offsets: dict[str, dict[int, int]]) -> None:
    text = json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in offsets.items()})
    spec = parse_offsets(text)
    assert {t: dict(ps) for t, ps in spec.specific.items()} == offsets
    for cut in range(len(text)):  # every truncation is refused with a ConfigError, nothing else
        try:
            parse_offsets(text[:cut])
        except ConfigError:
            continue
        assert text[:cut].strip().lower() in ("earliest", "latest")

