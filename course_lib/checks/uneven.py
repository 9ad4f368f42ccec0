"""uneven_microbatches: the window's sequences re-batched by a token budget,
so the ranks make different numbers of microbatches.

With token-budget batching (fairseq's ``max_tokens``, packing), a rank of
long sequences makes more, smaller microbatches than a rank of short ones.
A step must still give the window's gradient, and every rank must take
part in the same collectives: a collective per microbatch pairs with
nothing on the rank that ran out of microbatches, and the step deadlocks.
A deadlock fails its launch, so the check runs in launches of its own.

One launch runs every step on the parity window, each rank's sequences
re-batched (``harness.uneven_layout``), and saves each step's gradients
with the reference of the same sequences. A step that deadlocks (a
collective that the rank with fewer microbatches never makes) fails the
launch within the step timeout, with the rank named: the parent records
that step's failure and launches again for the steps after it.
"""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Apart, Artifact, Check, CheckResult, JsonArtifact
from course_lib.core import objectives
from course_lib.core.config import Config
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.run.diagnose import LaunchError
from course_lib.run.launch import launch
from course_lib.run.runfile import JobSpec
from course_lib.steps import load

NAME = "uneven_microbatches"

# 384 padded tokens: on the course's skewed window, 3 microbatches of short
# sequences on rank 0 against 6 of long ones on rank 1.
MAX_TOKENS = 384

# Every rank runs the parity window in well under a second: a rank that has
# not finished this long after the others is deadlocked (or the step timeout
# is shorter, and decides).
DEADLINE = 10.0


@dataclass(frozen=True)
class UnevenJob(JobSpec):
    """Each step on the parity window re-batched by a token budget."""

    TAG: ClassVar[str] = "uneven"
    steps: list[str]
    step_timeout: float = 60.0
    objective: str = objectives.DEFAULT
    max_tokens: int = MAX_TOKENS


def result_path(out: Path, step: str) -> Path:
    return Path(out) / "audit" / "uneven" / f"{step}.pt"


def failure_path(out: Path, step: str) -> Path:
    return Path(out) / "audit" / "uneven" / f"{step}.failed.json"


@dataclass(frozen=True)
class UnevenResult(Artifact):
    """``result_path``: one step's gradients on every rank, and the
    reference of the same sequences (chapter 05 loads it)."""

    grads: list[torch.Tensor]  # per rank, after the sync
    reference: torch.Tensor
    microbatches: list[int]  # per rank


@dataclass(frozen=True)
class UnevenFailure(JsonArtifact):
    """``failure_path``: the launch a step failed, the first line of its error."""

    error: str
    rank: int | None


def run_rank(ctx: RankContext, spec: UnevenJob) -> None:
    ctx.state.step_timeout = spec.step_timeout
    layout = harness.uneven_layout(ctx.parity_layout(), ctx.corpus, spec.max_tokens)
    ctx = ctx.auditing(spec.objective)
    ref = harness.window_reference(ctx, layout) if ctx.rank == 0 else None
    for i, name in enumerate(spec.steps):
        step = load(name)
        ctx.state.audited, ctx.state.check = step.name, NAME
        ctx.log("audit_step", step=step.name)
        # No sync probe: its collective before each forward would pair
        # with nothing on the rank that ran out of microbatches.
        out = Auditor(ctx, step).outcome(layout, probe=False)
        if ref is not None:  # rank 0
            UnevenResult(out.grads, ref.grad, [len(r) for r in layout]).save(
                result_path(ctx.out, step.name))
        ctx.progress("uneven microbatches", i + 1, len(spec.steps))
    ctx.state.audited = ctx.state.check = None


def run(cfg: Config, out: Path, specs: list[tuple[str, str]], step_timeout: float,
        objective: str, **kw: Any) -> None:
    """Launch the steps ((spec, name) pairs) at the config's world size
    until each has a result or a failure: a failed launch records its step
    and the next launch goes on."""
    out = Path(out)
    todo = list(specs)
    for _, name in todo:
        for path in (result_path(out, name), failure_path(out, name)):
            path.unlink(missing_ok=True)
    while todo:
        job = UnevenJob([spec for spec, _ in todo], min(step_timeout, DEADLINE), objective)
        try:
            launch(cfg, out, [job], **kw)
            return
        except LaunchError as exc:
            if exc.interrupted:
                raise
            done = [n for _, n in todo if result_path(out, n).exists()]
            failed = todo[len(done)][1] if len(done) < len(todo) else None
            if failed is None or exc.audited != failed:
                raise  # not the step's own failure: the set-up, the launcher
            UnevenFailure(str(exc).splitlines()[0], exc.rank).save(failure_path(out, failed))
            todo = todo[len(done) + 1:]


def collect(out: Path, step: str, atol: float, rtol: float) -> CheckResult:
    """Every rank's gradient against the reference of the same sequences, or
    the launch's failure (a deadlock names its rank)."""
    failed = failure_path(out, step)
    if failed.exists():
        error = UnevenFailure.load(failed).error
        return CheckResult(passed=False, max_abs_err=None, atol=atol, rtol=rtol,
                           note=f"the step never finished: {error}")
    saved = UnevenResult.load(result_path(out, step))
    c = harness.compare_ranks(saved.grads, saved.reference, atol, rtol)
    counts = ", ".join(map(str, saved.microbatches))
    return CheckResult(passed=c.allclose, max_abs_err=c.max_abs_err, atol=atol, rtol=rtol,
                       note=f"microbatches per rank: {counts}")


CHECK = Check(NAME, f"the window re-batched by a budget of {MAX_TOKENS} padded tokens "
              "(fairseq's max_tokens), so the ranks make different numbers of "
              "microbatches; a step that hangs is named (a launch of its own)",
              apart=Apart(UnevenJob, run_rank, collect, run=run))
