"""Shared fixtures for the test suite, and how pytest-xdist shares it out.

`make test` runs two pytest-xdist workers (``--dist loadgroup``). Each test module is one group, so a module's
fixtures (most start one `appliance serve` for the whole module) start once; the Spark modules are one
group together, so one worker starts one Spark session (a JVM) for all of them.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.as_posix()
        group = "spark" if "/tests/appliance/spark/" in path else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
