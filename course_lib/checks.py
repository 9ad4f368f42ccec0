"""The named checks, run inside the torchrun job: steps x checks.

A check takes a step and returns a ``CheckResult`` on rank 0 (None on the
other ranks). It knows what it compares, never which step it runs. Every
rank calls every check in the same order, so no collective is skipped.

  parity                   every gradient component vs the reference
  trajectory               K SGD updates; at each, the gradient vs the reference
                           at the same parameters
  accumulation_invariance  one window's sequences as 1x16, 2x8, 4x4, 16x1
  permutation_invariance   the same sequences dealt to other ranks
  no_sync                  ranks differ between microbatches, agree at the end
  world_size_invariance    W = 1, 2, 4: one launch each, compared by the parent
"""

from __future__ import annotations

import torch

from . import reports, window
from .data import make_sampler
from .reports import CheckResult
from .steps import StepInfo, load

IN_LAUNCH = ("parity", "trajectory", "accumulation_invariance",
             "permutation_invariance", "no_sync")
ALL = ("parity", "trajectory", "accumulation_invariance", "world_size_invariance",
       "permutation_invariance", "no_sync")
WORLD_SIZES = (1, 2, 4)


class Auditor:
    """Runs one step's checks; the parity window's run and reference are shared."""

    def __init__(self, ctx, step: StepInfo, trajectory_updates: int = 5):
        self.ctx, self.step = ctx, step
        self.updates = trajectory_updates
        self.atol, self.rtol = window.tolerance(ctx.cfg)
        self._base: window.StepOutcome | None = None

    @property
    def is_root(self) -> bool:
        return self.ctx.rank == 0

    def layout(self) -> window.Layout:
        return self.ctx.parity_layout()

    def base(self) -> window.StepOutcome:
        if self._base is None:
            self._base = self.outcome(self.layout())
        return self._base

    def outcome(self, layout: window.Layout, ddp=None) -> window.StepOutcome:
        ddp = ddp or window.fresh_ddp(self.ctx, self.step)
        micro = window.microbatches(self.ctx, layout, self.ctx.rank)
        return window.run_step(self.ctx, self.step, ddp, micro)

    def result(self, passed: bool, max_abs_err, **kw) -> CheckResult:
        return CheckResult(passed=passed, max_abs_err=max_abs_err, atol=self.atol,
                           rtol=self.rtol, **kw)

    def compare(self, grads, ref) -> dict:
        return window.compare_ranks(grads, ref, self.atol, self.rtol)

    # --- the checks ----------------------------------------------------------------

    def parity(self) -> CheckResult | None:
        base = self.base()
        if not self.is_root:
            return None
        c = self.compare(base.grads, self.ctx.parity_reference().grad)
        return self.result(c["allclose"], c["max_abs_err"],
                           errors={"window": c["max_abs_err"]},
                           note=f"{c['violations']} violations")

    def trajectory(self) -> CheckResult | None:
        ctx = self.ctx
        ddp = window.fresh_ddp(ctx, self.step)
        sgd = torch.optim.SGD(ddp.parameters(), lr=ctx.cfg.train.lr)
        sampler = make_sampler(ctx.cfg, ctx.corpus, ctx.world_size)
        errors, passed = {}, True
        for update in range(1, self.updates + 1):
            ctx.step = update
            layout = sampler.next_window()
            out = self.outcome(layout, ddp)
            if self.is_root:
                c = self.compare(out.grads, self._reference_at(update, layout, ddp))
                errors[f"update {update}"] = c["max_abs_err"]
                passed = passed and c["allclose"]
            sgd.step()
        ctx.step = None
        if not self.is_root:
            return None
        return self.result(passed, _worst(errors), errors=errors,
                           note=f"{self.updates} SGD updates, lr {ctx.cfg.train.lr:g}")

    def _reference_at(self, update: int, layout: window.Layout, ddp) -> torch.Tensor:
        if update == 1 and layout == self.layout():  # the initial weights, the parity window
            return self.ctx.parity_reference().grad
        state = {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}
        return window.reference(self.ctx, layout, state).grad

    def accumulation_invariance(self) -> CheckResult | None:
        return self._invariance(window.accumulation_layouts(self.layout()),
                                "one window's sequences, split per rank as A x B")

    def permutation_invariance(self) -> CheckResult | None:
        layouts = window.permuted_layouts(self.layout(), self.ctx.corpus,
                                          self.ctx.cfg.seed + 30)
        return self._invariance(layouts, "the window's sequences dealt to other ranks")

    def _invariance(self, layouts: dict[str, window.Layout], note: str):
        # The layout as planned was already run (parity's window, fresh weights).
        outcomes = {name: self.base() if layout == self.layout() else self.outcome(layout)
                    for name, layout in layouts.items()}
        if not self.is_root:
            return None
        first, *_ = outcomes.values()
        errors, passed = {}, True
        for name, out in outcomes.items():
            c = self.compare(out.grads, first.grads[0])
            errors[name] = c["max_abs_err"]
            passed = passed and c["allclose"]
        return self.result(passed, _worst(errors), errors=errors, note=note)

    def no_sync(self) -> CheckResult | None:
        agree = self.base().agree_after_micro
        if not self.is_root:
            return None
        between, at_end = agree[:-1], agree[-1]
        if self.ctx.world_size == 1 or not between:
            return self.result(True, None, agree_after_micro=agree,
                               note="not applicable: one rank or one microbatch")
        if not at_end:
            note = "ranks hold different gradients after the step: never synchronised"
        elif any(between):
            first = between.index(True) + 1
            note = (f"ranks already agreed before microbatch {first}: DDP synchronised "
                    "early (no_sync() must wrap forward and backward)")
        else:
            note = "synchronisation deferred to the last microbatch"
        return self.result(at_end and not any(between), None, agree_after_micro=agree,
                           note=note)

    def run(self, names) -> dict[str, CheckResult | None]:
        found = {}
        for name in names:
            self.ctx.check = name
            self.ctx.log("check", check=name)
            found[name] = getattr(self, name)()
        self.ctx.check = None
        return found


