"""Shared fixtures, and how `make test` shares the test modules out between its two workers.

`make test` runs the suite in two pytest-xdist workers with ``--dist loadfile``: each test module runs whole
in one worker, so a module's fixtures (most start one `appliance serve` for the whole module) start once.
Two changes to how xdist hands the modules out:

- the Spark modules are one unit (:class:`SuiteScheduling`): they run one after the other in one worker, so
  the JVM, its Python workers and the appliance the Spark tests share (tests/appliance/spark/conftest.py,
  session-scoped) start once per run, not once in each worker;
- units are handed out in the order collected here, the longest first (:data:`LONG_UNITS`); `make test`
  passes ``--no-loadscope-reorder``, as xdist otherwise orders them by their number of tests, which hands
  the long units of one to four tests out last, where one runs alone after the other worker has finished.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

SPARK = "tests/appliance/spark/"

# The longest units of a whole `make test` run (`--durations`), longest first; the others keep their order.
LONG_UNITS = (
    SPARK,
    "tests/appliance/server/test_supervisor_crash.py",
    "tests/appliance/server/test_damaged_logs.py",
    "tests/appliance/cli/test_consume_cli.py",
    "tests/appliance/server/test_supervisor.py",
    "tests/appliance/broker/test_fetch_during_swap.py",
    "tests/appliance/client/test_codecs.py",
    "tests/appliance/client/test_producer_crash.py",
    "tests/bench/test_perf_cli.py",
    "tests/appliance/server/test_writer_demand.py",
    "tests/appliance/server/test_control_faults.py",
    "tests/appliance/cli/test_topics_cli.py",
    "tests/appliance/cli/test_produce_cli.py",
    "tests/appliance/broker/test_group_offsets_durable.py",
    "tests/appliance/follower/test_replica_process.py",
    "tests/appliance/server/test_writer_idle.py",
)


def unit(nodeid: str) -> str:
    """The work unit of a test: its module, or the Spark directory for every Spark module."""
    module = nodeid.split("::", 1)[0]
    return SPARK if module.startswith(SPARK) else module


class SuiteScheduling(LoadFileScheduling):
    """``--dist loadfile`` with the Spark modules as one unit."""

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    return SuiteScheduling(config, log) if config.getoption("dist") == "loadfile" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONG_UNITS)}
    items.sort(key=lambda item: rank.get(unit(item.nodeid), len(rank)))
