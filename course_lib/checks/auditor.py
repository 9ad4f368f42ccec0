"""The auditor: one step function through the named checks, inside the launch.

Every rank calls every check in the same order, so no collective is skipped;
the result lands on rank 0. The parity window's run is shared by the checks
that need it. A check knows what it compares, never which step it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from course_lib.checks.base import Check, CheckResult
from course_lib.core.reference import Comparison
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.steps.base import StepInfo


class Auditor:
    def __init__(self, ctx: RankContext, step: StepInfo, trajectory_updates: int = 5):
        self.ctx, self.step = ctx, step
        self.updates = trajectory_updates
        self.atol, self.rtol = harness.tolerance(ctx.cfg)
        self._base: harness.StepOutcome | None = None

    @property
    def is_root(self) -> bool:
        return self.ctx.rank == 0

    def layout(self) -> harness.Layout:
        return self.ctx.parity_layout()

    def base(self) -> harness.StepOutcome:
        """The step on the parity window, from the initial weights (run once)."""
        if self._base is None:
            self._base = self.outcome(self.layout())
        return self._base

    def outcome(self, layout: harness.Layout, ddp: Any = None,
                probe: bool = True) -> harness.StepOutcome:
        ddp = ddp or harness.fresh_ddp(self.ctx, self.step)
        micro = harness.microbatches(self.ctx, layout, self.ctx.rank)
        return harness.run_step(self.ctx, self.step, ddp, micro, probe)

    def result(self, passed: bool, max_abs_err: float | None, **kw: Any) -> CheckResult:
        return CheckResult(passed=passed, max_abs_err=max_abs_err, atol=self.atol,
                           rtol=self.rtol, **kw)

    def compare(self, grads: list[torch.Tensor], ref: torch.Tensor) -> Comparison:
        return harness.compare_ranks(grads, ref, self.atol, self.rtol)

    def run(self, checks: Iterable[Check]) -> dict[str, CheckResult | None]:
        """Each in-launch check, in order; {name: result} (None off rank 0)."""
        found = {}
        for check in checks:
            if check.run is None:
                raise ValueError(f"check {check.name!r} runs in launches of its own")
            self.ctx.state.check = check.name
            self.ctx.log("check", check=check.name)
            found[check.name] = check.run(self)
        self.ctx.state.check = None
        return found
