"""The smoke job: one all_reduce across the ranks -> reports/environment.json.

``course-lib check-env --launch`` runs it: the cheapest proof that the
backend, the device and the rendezvous work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist

from course_lib.jobs.kind import JobKind
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class SmokeJob(JobSpec):
    """One all_reduce, to check the environment."""

    TAG: ClassVar[str] = "smoke"


@dataclass(frozen=True)
class EnvironmentReport(RunHeader, Report):
    NAME: ClassVar[str] = "environment"
    all_reduce: int  # sum of rank + 1 over the ranks: W (W + 1) / 2
    extra: dict = field(default_factory=dict, repr=False)


def run_rank(ctx: RankContext, spec: SmokeJob) -> None:
    t = torch.tensor([ctx.rank + 1], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    expected = ctx.world_size * (ctx.world_size + 1) // 2
    if int(t) != expected:
        raise RuntimeError(f"all_reduce gave {int(t)}, expected {expected}")
    ctx.log("smoke", device=str(ctx.device), all_reduce=int(t))
    if ctx.rank == 0:
        EnvironmentReport(**ctx.header().fields(), all_reduce=int(t)).save(ctx.out)
    ctx.progress("smoke", 1, 1)


KIND = JobKind(SmokeJob, run_rank)
