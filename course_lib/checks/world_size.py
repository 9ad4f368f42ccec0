"""world_size_invariance: one fixed set of sequences over W = 1, 2 and 4.

Each W is a torchrun launch that saves every audited step's gradients, and
the parent compares them with W = 1's. The audit plans these launches
beside its own (the audit's own W rides in its first launch).
"""


from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Apart, Artifact, Check, CheckResult
from course_lib.core import objectives
from course_lib.core.config import Config
from course_lib.core.data import Corpus, load_corpus
from course_lib.core.verdicts import worst
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.run.runfile import JobSpec
from course_lib.steps import load

NAME = "world_size_invariance"
WORLD_SIZES = (1, 2, 4)
SEQUENCES = 32  # divisible by every W above, and by 8


@dataclass(frozen=True)
class WorldSizeJob(JobSpec):
    """Each step's gradient on one fixed set of sequences, spread over this
    launch's ranks; the parent compares the world sizes."""

    TAG: ClassVar[str] = "world_size"
    steps: list[str]
    sequence_ids: list[int]
    batch_size: int
    step_timeout: float = 60.0
    objective: str = objectives.DEFAULT


def grad_path(out: Path, world_size: int, step: str) -> Path:
    return Path(out) / "audit" / "world-size" / f"W{world_size}" / f"{step}.pt"


@dataclass(frozen=True)
class WorldSizeGrads(Artifact):
    """``grad_path``: one step's gradients at one world size."""

    grads: list[torch.Tensor]  # per rank, after the sync
    local_tokens: list[int]  # per rank


def run_rank(ctx: RankContext, spec: WorldSizeJob,
             progress: str | None = "world size") -> None:
    ctx.state.step_timeout = spec.step_timeout
    layout = harness.world_size_layout(spec.sequence_ids, ctx.world_size, spec.batch_size)
    ctx = ctx.auditing(spec.objective)
    for i, name in enumerate(spec.steps):
        step = load(name)
        ctx.state.audited, ctx.state.check = step.name, NAME
        out = Auditor(ctx, step).outcome(layout)
        if ctx.rank == 0:
            WorldSizeGrads(out.grads, out.local_tokens).save(
                grad_path(ctx.out, ctx.world_size, step.name))
        if progress is not None:
            ctx.progress(f"{progress} {ctx.world_size}", i + 1, len(spec.steps))
    ctx.state.audited = ctx.state.check = None


def sequences(cfg: Config, corpus: Corpus) -> list[int]:
    """A fixed set of training sequences, sorted by length: the plan of the
    world-size check never depends on W, and contiguous slices stay skewed."""
    ids = random.Random(cfg.seed + 20).sample(corpus.splits["train"], SEQUENCES)
    return sorted(ids, key=lambda i: (len(corpus.sequences[i]), i))


def plan(cfg: Config, specs: list[str], data_dir: Path, step_timeout: float,
         objective: str = objectives.DEFAULT) -> dict[int, JobSpec]:
    """{world size: the job to run at it}."""
    ids = sequences(cfg, load_corpus(cfg, data_dir))
    job = WorldSizeJob(specs, ids, cfg.train.batch_size_per_rank, step_timeout, objective)
    return dict.fromkeys(WORLD_SIZES, job)


def collect(out: Path, step: str, atol: float, rtol: float) -> CheckResult:
    """Every W's gradients against W = 1's."""
    found = {w: WorldSizeGrads.load(grad_path(out, w, step)) for w in WORLD_SIZES}
    base = found[1].grads[0]
    errors: dict[str, float | None] = {}
    passed = True
    for w, saved in found.items():
        c = harness.compare_ranks(saved.grads, base, atol, rtol)
        errors[f"W={w}"] = c.max_abs_err
        passed = passed and c.allclose
    return CheckResult(
        passed=passed, max_abs_err=worst(errors.values()), atol=atol, rtol=rtol, errors=errors,
        note=f"{SEQUENCES} sequences over W = 1, 2, 4; compared with W = 1")


CHECK = Check(NAME, f"one fixed set of {SEQUENCES} sequences over W = 1, 2 and 4 ranks "
              "(a torchrun launch each)",
              apart=Apart(WorldSizeJob, run_rank, collect, plan=plan))
