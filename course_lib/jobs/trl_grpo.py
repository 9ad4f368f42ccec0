"""TRL's real GRPOTrainer under torchrun -> reports/trl-grpo-trainer.json.

One launch runs every case (``frameworks.trl_grpo_trainer.cases()``: each
``loss_type`` the installed GRPOTrainer branches on, then the RLOOTrainer)
in turn. Every rank builds the same tiny model and the trainer, which
generates its own completions (of different lengths on each rank), scores
them with a fixed reward and makes one optimizer step under DDP; the rank
records what the trainer fed its loss and keeps the gradient DDP left at
the optimizer step. Rank 0 then rebuilds, from the initial weights and
every rank's record, the gradient of the global token mean and of each
other objective, and judges every rank's gradient against them
(``trl_grpo_trainer.row``). ``benchmarks/trl_grpo_trainer.py`` commits the
result, ``data/trl-grpo-trainer.json`` (``TrainerData``).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch.distributed as dist

from course_lib import frameworks
from course_lib.core.edition import marks, tr
from course_lib.core.verdicts import Verdict, said
from course_lib.frameworks import trl_grpo_trainer as grpo
from course_lib.frameworks.evidence import TrainerRow
from course_lib.jobs.frameworks import MISSING, FailedOnSomeRanks, stack, why
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank.context import RankContext
from course_lib.reports.store import Committed, Report, RunHeader
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class TRLTrainerJob(JobSpec):
    TAG: ClassVar[str] = "trl_grpo_trainer"
    cases: list[grpo.Case]
    shape: grpo.Shape = field(default_factory=grpo.Shape)

    def preload(self) -> tuple[str, ...]:
        return grpo.MODULES + frameworks.modules(["hf"], [self.shape.model])


@dataclass(frozen=True)
class TRLTrainerReport(RunHeader, Report):
    NAME: ClassVar[str] = "trl-grpo-trainer"
    shape: grpo.Shape
    hooked: list[str]  # where the record was taken, in the installed code
    rows: list[TrainerRow]
    extra: dict = field(default_factory=dict, repr=False)

    def row(self, trainer: str, loss_type: str = "") -> TrainerRow:
        return next(r for r in self.rows
                    if r.trainer == trainer and r.loss_type == loss_type)


@dataclass(frozen=True)
class TrainerData(Committed):
    """The committed measurement, ``data/trl-grpo-trainer.json``: written by
    ``benchmarks/trl_grpo_trainer.py``; ``others`` are the RL stacks tried
    beside TRL (verl, OpenRLHF), each not run with its reason."""

    NAME: ClassVar[str] = "trl-grpo-trainer"
    date: str
    python: str
    command: str  # what made it
    stack: dict[str, str]
    run: TRLTrainerReport
    others: list[TrainerRow] = field(default_factory=list)
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def rows(self) -> list[TrainerRow]:
        return [*self.run.rows, *self.others]


def not_run(case: grpo.Case, shape: grpo.Shape, reason: str,
            verdict: Verdict = Verdict.NOT_RUN) -> TrainerRow:
    key, where = grpo.claim(case)
    return TrainerRow(framework=grpo.FRAMEWORK[case.trainer],
                      version=frameworks.installed("trl"), model=shape.model,
                      flags=grpo.flags(case, shape), verdict=verdict, reason=reason,
                      stack=stack(), trainer=case.trainer, loss_type=case.loss_type,
                      claim=key, claim_source=where)


def _agreed(ctx: RankContext, case: grpo.Case, failure: str) -> bool:
    """Whether every rank got past this phase; a rank alone failing fails the job."""
    failures: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(failures, failure)
    if any(failures) and not all(failures):
        raise FailedOnSomeRanks(case.name, failures)
    return not any(failures)


def _one(ctx: RankContext, case: grpo.Case, spec: TRLTrainerJob) -> TrainerRow | None:
    """One case on every rank; its row on rank 0."""
    workdir = Path(tempfile.mkdtemp(prefix=f"course-grpo-{ctx.rank}-"))
    started = time.perf_counter()
    try:
        try:  # built: a configuration TRL refuses is refused on every rank
            train, initial = grpo.prepare(case, spec.shape, workdir, ctx.backend)
            failure = ""
        except Exception as exc:  # noqa: BLE001 - the row says why, when every rank agrees
            failure = why(exc)
        if not _agreed(ctx, case, failure):
            return not_run(case, spec.shape, failure) if ctx.rank == 0 else None
        try:  # trained: one that raises on every rank is "failed"
            trained = train()
            failure = ""
        except Exception as exc:  # noqa: BLE001
            failure = why(exc)
        if not _agreed(ctx, case, failure):
            return (not_run(case, spec.shape, failure, Verdict.NOT_RUN
                            if failure.startswith(MISSING) else Verdict.FAILED)
                    if ctx.rank == 0 else None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - started  # built and trained, on this rank
    fed: list[Any] = [None] * ctx.world_size
    grads: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(fed, trained.fed)
    dist.all_gather_object(grads, trained.grad)
    if ctx.rank != 0:
        return None
    found = grpo.row(case, spec.shape, frameworks.installed("trl"), initial, fed, grads)
    return dataclasses.replace(found, stack=stack(), seconds={"trained": round(seconds, 2)})


def run_rank(ctx: RankContext, spec: TRLTrainerJob) -> None:
    rows = []
    for i, case in enumerate(spec.cases):
        ctx.state.audited = case.name
        ctx.log("trl_trainer", case=case.name)
        with frameworks.isolated():
            row = _one(ctx, case, spec)
        if row is not None:
            rows.append(row)
        ctx.progress("trl_grpo_trainer", i + 1, len(spec.cases))
    ctx.state.audited = None
    if ctx.rank == 0:
        TRLTrainerReport(**ctx.header().fields(), shape=spec.shape,
                         hooked=grpo.hooked(), rows=rows).save(ctx.out)


KIND = JobKind(TRLTrainerJob, run_rank)


# --- the parent side -----------------------------------------------------------------


def trl_grpo_trainer(cfg: Any, out: Path, cases: list[grpo.Case] | None = None,
                     shape: grpo.Shape | None = None, **kw: Any) -> TRLTrainerReport:
    """One launch: every case (all of the installed TRL's by default) -> the
    report. Without TRL, nothing is launched and the error says so."""
    if frameworks.installed("trl") is None:
        raise frameworks.UnknownFramework("trl is not installed: pip install trl")
    todo = grpo.cases() if cases is None else cases
    launch(cfg, out, [TRLTrainerJob(todo, shape or grpo.Shape())], **kw)
    return TRLTrainerReport.load(out)


# What ``describe(..., brief=True)`` prints under the table.
LEGEND = """\
  vs token mean    the gradient after DDP against the token mean of every rank's tokens
  max err          max |g - g_token| / max |g_token| over ranks and components
                   (about |factor - 1| for a scaled row)
  claim, vs claim  what the loss type says it trains, and the gradient against that
  trains           every objective whose gradient the trainer's matches
  recipe           the course's re-implementation of the loss type on the same record
                   (exact: it agrees; -: the course has none)
  tokens per rank  each rank's completion tokens, one number per microbatch: rank 0 / rank 1"""
DETAILS = "data/trl-grpo-trainer.json"  # where a not-run row's whole reason is kept


# A stack whose pip install failed has no adapter here either: what the brief says.
INSTALL_FAILED = "no adapter (install failed in the benchmark environment)"


def _phrase(reason: str) -> str:
    """A reason's last clause, where its conclusion is, without the date it
    was tried, and cut before its details (after a colon) when still long;
    a failed install as ``INSTALL_FAILED``."""
    if re.match(r"pip install \S+ (failed|did not finish)", reason):
        return INSTALL_FAILED
    last = re.sub(r"\s*\(tried [^)]*\)$", "", reason.split(";")[-1].strip())
    return last.split(":")[0].strip() if len(last) > 70 else last


def describe(rows: list[TrainerRow], brief: bool = False) -> str:
    """One line per case: what it trains across the ranks, against the token
    mean and against its claim, and each rank's completion tokens. ``brief``:
    a not-run row's reason cut to its first clause, with a pointer to the
    whole of it, and the columns' legend below. In the learner's language
    (``COURSE_EDITION``); the reasons, claims and objectives are the report's."""
    unrun = (Verdict.NOT_RUN, Verdict.FAILED)
    mean = {id(r): r.said for r in rows}
    claim = {id(r): said(r.claim_verdict) if r.claim_verdict else "-" for r in rows}
    recipe = {id(r): said(r.recipe) if r.recipe else "-" for r in rows}
    head = (tr("trainer"), "loss_type", tr("vs token mean"), tr("max err"), tr("claim"),
            tr("vs claim"), tr("trains"), tr("recipe"))
    # each column as wide as this edition's words (English: as it was); a
    # right-aligned head keeps a space from the column before it
    w = [max(8, len(head[0])), 9, max([17, len(head[2]), *map(len, mean.values())]),
         max(8, len(head[3]) + 1), max(16, len(head[4]), len(tr("none stated"))),
         max([8, len(head[5]), *map(len, claim.values())]),
         max(16, len(head[6]), len(tr("none"))),
         max([7, len(head[7]), *map(len, recipe.values())])]
    lines = [f"  {head[0]:<{w[0]}} {head[1]:<{w[1]}} {head[2]:<{w[2]}} {head[3]:>{w[3]}}  "
             f"{head[4]:<{w[4]}} {head[5]:<{w[5]}} {head[6]:<{w[6]}} {head[7]:<{w[7]}} "
             + tr("tokens per rank")]
    for r in rows:
        if r.verdict in unrun:
            reason = tr("{reason} (in full: {file})").format(
                reason=_phrase(r.reason), file=DETAILS) if brief else r.reason
            lines.append(f"  {r.trainer or r.framework:<{w[0]}} {r.loss_type or '-':<{w[1]}} "
                         f"{mean[id(r)]:<{w[2]}} {reason}")
            continue
        tokens = " / ".join("+".join(map(str, t)) for t in r.tokens)
        lines.append(
            f"  {r.trainer:<{w[0]}} {r.loss_type or '-':<{w[1]}} {mean[id(r)]:<{w[2]}} "
            f"{marks(f'{r.max_err or 0:.1e}'):>{w[3]}}  "
            f"{r.claim or tr('none stated'):<{w[4]}} {claim[id(r)]:<{w[5]}} "
            f"{', '.join(r.trains) or tr('none'):<{w[6]}} {recipe[id(r)]:<{w[7]}} {tokens}")
    if brief:
        lines += ["", tr(LEGEND)]
    return "\n".join(lines)
