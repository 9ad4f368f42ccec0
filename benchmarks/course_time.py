"""Seconds per chapter for the whole course, as `make course` runs it.

Runs every chapter with papermill from a clean run directory (so chapters
that could reuse an earlier run's reports do the full work), then prints
each chapter's seconds, the total, the three slowest, and the total as a
ratio of the 120 s target (goal: 60 s) on a 2-core CPU machine.

    python benchmarks/course_time.py [--keep-runs]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from course_lib import batch, paths

TARGET, GOAL = 120.0, 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-runs", action="store_true",
                        help="reuse runs/course instead of starting clean")
    args = parser.parse_args()
    if not args.keep_runs:
        shutil.rmtree(paths.default_out(batch.RUN_NAME), ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        timings = batch.run_chapters(batch.chapters(), Path(tmp))
    total = sum(s for _, s in timings)
    print()
    for name, seconds in timings:
        print(f"{name:<32} {seconds:6.1f} s")
    print(f"{'total':<32} {total:6.1f} s")
    slowest = sorted(timings, key=lambda t: -t[1])[:3]
    print("slowest:", ", ".join(f"{n} ({s:.1f} s)" for n, s in slowest))
    print(f"total / target: {total / TARGET:.2f} (target {TARGET:.0f} s), "
          f"total / goal: {total / GOAL:.2f} (goal {GOAL:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
