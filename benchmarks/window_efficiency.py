"""How close a DDP window comes to its compute floor.

    .venv/bin/python benchmarks/window_efficiency.py [--repeats 40]

In one run: each rank's share of the same windows, timed in this process
(one thread, no DDP, no other rank), then the same windows as a 2-rank DDP
job (forward, backward, gradient sync). The last line is

    efficiency <x>    x = slowest rank's own time / DDP window time

1.0 would mean the distributed window costs nothing beyond its slowest rank;
the target is 0.83 (a window at most 1.2 x its floor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from course_lib import jobs, launch, paths, progress, protocol, reports, window
from course_lib.data import make_sampler
from course_lib.model import build_model
from course_lib.normalize import accumulate_window

WINDOWS = 10  # the bench job's windows: the same ones timed here


class _Local:
    """Just enough of a worker context for ``window.microbatches``."""

    def __init__(self, cfg, corpus):
        self.cfg, self.corpus, self.device = cfg, corpus, torch.device("cpu")


def own_times(cfg, world: int, repeats: int, warmup: int) -> list[float]:
    """Median seconds of each rank's share of a window, alone in this process."""
    torch.set_num_threads(1)
    corpus = protocol.corpus(cfg)
    sampler = make_sampler(cfg, corpus, world)
    layouts = [sampler.next_window() for _ in range(WINDOWS)]
    ctx = _Local(cfg, corpus)
    model = build_model(cfg).train()
    medians = []
    for rank in range(world):
        shares = [window.microbatches(ctx, layout, rank) for layout in layouts]
        times = []
        for i in range(warmup + repeats):
            started = time.perf_counter()
            accumulate_window(model, shares[i % WINDOWS], "global_token", world)
            if i >= warmup:
                times.append(time.perf_counter() - started)
        medians.append(statistics.median(times))
    return medians


def ddp_time(cfg, world: int, repeats: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        launch.launch(cfg, tmp, [jobs.BenchJob(windows=WINDOWS, warmup=warmup,
                                               repeats=repeats)],
                      data_dir=paths.data_dir(), world_size=world, backend="gloo",
                      progress=progress.make("none"))
        return reports.load(tmp, "benchmark")["median_seconds"]["global_token"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    cfg = protocol.load_config()
    world = cfg.train.world_size
    own = own_times(cfg, world, args.repeats, args.warmup)
    ddp = ddp_time(cfg, world, args.repeats, args.warmup)
    for rank, seconds in enumerate(own):
        print(f"rank {rank}'s share alone  {1000 * seconds:7.1f} ms")
    print(f"DDP window, {world} ranks    {1000 * ddp:7.1f} ms "
          f"({ddp / max(own):.2f} x the slowest rank)")
    print(f"efficiency {max(own) / ddp:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
