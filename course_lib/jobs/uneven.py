"""uneven_microbatches, the check that runs in launches of its own.

The parity window, each rank's sequences re-batched by a token budget
(``harness.uneven_layout``): the ranks make different numbers of
microbatches. One launch runs every step there and saves each step's
gradients with the reference of the same sequences. A step that deadlocks
(a collective that the rank with fewer microbatches never makes) fails the
launch within the step timeout, with the rank named: the parent records
that step's failure and launches again for the steps after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib.checks import Auditor, CheckResult
from course_lib.checks.uneven import DEADLINE, MAX_TOKENS
from course_lib.core import objectives
from course_lib.core.config import Config
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.run.diagnose import LaunchError
from course_lib.run.runfile import JobSpec
from course_lib.steps import load

NAME = "uneven_microbatches"


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
            path = result_path(ctx.out, step.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"grads": out.grads, "reference": ref.grad,
                        "microbatches": [len(r) for r in layout]}, path)
        ctx.progress("uneven microbatches", i + 1, len(spec.steps))
    ctx.state.audited = ctx.state.check = None


KIND = JobKind(UnevenJob, run_rank)


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
            path = failure_path(out, failed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"error": str(exc).splitlines()[0], "rank": exc.rank}))
            todo = todo[len(done) + 1:]


def collect(out: Path, step: str, atol: float, rtol: float) -> CheckResult:
    """Every rank's gradient against the reference of the same sequences, or
    the launch's failure (a deadlock names its rank)."""
    failed = failure_path(out, step)
    if failed.exists():
        error = json.loads(failed.read_text())["error"]
        return CheckResult(passed=False, max_abs_err=None, atol=atol, rtol=rtol,
                           note=f"the step never finished: {error}")
    saved = torch.load(result_path(out, step), weights_only=True)
    c = harness.compare_ranks(saved["grads"], saved["reference"], atol, rtol)
    counts = ", ".join(map(str, saved["microbatches"]))
    return CheckResult(passed=c.allclose, max_abs_err=c.max_abs_err, atol=atol, rtol=rtol,
                       note=f"microbatches per rank: {counts}")
