"""What a Spark test asks of a query the data source must refuse: the refusal comes while Spark plans it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def planning_error(action: Callable[[], Any]) -> str:
    """The message Spark raises on the driver for a query the data source refuses while planning."""
    with pytest.raises(Exception) as caught:
        action()
    message = str(caught.value)
    assert "stage failure" not in message and "Task " not in message, message  # not from an executor
    return message
