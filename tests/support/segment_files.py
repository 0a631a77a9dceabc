"""Comparing two copies of a partition's segment files, as a follower that adopted its leader's cleaned
segments must match it (docs/replication.md, "Compacted topics")."""

from __future__ import annotations

import time
from pathlib import Path


def segment_files(directory: Path) -> dict[str, bytes] | None:
    """Every ``.log`` file's bytes by name, oldest first; None if one went while reading (a swap)."""
    try:
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.endswith(".log")}
    except FileNotFoundError:
        return None


def differences(leader: Path, follower: Path) -> list[str]:
    """How the follower's segment files differ from the leader's: the same names, every closed segment the
    same bytes, the active one (the last) a prefix of the leader's (the follower may be a batch behind)."""
    theirs, ours = segment_files(leader), segment_files(follower)
    if theirs is None or ours is None:
        return ["a segment file went while reading (a swap)"]
    if list(theirs) != list(ours):
        return [f"segments {list(ours)} != the leader's {list(theirs)}"]
    names = list(theirs)
    out = [f"{name}: {len(ours[name])} bytes != the leader's {len(theirs[name])}" for name in names[:-1]
           if ours[name] != theirs[name]]
    if names and not theirs[names[-1]].startswith(ours[names[-1]]):
        out.append(f"active {names[-1]}: not a prefix of the leader's")
    return out


def wait_byte_identical(leader: Path, follower: Path, timeout_s: float = 60.0) -> float:
    """Until the follower's segment files are the leader's (:func:`differences` finds none); the seconds
    it took."""
    started = time.monotonic()
    while found := differences(leader, follower):
        assert time.monotonic() - started < timeout_s, found
        time.sleep(0.1)
    return time.monotonic() - started


def wait_log_end(directory: Path, end: int, timeout_s: float = 60.0) -> None:
    """Until the partition log in ``directory`` (a follower's copy) reaches log end offset ``end``."""
    from storage.log_reader import LogReader

    deadline = time.monotonic() + timeout_s
    while True:
        if directory.exists():
            with LogReader(str(directory)) as reader:
                if reader.log_end_offset >= end:
                    return
        assert time.monotonic() < deadline, f"the follower did not reach offset {end} in {timeout_s} s"
        time.sleep(0.05)
