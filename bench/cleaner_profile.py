"""Where one cleaning pass spends its time: ``.venv/bin/python -m bench.cleaner_profile``.

The log of ``bench/test_bench_cleaner.py`` (its ``CLEANER_BENCH_MIB`` and ``CLEANER_BENCH_KEYS``), one pass to
load numba's kernels, then ``--passes`` passes of ``clean_log``, each over a fresh synced copy, under
cProfile; prints each pass's wall and CPU time, the functions by their own time per pass, and the time of
the producers' last batches (``storage.clean_map_pass.producer_last_offsets``) alone over the same
segments when no walk of the map pass is kept (every segment's headers walked, as for the segments a pass
does not rewrite).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from bench.test_bench_cleaner import CONFIG, dirty_log
from storage import clean_map_pass, cleaner
from storage.log import Log


def _pass(source: Path, copy: Path, profile: cProfile.Profile | None) -> None:
    shutil.copytree(source, copy)
    os.sync()
    log = Log.open(str(copy), CONFIG)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        if profile is not None:
            profile.enable()
        cleaner.clean_log(log, upper_bound=log.log_end_offset, now_ms=2_000)
        if profile is not None:
            profile.disable()
        print(f"pass: wall {1e3 * (time.perf_counter() - wall):.1f} ms, "
              f"CPU {1e3 * (time.process_time() - cpu):.1f} ms")
    finally:
        log.close()
        shutil.rmtree(copy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cleaner-profile-", dir=os.environ.get("LOG_BENCH_DIR")))
    try:
        source = root / "orig-0"
        dirty_log(source)
        _pass(source, root / "warm-0", None)
        profile = cProfile.Profile()
        for n in range(args.passes):
            _pass(source, root / f"copy{n}-0", profile)
        print(f"cProfile over {args.passes} passes (divide by {args.passes} for one pass):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        with Log.open(str(source), CONFIG) as log:
            for _ in range(3):
                start = time.thread_time()
                clean_map_pass.producer_last_offsets(log.segments, [], clean_map_pass.Walks())
                print(f"producer_last_offsets alone: {1e3 * (time.thread_time() - start):.1f} ms CPU")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
