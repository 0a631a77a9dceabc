"""The coordinator room: Kafka's classic consumer-group protocol as a pure state machine, and the committed
offsets; the broker (``appliance.broker.group_requests``) calls it, it never imports the broker."""

from appliance.coordinator.coordinator import GroupCoordinator
from appliance.coordinator.group import Completion, GroupSettings, GroupState, JoinArgs
from appliance.coordinator.offsets import CommittedOffset, OffsetStore

__all__ = ["CommittedOffset", "Completion", "GroupCoordinator", "GroupSettings", "GroupState", "JoinArgs",
           "OffsetStore"]
