"""The bench job: whole windows timed in both modes -> reports/benchmark.json.

Modes alternate window by window over the same windows, so drift and
warm-up hit both alike. With ``alone``, each round then times every rank's
share of that window alone: rank 0 runs the shares one after the other on a
plain model (no DDP, no collective), while the other ranks wait at a
barrier. The machine's speed drifts within seconds, so the floor is timed
between the windows it is the floor of. ``benchmarks/`` reads the report.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist

from course_lib.core.data import make_sampler
from course_lib.core.model import build_model
from course_lib.core.normalize import MODES, Microbatch, accumulate_window
from course_lib.jobs.kind import JobKind
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class BenchJob(JobSpec):
    TAG: ClassVar[str] = "bench"
    windows: int
    warmup: int
    repeats: int
    alone: bool = False  # also time each rank's share alone (window_efficiency.py)


@dataclass(frozen=True)
class BenchReport(RunHeader, Report):
    NAME: ClassVar[str] = "benchmark"
    windows_timed_per_mode: int
    median_seconds: dict[str, float]
    ratio_global_over_mean_of_means: float
    # Round by round, with ``alone``, so a reader can pair each window with its floor.
    alone_seconds: list[list[float]] | None = None
    global_token_seconds: list[float] | None = None
    extra: dict = field(default_factory=dict, repr=False)


def _window_seconds(ctx: RankContext, model: torch.nn.Module, micro: list[Microbatch],
                    mode: str) -> float:
    started = time.perf_counter()
    accumulate_window(model, micro, mode, ctx.world_size)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return time.perf_counter() - started


def run_rank(ctx: RankContext, spec: BenchJob) -> None:
    cfg = ctx.cfg
    model = build_model(cfg).to(ctx.device).train()
    ddp = harness.wrap(ctx, model)
    sampler = make_sampler(cfg, ctx.corpus, ctx.world_size)
    layouts = [sampler.next_window() for _ in range(spec.windows)]
    windows = [harness.microbatches(ctx, layout, ctx.rank) for layout in layouts]
    # Every rank's share of every window, for rank 0 to time alone.
    shares = [[harness.microbatches(ctx, layout, r) for r in range(ctx.world_size)]
              for layout in layouts] if spec.alone and ctx.rank == 0 else []
    # Not `model`: DDP's hooks sit on its parameters.
    plain = build_model(cfg).to(ctx.device).train() if shares else None
    times: dict[str, list[float]] = {m: [] for m in MODES}
    alone: list[list[float]] = [[] for _ in range(ctx.world_size)]
    for i in range(spec.warmup + spec.repeats):
        timed = i >= spec.warmup
        for mode in (MODES if i % 2 else MODES[::-1]):
            dist.barrier()
            seconds = _window_seconds(ctx, ddp, windows[i % len(windows)], mode)
            if timed:
                times[mode].append(seconds)
        if spec.alone:
            dist.barrier()
            # The local mean keeps the window's arithmetic without its count
            # all_reduce, which the waiting ranks would never join.
            for rank, micro in enumerate(shares[i % len(shares)] if shares else []):
                assert plain is not None
                seconds = _window_seconds(ctx, plain, micro, "mean_of_means")
                if timed:
                    alone[rank].append(seconds)
            dist.barrier()
        ctx.progress("bench", i + 1, spec.warmup + spec.repeats)
    if ctx.rank == 0:
        med = {m: statistics.median(t) for m, t in times.items()}
        BenchReport(
            **ctx.header().fields(),
            windows_timed_per_mode=spec.repeats, median_seconds=med,
            ratio_global_over_mean_of_means=med["global_token"] / med["mean_of_means"],
            alone_seconds=alone if spec.alone else None,
            global_token_seconds=times["global_token"] if spec.alone else None,
        ).save(ctx.out)


KIND = JobKind(BenchJob, run_rank)
