"""The exercise: the 12/36 tokens counter-example, run -> reports/exercise.json.

Rank r holds one sequence of ``tokens[r]`` supervised tokens. With balanced
counts the mean of means and the token mean agree; with 12 and 36 they do
not (2 versus 2.5), and neither do the gradients.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib.core import arithmetic
from course_lib.core.config import Config, from_dict
from course_lib.core.data import Corpus
from course_lib.core.edition import tr
from course_lib.core.model import build_model, loss_sum
from course_lib.core.normalize import MODES
from course_lib.core.reference import Comparison
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec
from course_lib.steps import BUILTIN


@dataclass(frozen=True)
class ExerciseJob(JobSpec):
    TAG: ClassVar[str] = "exercise"
    config: dict


@dataclass(frozen=True)
class ModelLosses:
    """The same counts on the real (untrained) model."""

    local_loss_sums: list[float]
    mean_of_means: float
    global_mean: float


@dataclass(frozen=True)
class ModeGradients:
    compared_values: int
    global_token: Comparison
    mean_of_means: Comparison
    # per mode, ||g - g*|| / ||g*|| (the worst rank's): the error as a share
    # of the gradient, comparable with a loss gap over the loss
    relative_err: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens: list[int]
    per_token_loss: list[float]
    loss_sums: list[float]
    mean_of_means: float
    global_mean: float
    model: ModelLosses
    gradients: ModeGradients

    @property
    def label(self) -> str:
        """The scenario's name in the learner's language (``balanced``)."""
        return tr(self.name)


@dataclass(frozen=True)
class ExerciseReport(RunHeader, Report):
    NAME: ClassVar[str] = "exercise"
    scenarios: list[Scenario]
    atol: float
    rtol: float
    extra: dict = field(default_factory=dict, repr=False)

    def scenario(self, name: str) -> Scenario:
        return next(sc for sc in self.scenarios if sc.name == name)


def _sequences(cfg: Config, corpus: Corpus, tokens: list[int]) -> list[list[int]]:
    """Rank r's sequence: a prefix of one fixed draw, so rank 0 keeps its 12
    tokens and rank 1's 36-token sequence extends its 12-token one."""
    longest = max(tokens) + 1
    seqs = []
    for r, n in enumerate(tokens):
        rng = random.Random(cfg.seed + 100 + r)
        seqs.append(corpus.source.sample(rng, longest)[: n + 1])
    return seqs


def _relative(grads: list[torch.Tensor], ref: torch.Tensor) -> float:
    """The worst rank's ||g - g*|| / ||g*||."""
    return max(float((g.double() - ref.double()).norm() / ref.double().norm())
               for g in grads)


def run_rank(ctx: RankContext, spec: ExerciseJob) -> None:
    cfg = from_dict(spec.config)
    ex = cfg.exercise
    assert ex is not None  # exercise_job refuses a config without one
    atol, rtol = harness.tolerance(cfg)
    ex_ctx = dataclasses.replace(ctx, cfg=cfg)
    layout = [[[r]] for r in range(ctx.world_size)]  # rank r: sequence r
    results = []
    for i, sc in enumerate(ex.scenarios):
        seqs = _sequences(cfg, ctx.corpus, list(sc.tokens))
        scratch = Corpus(tuple(tuple(s) for s in seqs), {}, ctx.corpus.source, "")
        micro = harness.microbatches(ex_ctx, layout, ctx.rank, scratch)
        grads = {}
        for mode in MODES:
            step = BUILTIN[mode]
            ddp = harness.fresh_ddp(ex_ctx, step)
            grads[mode] = harness.run_step(ex_ctx, step, ddp, micro).grads
        with torch.no_grad():
            (inputs, labels), = micro
            model = build_model(cfg).to(ctx.device).eval()
            loss_sums = harness.gather_floats(float(loss_sum(model(inputs), labels)),
                                              ctx.device)
        if ctx.rank == 0:
            ref = harness.window_reference(ex_ctx, layout, corpus=scratch)
            sums = [n_r * loss for n_r, loss in
                    zip(sc.tokens, ex.per_token_loss, strict=True)]
            results.append(Scenario(
                name=sc.name, tokens=list(sc.tokens),
                per_token_loss=list(ex.per_token_loss), loss_sums=sums,
                mean_of_means=arithmetic.mean_of_means(sums, sc.tokens),
                global_mean=arithmetic.global_mean(sums, sc.tokens),
                model=ModelLosses(
                    local_loss_sums=loss_sums,
                    mean_of_means=arithmetic.mean_of_means(loss_sums, sc.tokens),
                    global_mean=ref.loss_per_token),
                gradients=ModeGradients(
                    compared_values=int(ref.grad.numel()),
                    **{m: harness.compare_ranks(grads[m], ref.grad, atol, rtol)
                       for m in MODES},
                    relative_err={m: _relative(grads[m], ref.grad) for m in MODES}),
            ))
        ctx.progress("exercise", i + 1, len(ex.scenarios))
    if ctx.rank == 0:
        ExerciseReport(**ex_ctx.header().fields(), scenarios=results,
                       atol=atol, rtol=rtol).save(ctx.out)


KIND = JobKind(ExerciseJob, run_rank)


def exercise_job(exercise_cfg: Config) -> ExerciseJob:
    if exercise_cfg.exercise is None or not exercise_cfg.exercise.scenarios:
        raise ValueError("exercise: this config has no exercise.scenarios")
    return ExerciseJob(config=exercise_cfg.to_dict())


def exercise(exercise_cfg: Config, out: Path, **kw: Any) -> ExerciseReport:
    launch(exercise_cfg, out, [exercise_job(exercise_cfg)], **kw)
    return ExerciseReport.load(out)
