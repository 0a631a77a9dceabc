"""``appliance repair PATH... [--dry-run]``: cut a damaged partition log at its first invalid batch.

When to use it: the appliance took a partition offline at start-up because its log holds an invalid batch
with valid batches after it (the supervisor's log and ``appliance topics describe`` say so and name the
directory).  Start-up repairs a torn tail by itself; it does not cut this, because the records after the
damage were acknowledged and cutting loses them.  Kafka truncates there on its own; here a person decides:
restore the partition from a replica if one has the data, or run this to give up what follows the damage.

For each partition directory: take its writer lock (refused while a writer holds it: an appliance serving
the partition), read every segment and batch (``storage.log_repair.survey``), print what is damaged and
what a repair removes (valid batches, their offsets, bytes), and, without ``--dry-run``, do it
(``storage.log_repair.apply_repair``: what is removed is kept in ``repaired-<time>/`` in the directory).
Then restart the appliance: the partition is opened and served again.

Exit status: 0 nothing to repair, or repaired; 3 damage found by a dry run (nothing changed); 1 refused or
failed (the lock is held, the directory is not a partition log); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys

from storage.errors import ApplianceError, LogLockedError
from storage.log_dir import list_segment_base_offsets, lock_log_directory, read_offline_note
from storage.log_repair import apply_repair, survey

__all__ = ["EXIT_DAMAGED", "EXIT_FAILED", "EXIT_OK", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DAMAGED = 3

_HELP = """\
Repair a partition log the appliance took offline: cut it at its first invalid batch.

Use it when start-up reports a partition offline ("run `appliance repair DIR`"): its log holds an invalid
batch with valid batches after it.  Start-up does not cut there by itself, because the records after the
damage were acknowledged and would be lost; restore the partition from a replica instead if one has them.
Run --dry-run first: it shows what is damaged and what a repair removes, and changes nothing.  The removed
bytes are kept in repaired-<time>/ inside the directory.  Restart the appliance afterwards."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance repair", description=_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a partition directory, <log dir>/<topic>-<partition>")
    parser.add_argument("--dry-run", action="store_true",
                        help="show what is damaged and what a repair would remove; change nothing")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    worst = EXIT_OK
    for path in args.paths:
        worst = max(worst, _repair_one(os.path.normpath(path), dry_run=args.dry_run))
    return worst


def _repair_one(directory: str, *, dry_run: bool) -> int:
    if not os.path.isdir(directory) or not list_segment_base_offsets(directory):
        print(f"appliance repair: {directory}: not a partition log directory (no segment files)",
              file=sys.stderr)
        return EXIT_FAILED
    try:
        lock_fd = lock_log_directory(directory, os.path.basename(directory))
    except LogLockedError as exc:
        print(f"appliance repair: refused: {exc}. Stop the appliance (or wait for that writer to exit) "
              "and run it again.", file=sys.stderr)
        return EXIT_FAILED
    try:
        note = read_offline_note(directory)
        if note is not None:
            print(f"offline: {note}")
        plan = survey(directory)
        for line in plan.describe():
            print(line)
        if plan.damage is None and note is None:
            return EXIT_OK
        if dry_run:
            print("dry run: nothing changed; run without --dry-run to repair")
            return EXIT_DAMAGED if plan.damage is not None else EXIT_OK
        aside = apply_repair(plan)
        if aside is not None:
            print(f"repaired: the removed bytes are kept in {aside} (delete it when done with it)")
        print(f"{directory}: restart the appliance to serve this partition again")
        return EXIT_OK
    except (ApplianceError, OSError) as exc:
        print(f"appliance repair: {directory}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        os.close(lock_fd)
