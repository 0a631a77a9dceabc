"""``appliance.Producer``'s first send to many partitions attaches their rings in a few ``attach_many``
round trips, not one ``attach`` per partition: counted in the supervisor's ``status`` (requests by op)
against a real ``appliance serve``, and every record read back from its partition's log."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.harness import Appliance

from appliance.client.producer import Producer
from appliance.client.route import ATTACH_AHEAD
from storage.batch_reader import iter_records

PARTITIONS = 64


@pytest.fixture
def appliance() -> Iterator[Appliance]:
    serve = Appliance(None, f"topics.wide.partitions={PARTITIONS}", "listeners=PLAINTEXT://127.0.0.1:0")
    try:
        serve.start()
        yield serve
    finally:
        serve.close()


def requests(serve: Appliance) -> dict[str, int]:
    with serve.client() as client:
        return dict(client.status()["requests"])


def test_first_send_to_many_partitions_attaches_in_few_round_trips(appliance: Appliance) -> None:
    before = requests(appliance)
    producer = Producer({"appliance.control.socket": str(appliance.socket_path)})
    try:
        for partition in range(PARTITIONS):
            producer.send("wide", f"r{partition}".encode(), partition=partition)
        producer.flush(30)
        after = requests(appliance)
    finally:
        producer.close(30)
    single = after.get("attach", 0) - before.get("attach", 0)
    batched = after.get("attach_many", 0) - before.get("attach_many", 0)
    assert single == 0, single
    assert 1 <= batched <= -(-PARTITIONS // (ATTACH_AHEAD + 1)), batched
    for partition in range(PARTITIONS):
        values = [bytes(r.value or b"") for data in appliance.batches("wide", partition)
                  for r in iter_records(data)]  # fmt: skip
        assert values == [f"r{partition}".encode()], (partition, values)
