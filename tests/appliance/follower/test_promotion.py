"""The promotion decisions (``appliance.follower.promotion``) on real views of the leaders, no process.

The whole promotion (refusals over the control socket, the ``exec``, the other replicas following the new
leader) runs in ``test_replica_process.py`` and ``test_replication_failover.py``; here each decision is
checked on its own, with the cases those tests cannot reach cheaply (a view seen too long before silence).
"""

from __future__ import annotations

import re

import pytest

from appliance.follower.leaders import REFRESH_INTERVAL_MS, ClusterView, PartitionView
from appliance.follower.promotion import (
    PromotionRefused,
    judge_sync,
    leadership,
    partitions_named,
    refuse_while_a_leader_answers,
    unclean_warning,
)
from replicas.leader_connection import LeaderInfo

NODE = 2
LAG_MS = 10_000
HELD = {("orders", 0), ("orders", 1)}


def view(at_ms: int, isr: tuple[int, ...], *, epoch: int = 4) -> ClusterView:
    leader = LeaderInfo("10.0.0.1", 9092, 0, epoch)
    partitions = {key: PartitionView(key[0], key[1], leader, (0, 1, NODE), isr) for key in HELD}
    return ClusterView(at_ms, partitions=partitions, answered=("10.0.0.1:9092",))


def test_all_names_every_partition_held() -> None:
    assert partitions_named("all", HELD, NODE) == HELD
    assert partitions_named(["orders-1", "orders-0"], HELD, NODE) == HELD


@pytest.mark.parametrize(("wanted", "message"), [
    (["orders-0"], "leadership moves per node: replica 2 would lead every partition it holds; also name "
                   "orders-1"),
    (["orders-7", "orders-0"], "'orders-7': not a partition this replica holds (orders-0, orders-1)"),
    (["orders"], "'orders': not a partition this replica holds"),
    ("some", "partitions: 'some': expected \"all\" or a list of TOPIC-PARTITION"),
])  # fmt: skip
def test_a_request_that_does_not_name_every_partition_held_is_refused(wanted: object, message: str) -> None:
    with pytest.raises(PromotionRefused, match=re.escape(message)):
        partitions_named(wanted, HELD, NODE)


def test_a_replica_holding_nothing_is_refused() -> None:
    with pytest.raises(PromotionRefused, match="replica 2 holds no partitions"):
        partitions_named("all", set(), NODE)


def test_refused_while_a_leader_answers() -> None:
    refuse_while_a_leader_answers(None)  # nobody answered
    refuse_while_a_leader_answers(ClusterView(5))  # answered, leads nothing
    answering = re.escape("leader 0 still answers at 10.0.0.1:9092 (epoch 4)")
    with pytest.raises(PromotionRefused, match=answering):
        refuse_while_a_leader_answers(view(5, (0, NODE)))


def test_in_sync_when_the_last_isr_seen_holds_this_node_and_is_recent_enough() -> None:
    last = view(1_000, (0, NODE))
    silent_at = 1_000 + LAG_MS + REFRESH_INTERVAL_MS  # the oldest a trusted view may be
    verdicts = judge_sync(sorted(HELD), last, silent_at, lag_time_max_ms=LAG_MS, node_id=NODE)
    assert [(v.key, v.in_isr, v.why_not) for v in verdicts] == [(key, True, "") for key in sorted(HELD)]
    assert unclean_warning([], unclean=False) is None


def test_out_of_sync_for_each_reason() -> None:
    keys = [("orders", 0)]
    never = judge_sync(keys, None, None, lag_time_max_ms=LAG_MS, node_id=NODE)[0]
    assert (never.in_isr, never.why_not) == (False, "no leader was ever seen")
    dropped = judge_sync(keys, view(1_000, (0, 1)), None, lag_time_max_ms=LAG_MS, node_id=NODE)[0]
    assert (dropped.in_isr, dropped.why_not) == (False, "the last ISR seen was [0, 1] (leader 0, epoch 4)")
    stale_at = 1_000 + LAG_MS + REFRESH_INTERVAL_MS + 1
    stale = judge_sync(keys, view(1_000, (0, NODE)), stale_at, lag_time_max_ms=LAG_MS, node_id=NODE)[0]
    assert not stale.in_isr
    seen_before_ms = LAG_MS + REFRESH_INTERVAL_MS + 1
    assert stale.why_not.startswith(f"the ISR [0, {NODE}] was seen {seen_before_ms} ms before the leader")


def test_out_of_sync_is_refused_unless_unclean_which_warns() -> None:
    problems = ["orders-0: not in sync (no leader was ever seen; log end 7)"]
    with pytest.raises(PromotionRefused, match=r"^not promoted: orders-0: not in sync .* pass --unclean$"):
        unclean_warning(problems, unclean=False)
    warning = unclean_warning(problems, unclean=True)
    assert warning is not None and warning.startswith("UNCLEAN PROMOTION: orders-0: not in sync")
    assert "are LOST" in warning


def test_leadership_takes_the_highest_epoch_and_the_isr_without_the_old_leader() -> None:
    in_sync = judge_sync([("orders", 0)], view(1_000, (0, 1, NODE), epoch=4), None, lag_time_max_ms=LAG_MS,
                         node_id=NODE)[0]  # fmt: skip
    assert leadership(in_sync, NODE, log_epoch=3, fetched_epoch=-1) == (4, (1, NODE))
    assert leadership(in_sync, NODE, log_epoch=6, fetched_epoch=5).previous_epoch == 6
    out_of_sync = judge_sync([("orders", 0)], None, None, lag_time_max_ms=LAG_MS, node_id=NODE)[0]
    assert leadership(out_of_sync, NODE, log_epoch=2, fetched_epoch=3) == (3, (NODE,))
