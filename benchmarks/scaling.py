"""Window time, parity error and normalization overhead for W = 1..8 on CPU.

    .venv/bin/python benchmarks/scaling.py [--max-world-size 8] [--repeats 10] [--quick]

One torchrun launch per world size runs the parity job and then times whole
windows (forward, backward, DDP sync) in both modes. Absolute times depend on
the machine and on how many cores the W ranks share; the ratios do not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import course_lib
from course_lib.core import paths
from course_lib.jobs.bench import BenchJob, BenchReport
from course_lib.jobs.parity import ParityJob, ParityReport
from course_lib.run import launch, progress


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-world-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="W = 1, 2; one window each, no warm-up: the code path")
    args = parser.parse_args()
    if args.quick:
        args.max_world_size, args.repeats, args.warmup = 2, 1, 0
    cfg = course_lib.load_config()
    print(f"{'W':>2} {'window ms':>10} {'window / W':>12} {'parity |err|':>13} "
          f"{'mean_of_means |err|':>20} {'overhead':>9}")
    for world in range(1, args.max_world_size + 1):
        with tempfile.TemporaryDirectory() as tmp:
            todo = [ParityJob(),
                    BenchJob(windows=4, warmup=args.warmup, repeats=args.repeats)]
            launch.launch(cfg, Path(tmp), todo, data_dir=paths.data_dir(), world_size=world,
                          backend="gloo", progress=progress.make("none"))
            p = ParityReport.load(Path(tmp))
            b = BenchReport.load(Path(tmp))
        window = b.median_seconds["global_token"]
        control = p.control_mode.max_abs_err if world > 1 else float("nan")
        print(f"{world:>2} {1000 * window:>10.1f} {1000 * window / world:>12.1f} "
              f"{p.correct.max_abs_err:>13.2e} {control:>20.2e} "
              f"{b.ratio_global_over_mean_of_means:>9.3f}")
    print("window ms: median of the DDP window (all ranks share this machine's cores);"
          " overhead: global_token / mean_of_means")
    return 0


if __name__ == "__main__":
    sys.exit(main())
