"""Fixtures of the benchmark commands' tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short temporary directory, in place of pytest's: ``appliance bench`` starts its appliance under
    ``TMPDIR``, and the control socket's path must fit a Unix socket's 107 bytes, which pytest's own
    directories (deeper under pytest-xdist) can pass."""
    path = Path(tempfile.mkdtemp(prefix="lb-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
