"""The resume check: the resumed run against the continuous one, then each
ablation (one part of the checkpoint left out) -> reports/resume.json.

A resume restores the whole trajectory or it drifts: each ablation must
differ from the continuous run, and the full resume must not, by 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib.core import checkpoint
from course_lib.core.config import Config
from course_lib.jobs.kind import JobKind, launch
from course_lib.jobs.train import (
    TrainState,
    check_resumable,
    continuous_dir,
    resume_state,
    train_job,
    train_steps,
)
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class AblationsJob(JobSpec):
    """resume-check: the full resume and each ablation vs the continuous run."""

    TAG: ClassVar[str] = "ablations"
    resume_from: str
    resumed: str
    continuous: str


# name -> (the parts a resume restores, what goes wrong without the others)
ABLATIONS: dict[str, tuple[frozenset[str], str]] = {
    "model_only": (
        frozenset({"model"}),
        "momentum buffers, sampler position and RNG states all restart",
    ),
    "no_optimizer_state": (
        checkpoint.ALL_PARTS - {"optimizer"},
        "SGD momentum restarts from zero at the resume step",
    ),
    "sampler_from_seed": (
        checkpoint.ALL_PARTS - {"sampler"},
        "the sampler is re-seeded, so it replays windows 0, 1, ... "
        "instead of drawing the windows after the resume step",
    ),
    "no_rng_state": (
        checkpoint.ALL_PARTS - {"rng"},
        "per-rank torch RNGs restart from their seeds, so dropout masks "
        "differ from the continuous run's",
    ),
}


@dataclass(frozen=True)
class Ablation:
    restored: list[str]
    max_abs_param_diff: float
    identical: bool
    matters: bool  # it differs from the continuous run, as it must
    why: str
    # windows counted from 0, as the plan does: the first window the ablation
    # draws after the resume, and the one the continuous run draws there
    first_window_after_resume: int
    window_expected_after_resume: int
    # max |param diff| vs the full resume after each update from the resume
    # step + 1 on (the full resume is the continuous run, bit for bit)
    drift: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ResumeReport(RunHeader, Report):
    NAME: ClassVar[str] = "resume"
    step: int
    resumed_from_step: int
    compared_values: int
    max_abs_param_diff: float
    identical: bool
    resumed: str
    continuous: str
    ablations: dict[str, Ablation]
    every_ablation_matters: bool
    # The ablations' yardstick, the reference trajectory (a full resume in
    # this launch), at its last update against the continuous run; None in a
    # report written before it was kept.
    reference_max_abs_param_diff: float | None = None
    extra: dict = field(default_factory=dict, repr=False)


def run_rank(ctx: RankContext, spec: AblationsJob) -> None:
    """The full resume, then each ablation, vs the continuous run."""
    cfg = ctx.cfg
    resume_from, continuous = Path(spec.resume_from), Path(spec.continuous)
    resumed = Path(spec.resumed)
    target = checkpoint.load_params(continuous)
    # the reference trajectory, update by update: a full resume (rank 0 keeps
    # its parameters after each update; the ranks' replicas are identical)
    reference: dict[int, dict[str, torch.Tensor]] = {}

    def keep(state: TrainState) -> None:
        if ctx.rank == 0:
            reference[state.update] = _params(state)

    train_steps(ctx, resume_state(ctx, resume_from), cfg.train.updates, None,
                "reference", keep)
    results = {}
    for name, (parts, why) in ABLATIONS.items():
        state = resume_state(ctx, resume_from, parts)
        start, drawn_before = state.update, state.sampler.position
        drift: list[float] = []

        def measure(state: TrainState, drift: list[float] = drift) -> None:
            if ctx.rank == 0:
                cmp = checkpoint.compare_params(_params(state), reference[state.update])
                drift.append(cmp["max_abs_param_diff"])

        train_steps(ctx, state, cfg.train.updates, None, f"ablation:{name}", measure)
        if ctx.rank == 0:
            params = {k: v.detach().cpu() for k, v in state.model.state_dict().items()}
            cmp = checkpoint.compare_params(params, target)
            results[name] = Ablation(
                restored=sorted(parts), max_abs_param_diff=cmp["max_abs_param_diff"],
                identical=cmp["identical"], matters=not cmp["identical"], why=why,
                first_window_after_resume=drawn_before,
                window_expected_after_resume=start, drift=drift)
    if ctx.rank == 0:
        full = checkpoint.compare_params(checkpoint.load_params(resumed), target)
        yardstick = checkpoint.compare_params(reference[cfg.train.updates], target)
        ResumeReport(
            **ctx.header().fields(),
            step=cfg.train.updates,
            resumed_from_step=checkpoint.step_of(resume_from),
            compared_values=full["compared_values"],
            max_abs_param_diff=full["max_abs_param_diff"],
            identical=full["identical"],
            resumed=str(resumed.relative_to(ctx.out)),
            continuous=str(continuous.relative_to(ctx.out)),
            ablations=results,
            every_ablation_matters=all(r.matters for r in results.values()),
            reference_max_abs_param_diff=yardstick["max_abs_param_diff"],
        ).save(ctx.out)


def _params(state: TrainState) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in state.model.state_dict().items()}


KIND = JobKind(AblationsJob, run_rank)


def ablation_job(out: Path, cfg: Config) -> AblationsJob:
    out = Path(out).resolve()
    return AblationsJob(
        resume_from=str(checkpoint.step_dir(out, cfg.train.stop_at)),
        resumed=str(checkpoint.step_dir(out, cfg.train.updates)),
        continuous=str(checkpoint.step_dir(continuous_dir(out), cfg.train.updates)),
    )


def resume_check(cfg: Config, out: Path, resume: bool = False, **kw: Any) -> ResumeReport:
    """Compare the resumed run with the continuous one, then the ablations.

    ``resume=True`` first resumes from the stop checkpoint in this same, new
    launch, so nothing but the checkpoint links it to the stopped run.
    """
    out = Path(out)
    job = ablation_job(out, cfg)
    todo: list[JobSpec] = [job]
    if resume:
        todo.insert(0, train_job(out, "resume", cfg.train.updates, Path(job.resume_from)))
    checked = ("resume_from", "continuous") if resume else (
        "resume_from", "resumed", "continuous")
    for key in checked:
        check_resumable(cfg, Path(getattr(job, key)), kw.get("world_size"),
                        kw.get("data_dir"))
    launch(cfg, out, todo, **kw)
    return ResumeReport.load(out)
