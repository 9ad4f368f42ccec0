"""How close a DDP window comes to its compute floor.

    .venv/bin/python benchmarks/window_efficiency.py [--repeats 40] [--quick]

One 2-rank launch times, round after round over the same 10 windows:

- the DDP window (forward, backward, gradient sync), as every rank runs it;
- then each rank's share of that same window alone: rank 0's process runs
  the shares one after the other on a plain model (one thread, no DDP, no
  collective) while the other rank waits at a barrier.

The last line is

    efficiency <x>    x = slowest rank's own time / DDP window time

taken round by round (the slowest share of a window against that window),
then the median over the rounds.

1.0 would mean the distributed window costs nothing beyond its slowest rank;
the target is 0.83 (a window at most 1.2 x its floor). The floor is timed
between the windows it bounds because this machine's speed drifts: the same
share took 36 ms or 55 ms in one process a few seconds apart, so a floor
timed before the launch compared two different machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import course_lib
from course_lib.core import paths
from course_lib.jobs.bench import BenchJob, BenchReport
from course_lib.run import launch, progress

WINDOWS = 10  # the bench job's windows, cycled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds, 1 warm-up: the code path, not a figure to trust")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.warmup = 2, 1
    cfg = course_lib.load_config()
    world = cfg.train.world_size
    with tempfile.TemporaryDirectory() as tmp:
        launch.launch(cfg, Path(tmp), [BenchJob(windows=WINDOWS, warmup=args.warmup,
                                               repeats=args.repeats, alone=True)],
                      data_dir=paths.data_dir(), world_size=world, backend="gloo",
                      progress=progress.make("none"))
        bench = BenchReport.load(Path(tmp))
    alone, ddp = bench.alone_seconds, bench.global_token_seconds
    assert alone is not None and ddp is not None  # the job ran with alone=True
    for rank, seconds in enumerate(alone):
        print(f"rank {rank}'s share alone  {1000 * statistics.median(seconds):7.1f} ms, median")
    print(f"DDP window, {world} ranks    {1000 * statistics.median(ddp):7.1f} ms, median")
    # Each round's floor against its own window: a drift that lasts seconds
    # moves both sides of a ratio.
    ratios = [max(shares) / window for *shares, window in zip(*alone, ddp, strict=True)]
    print(f"per round, floor / window: quartiles {_quartiles(ratios)}")
    print(f"efficiency {statistics.median(ratios):.3f}")
    return 0


def _quartiles(values: list[float]) -> str:
    return ", ".join(f"{q:.2f}" for q in statistics.quantiles(values, n=4))


if __name__ == "__main__":
    sys.exit(main())