def _worst(errors: dict) -> float | None:
    values = list(errors.values())
    return None if any(v is None or v != v for v in values) else max(values, default=0.0)


# --- jobs ----------------------------------------------------------------------------


def job_audit(ctx, spec) -> None:
    ctx.step_timeout = spec.step_timeout
    for i, name in enumerate(spec.steps):
        step = load(name)
        ctx.audited = step.name
        ctx.log("audit_step", step=step.name)
        found = Auditor(ctx, step, spec.trajectory_updates).run(spec.checks)
        if ctx.rank == 0:
            report = reports.AuditReport(
                step=step.name, kind=step.kind, description=step.description,
                world_size=ctx.world_size, backend=ctx.backend,
                device=ctx.device.type, dtype=ctx.cfg.train.dtype,
                compared_values=int(ctx.parity_reference().grad.numel()),
                checks=found, passed=all(c.passed for c in found.values()))
            reports.save(ctx.out, f"audit-{step.name}", report)
        ctx.progress("audit", i + 1, len(spec.steps))
    ctx.audited = None


def world_size_grad_path(out, world_size: int, step: str):
    return out / "audit" / "world-size" / f"W{world_size}" / f"{step}.pt"


def job_world_size(ctx, spec) -> None:
    ctx.step_timeout = spec.step_timeout
    layout = window.world_size_layout(spec.sequence_ids, ctx.world_size, spec.batch_size)
    for i, name in enumerate(spec.steps):
        step = load(name)
        ctx.audited, ctx.check = step.name, "world_size_invariance"
        out = Auditor(ctx, step).outcome(layout)
        if ctx.rank == 0:
            path = world_size_grad_path(ctx.out, ctx.world_size, step.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"grads": out.grads, "local_tokens": out.local_tokens}, path)
        ctx.progress(f"world size {ctx.world_size}", i + 1, len(spec.steps))
    ctx.audited = ctx.check = None
