"""The cluster id: one per replicated set, kept in ``<log.dirs[0]>/meta/meta.properties`` as Kafka keeps it.

Theory of operation
-------------------
Kafka writes ``meta.properties`` in each log dir with the ``cluster.id`` the broker belongs to, and a
broker whose stored id differs from its cluster's refuses to join it (INCONSISTENT_CLUSTER_ID).  The
appliance keeps one such file, in the meta directory of its first log dir::

    #written by the log appliance; do not edit
    version=0
    cluster.id=Gx1mO6kmQjWcY0Kf8dcHqg

It is every node's Metadata ``cluster_id``, so clients see one cluster however leadership moves:

* ``appliance serve`` on a node with no id yet creates it at start (:func:`ensure_cluster_id`): a new id,
  22 characters of URL-safe base64 of a random UUID as Kafka makes them, for an empty data dir; for a data
  dir that already holds topics (an appliance from before this file existed), ``appliance-<instance id>``,
  the id that appliance reported, so an upgrade does not change it;
* a replica with no id takes its leader's from the leader's Metadata and keeps it (``appliance.follower.
  leaders``), so a node started on an empty directory joins the set under the set's id, and a promoted
  replica (which ``exec``\\s ``appliance serve`` on the same dir) reports that id;
* a replica whose stored id differs from a leader's refuses to follow that leader, saying both ids.

The broker reads the file when it starts (:func:`read_cluster_id`); the supervisor wrote it before forking.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from storage.atomic_file import write_atomically
from storage.errors import CorruptRecordError

__all__ = [
    "META_PROPERTIES",
    "check_cluster_id",
    "ensure_cluster_id",
    "legacy_cluster_id",
    "meta_properties_path",
    "new_cluster_id",
    "read_cluster_id",
    "write_cluster_id",
]

META_PROPERTIES: Final = "meta.properties"
_META_DIR: Final = "meta"  # appliance.config.topic_metadata.META_DIR
_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def meta_properties_path(log_dirs: Iterable[str]) -> Path:
    return Path(next(iter(log_dirs))) / _META_DIR / META_PROPERTIES


def new_cluster_id() -> str:
    """A fresh id, as Kafka's ``Uuid.randomUuid().toString()``: URL-safe base64 of 16 bytes, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def legacy_cluster_id(instance_id: str) -> str:
    """The id an appliance reported before ``meta.properties`` existed: ``appliance-<instance id>``."""
    return f"appliance-{instance_id}"


def check_cluster_id(cluster_id: object) -> str | None:
    """Why ``cluster_id`` cannot be stored (1-64 of ``[A-Za-z0-9_-]``), or None."""
    if not isinstance(cluster_id, str) or _ID_RE.fullmatch(cluster_id) is None:
        return f"cluster id {cluster_id!r}: expected 1 to 64 of A-Z a-z 0-9 _ -"
    return None


def read_cluster_id(log_dirs: Iterable[str]) -> str | None:
    """The stored cluster id, None if there is no file yet; CorruptRecordError if the file is damaged."""
    path = meta_properties_path(log_dirs)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, sep, value = line.partition("=")
            if not sep:
                raise _damaged(path, f"line {line!r} is not KEY=VALUE")
            values[key.strip()] = value.strip()
    cluster_id = values.get("cluster.id")
    reason = check_cluster_id(cluster_id)
    if reason is not None:
        raise _damaged(path, reason)
    return cluster_id


def write_cluster_id(log_dirs: Iterable[str], cluster_id: str) -> None:
    """Store ``cluster_id`` (atomically; the meta directory is created if needed)."""
    reason = check_cluster_id(cluster_id)
    if reason is not None:
        raise ValueError(reason)
    path = meta_properties_path(log_dirs)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"#written by the log appliance; do not edit\nversion=0\ncluster.id={cluster_id}\n"
    write_atomically(path, text.encode(), mode=0o644)


def ensure_cluster_id(log_dirs: Iterable[str], instance_id: str) -> str:
    """The node's cluster id, created at its first start (module docstring) if there is none yet."""
    dirs = tuple(log_dirs)
    stored = read_cluster_id(dirs)
    if stored is not None:
        return stored
    meta = Path(dirs[0]) / _META_DIR
    existing = any(entry.name != META_PROPERTIES and not entry.name.startswith(".")
                   for entry in meta.iterdir()) if meta.is_dir() else False  # fmt: skip
    cluster_id = legacy_cluster_id(instance_id) if existing else new_cluster_id()
    write_cluster_id(dirs, cluster_id)
    return cluster_id


def _damaged(path: Path, what: str) -> CorruptRecordError:
    return CorruptRecordError(f"{path}: {what}; restore the file (its cluster.id is what every node of this "
                              "replicated set reports) or remove it to take the leader's id again")
