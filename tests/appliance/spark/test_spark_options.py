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
    ({}, "option 'kafka.bootstrap.servers' must be set"),
    ({"kafka.bootstrap.servers": "localhost"},
     "option kafka.bootstrap.servers: bootstrap server 'localhost': expected HOST:PORT"),
    ({**BASE, "failOnDataLos": "true"}, "unknown option 'failOnDataLos' (did you mean 'failOnDataLoss'?)"),
    ({**BASE, "subscribe": " , "}, "option subscribe=' , ': no topics to subscribe to"),
    ({**BASE, "subscribePattern": " "}, "option subscribePattern=' ': the pattern to subscribe to is empty"),
    ({**BASE, "subscribePattern": "(["}, "option subscribePattern '([' is not a regular expression"),
    ({**BASE, "assign": "t"}, "option assign='t': no topic partitions to assign; expected e.g. "
     '{"topicA": [0, 1], "topicB": [2, 4]}'),
    ({**BASE, "assign": '{"t": [0, 1'}, "option assign: '{\"t\": [0, 1' is not valid JSON"),
    ({**BASE, "assign": '{"t": {"0": 1}}'}, "option assign: topic 't': expected a list of partition numbers"),
    ({**BASE, "minPartitions": "0"}, "option minPartitions='0': expected a whole number >= 1"),
    ({**BASE, "maxRecordsPerTrigger": "many"}, "option maxOffsetsPerTrigger='many': expected a whole number"),
    ({**BASE, "minOffsetsPerTrigger": "-5"}, "option minOffsetsPerTrigger='-5': expected a whole number"),
    ({**BASE, "maxTriggerDelay": "soon"}, "option maxTriggerDelay='soon': expected a duration such as 15m"),
    ({**BASE, "failOnDataLoss": "maybe"}, "option failOnDataLoss='maybe': expected true or false"),
    ({**BASE, "includeHeaders": "yes please"}, "option includeHeaders='yes please': expected true or false"),
    ({**BASE, "compression.type": "lzo"},
     "option compression.type='lzo': expected one of none, gzip, snappy, lz4, zstd"),
    ({**BASE, "txnVersion": "-1"}, "option txnVersion='-1': expected a whole number >= 0"),
    ({**BASE, "startingOffsets": "[1]"}, "option startingOffsets: expected a JSON object of topics"),
    ({**BASE, "startingOffsets": '{"t": [0]}'}, "topic 't': expected an object of partition -> value"),
    ({**BASE, "startingOffsets": '{"t": {"zero": 1}}'}, "partition 'zero' is not a partition number"),
    ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, "topic 't' partition 0: offset -3 is not an offset"),
    ({**BASE, "startingOffsets": '{"t": {"0": 1.5}}'}, "topic 't' partition 0: offset 1.5 is not an offset"),
    ({**BASE, "endingOffsets": "{"}, "option endingOffsets: '{' is not earliest, latest or valid JSON "
     "(Expecting property name enclosed in double quotes at line 1 column 2)"),
    ({**BASE, "startingOffsetsByTimestamp": '{"t": {"0": 1000'}, "option startingOffsetsByTimestamp: "
     "'{\"t\": {\"0\": 1000' is not valid JSON (Expecting ',' delimiter at line 1 column 17)"),
    ({**BASE, "endingOffsetsByTimestamp": '{"t": {"0": -1}}'}, "option endingOffsetsByTimestamp: topic 't' "
     "partition 0: -1 is not a timestamp"),
    ({**BASE, "startingTimestamp": "yesterday"},
     "option startingTimestamp='yesterday': expected a single long value"),
    ({**BASE, "endingTimestamp": "-5"}, "option endingTimestamp='-5': a timestamp is >= 0"),
    ({**BASE, "startingOffsetsByTimestampStrategy": "earliest"},
     "option startingOffsetsByTimestampStrategy='earliest': expected one of error, latest"),
    ({**BASE, "kafka.auto.offset.reset": "earliest"}, "'kafka.auto.offset.reset' is not supported: set the "
     "source option startingOffsets"),
    ({**BASE, "kafka.value.deserializer": "x"}, "'kafka.value.deserializer' is not supported"),
    ({**BASE, "kafka.enable.auto.commit": "true"}, "'kafka.enable.auto.commit' is not supported"),
    ({**BASE, "kafka.isolation.level": "read_committed"}, "kafka.isolation.level=read_committed: "
     "transactions are not built yet"),
    ({**BASE, "kafka.security.protocol": "SASL_SSL"}, "the appliance's listener speaks PLAINTEXT only"),
    ({**BASE, "appliance.test.faultPoint": "boom"}, "expected commit:<batchId> or kill:<batchId>"),
])
def test_malformed_options_name_the_option(options: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    assert expected in str(caught.value)


WRITE = {"key": "binary", "value": "string"}


@pytest.mark.parametrize(("options", "kind", "expected"), [
    ({"subscribe": "a", "subscribePattern": "a"}, "batch", "only one of the options assign, subscribe, "
     "subscribePattern can be set; got subscribe and subscribePattern"),
    ({"subscribe": "a", "assign": '{"a": [0]}'}, "stream", "only one of the options assign, subscribe, "
     "subscribePattern can be set; got assign and subscribe"),
    ({}, "stream", "one of the options assign, subscribe, subscribePattern must be set"),
    ({"subscribe": "a", "startingOffsets": "latest"}, "batch", "starting offset can't be latest for batch"),
    ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "batch", "-1 (latest) can't be a starting "
     "offset"),
    ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "batch", "-2 (earliest) can't be an ending"),
    ({"subscribe": "a", "endingOffsets": "earliest"}, "batch", "ending offset can't be earliest"),
    ({"subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, "batch", "option startingOffsets names topic "
     "'b', which is not subscribed (subscribe=a)"),
    ({"assign": '{"a": [0]}', "startingOffsetsByTimestamp": '{"b": {"0": 1}}'}, "batch",
     "option startingOffsetsByTimestamp names topic 'b', which assign does not name"),
    ({"subscribePattern": "a.*", "startingOffsets": '{"b": {"0": 1}}'}, "stream", "names topic 'b', which "
     "does not match subscribePattern 'a.*'"),
    ({"subscribe": "a", "endingOffsets": "latest"}, "stream", "option endingOffsets: an ending offset or "
     "timestamp is not valid in streaming queries"),
    ({"subscribe": "a", "endingTimestamp": "5"}, "stream", "option endingTimestamp: an ending offset"),
    ({"subscribe": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "stream",
     "option minOffsetsPerTrigger: its value (10) is higher than maxOffsetsPerTrigger (5)"),
    ({"subscribe": "a", "kafka.max.pol.records": "5"}, "batch", "'kafka.max.pol.records' is not a consumer "
     "or producer setting the appliance's clients take (did you mean 'kafka.max.poll.records'?)"),
    ({"subscribe": "a", "kafka.max.poll.records": "none"}, "stream", "option kafka.max.poll.records='none': "
     "expected a whole number"),
    ({"topic": "t", "kafka.linger.ms": "soon"}, "write", "option kafka.linger.ms='soon'"),
    ({"topic": "t", "kafka.enable.idempotence": "false"}, "write", "kafka.enable.idempotence=false: the"),
    ({"topic": "t", "kafka.acks": "0"}, "write", "kafka.acks=0: the sink must know"),
    ({}, "write-no-value", "required attribute 'value' not found"),
    ({}, "write", "topic option required when no 'topic' attribute is present"),
    ({}, "write-int-topic", "topic attribute unsupported type int; topic must be a(n) string"),
    ({"topic": "t"}, "write-long-partition", "partition attribute unsupported type bigint; partition must be "
     "a(n) int"),
    ({"topic": "t"}, "write-int-value", "value attribute unsupported type int; value must be a(n) string or "
     "binary"),
    ({"topic": "t", "txnAppId": "x"}, "write", "options txnAppId and txnVersion go together"),
    ({"topic": "t", "txnAppId": "x", "txnVersion": "1"}, "stream-write", "txnAppId/txnVersion are for batch"),
])
def test_options_that_do_not_fit_the_query(options: dict[str, str], kind: str, expected: str) -> None:
    parsed = parse_options({**BASE, **options})
    columns = {"write": WRITE, "write-no-value": {"key": "binary", "topic": "string"},
               "write-int-topic": {**WRITE, "topic": "int"}, "stream-write": WRITE,
               "write-long-partition": {**WRITE, "partition": "bigint"},
               "write-int-value": {"value": "int"}}.get(kind, WRITE)
    with pytest.raises(ConfigError) as caught:
        if kind == "batch":
            parsed.for_batch_read()
        elif kind == "stream":
            parsed.for_stream_read()
        else:
            parsed.for_write(columns, streaming=kind == "stream-write")
    assert expected in str(caught.value)


def test_defaults_aliases_precedence_and_spark_own_options() -> None:
    parsed = parse_options({**BASE, "SUBSCRIBE": "a,b,a", "path": "/x", "checkpointLocation": "/c",
                            "kafka.compression.type": "ZSTD", "groupIdPrefix": "p", "kafka.group.id": "g",
                            "kafka.isolation.level": "read_uncommitted", "kafka.max.poll.records": "7",
                            "kafka.linger.ms": "3", "maxRecordsPerTrigger": "9"})
    assert parsed.subscribe == ("a", "b") and parsed.compression == "zstd"
    assert parsed.max_offsets_per_trigger == 9 and not parsed.include_headers  # Spark's defaults
    assert parsed.max_trigger_delay_ms == 15 * 60_000 and parsed.starting_strategy == "error"
    assert parsed.consumer_settings() == {"max.poll.records": 7}  # kafka.linger.ms is the producer's
    assert parsed.producer_settings() == {"linger.ms": 3}
    batch, stream = parsed.for_batch_read(), parsed.for_stream_read()  # maxOffsetsPerTrigger: ignored
    assert batch.starting_offsets == OffsetSpec(EARLIEST, option="startingOffsets")
    assert batch.ending_offsets == OffsetSpec(LATEST, option="endingOffsets")
    assert stream.starting_offsets == OffsetSpec(LATEST, option="startingOffsets")
    spec = parse_options({**BASE, "subscribe": "a", "startingOffsets": '{"a": {"1": 7}}'}).for_stream_read()
    assert spec.starting_offsets is not None
    assert (spec.starting_offsets.offset_for("a", 1), spec.starting_offsets.offset_for("a", 0)) == (7, LATEST)
    # startingTimestamp > startingOffsetsByTimestamp > startingOffsets, and the same for the ending point
    every = {**BASE, "subscribe": "a", "startingOffsets": "earliest", "endingOffsets": "latest",
             "startingOffsetsByTimestamp": '{"a": {"0": 5}}', "endingOffsetsByTimestamp": '{"a": {"0": 9}}'}
    chosen = parse_options({**every, "startingTimestamp": "3", "endingTimestamp": "8"})
    assert chosen.starting_offsets is not None and chosen.starting_offsets.timestamp == 3
    assert chosen.ending_offsets is not None and chosen.ending_offsets.timestamp == 8
    chosen = parse_options(every)
    assert chosen.starting_offsets is not None and chosen.starting_offsets.timestamps == {"a": {0: 5}}
    assert chosen.ending_offsets is not None and chosen.ending_offsets.timestamps == {"a": {0: 9}}
    assert parse_options({**BASE, "maxTriggerDelay": "2s"}).max_trigger_delay_ms == 2000
    assert parse_options({**BASE, "maxTriggerDelay": "250"}).max_trigger_delay_ms == 250
    assigned = parse_options({**BASE, "assign": '{"b": [2, 0, 2], "a": [1]}'})
    assert assigned.assign == {"b": (0, 2), "a": (1,)}
    # the sink: option topic overrides a topic column of any type; other columns are ignored
    parse_options({**BASE, "topic": "t"}).for_write({"value": "binary", "topic": "int", "n": "double"},
                                                    streaming=False)


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

