"""The checks before a cleaned segment is swapped in (``appliance.server.writer_admin.check_replaced``, used
by the writer and by the supervisor's own swap): a log that changed since the cleaner read it refuses."""

from __future__ import annotations

from pathlib import Path

from appliance.server.writer_admin import check_replaced
from storage.clean_swap import cleaned_paths

SIZES = {0: 100, 10: 200, 20: 300, 30: 0}


def _check(tmp_path: Path, bases: list[int], replaced: list[int], sizes: list[int],
           base: int = 0) -> str | None:
    return check_replaced(str(tmp_path), bases, "t-0", base, replaced, sizes, SIZES.__getitem__)


def test_a_swap_of_unchanged_closed_segments_goes(tmp_path: Path) -> None:
    Path(cleaned_paths(str(tmp_path), 0)[0]).write_bytes(b"")
    assert _check(tmp_path, [0, 10, 20, 30], [0, 10], [100, 200]) is None


def test_a_changed_log_refuses_the_swap(tmp_path: Path) -> None:
    Path(cleaned_paths(str(tmp_path), 0)[0]).write_bytes(b"")
    assert "no segment at offset 0" in str(_check(tmp_path, [10, 20, 30], [0, 10], [100, 200]))  # retention
    assert "no longer consecutive" in str(_check(tmp_path, [0, 20, 30], [0, 10], [100, 200]))
    assert "no longer consecutive" in str(_check(tmp_path, [0, 10], [0, 10], [100, 200]))  # 10 is active now
    assert "changed since" in str(_check(tmp_path, [0, 10, 20, 30], [0, 10], [100, 150]))
    assert "no segment at offset 5" in str(_check(tmp_path, [0, 10, 20, 30], [0, 10], [100, 200], base=5))


def test_a_cleaned_file_gone_refuses_the_swap(tmp_path: Path) -> None:
    assert "is gone" in str(_check(tmp_path, [0, 10, 20, 30], [0, 10], [100, 200]))
