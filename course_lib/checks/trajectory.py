"""trajectory: K SGD updates; at each, the gradient against the reference at
the same parameters."""

from __future__ import annotations

import torch

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Check, CheckResult
from course_lib.core.data import make_sampler
from course_lib.core.verdicts import worst
from course_lib.rank import harness


def _reference_at(a: Auditor, update: int, layout: harness.Layout, ddp) -> torch.Tensor:
    if update == 1 and layout == a.layout():  # the initial weights, the parity window
        return harness.parity_reference(a.ctx).grad
    state = {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}
    return harness.window_reference(a.ctx, layout, state).grad


def trajectory(a: Auditor) -> CheckResult | None:
    ctx = a.ctx
    ddp = harness.fresh_ddp(ctx, a.step)
    sgd = torch.optim.SGD(ddp.parameters(), lr=ctx.cfg.train.lr)
    sampler = make_sampler(ctx.cfg, ctx.corpus, ctx.world_size)
    errors: dict[str, float | None] = {}
    passed = True
    for update in range(1, a.updates + 1):
        ctx.state.update = update
        layout = sampler.next_window()
        out = a.outcome(layout, ddp)
        if a.is_root:
            c = a.compare(out.grads, _reference_at(a, update, layout, ddp))
            errors[f"update {update}"] = c.max_abs_err
            passed = passed and c.allclose
        sgd.step()
    ctx.state.update = None
    if not a.is_root:
        return None
    return a.result(passed, worst(errors.values()), errors=errors,
                    note=f"{a.updates} SGD updates, lr {ctx.cfg.train.lr:g}")


CHECK = Check("trajectory", "5 SGD updates (dropout off); at each, the DDP gradient "
              "against the reference at the same parameters", trajectory)
