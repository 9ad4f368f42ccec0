"""Overhead of the correct normalization: time per DDP window, both modes.

One torchrun launch times whole windows (forward, backward, gradient sync)
under ``global_token`` (one extra scalar all_reduce per window) and under
``mean_of_means``, alternating over the same windows, then prints
median(global_token) / median(mean_of_means). Target: at most 1.05.

    python benchmarks/normalization_overhead.py [--world-size 2] [--repeats 60] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import course_lib
from course_lib.core import paths
from course_lib.jobs.bench import BenchJob, BenchReport
from course_lib.run import launch

TARGET = 1.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--quick", action="store_true",
                        help="2 windows per mode, no warm-up: the code path, not a figure")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.warmup = 2, 0
    cfg = course_lib.load_config()
    with tempfile.TemporaryDirectory() as tmp:
        job = BenchJob(windows=10, warmup=args.warmup, repeats=args.repeats)
        launch.launch(cfg, Path(tmp), [job], data_dir=paths.data_dir(),
                      world_size=args.world_size, backend=args.backend)
        r = BenchReport.load(Path(tmp))
    ratio = r.ratio_global_over_mean_of_means
    print(f"{r.world_size} ranks, {r.backend} on {r.device}, "
          f"{r.windows_timed_per_mode} windows per mode")
    for mode, seconds in r.median_seconds.items():
        print(f"  {mode:<14} median {1000 * seconds:7.2f} ms per window")
    verdict = "within" if ratio <= TARGET else "ABOVE"
    print(f"overhead ratio global_token / mean_of_means: {ratio:.3f} "
          f"({verdict} the {TARGET} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
