"""no_sync: ranks hold different gradients between microbatches and the same
at the end, so DDP really deferred the sync."""

from __future__ import annotations

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Check, CheckResult


def no_sync(a: Auditor) -> CheckResult | None:
    agree = a.base().agree_after_micro
    if not a.is_root:
        return None
    between, at_end = agree[:-1], agree[-1]
    if a.ctx.world_size == 1 or not between:
        return a.result(True, None, agree_after_micro=agree,
                        note="not applicable: one rank or one microbatch")
    if not at_end:
        note = "ranks hold different gradients after the step: never synchronised"
    elif any(between):
        first = between.index(True) + 1  # counted from 1, as the figures do
        note = (f"ranks already agreed after microbatch {first} of {len(agree)}: DDP "
                "synchronised early (no_sync() must wrap forward and backward)")
    else:
        note = "synchronisation deferred to the last microbatch"
    return a.result(at_end and not any(between), None, agree_after_micro=agree, note=note)


CHECK = Check("no_sync", "ranks hold different gradients between microbatches and the "
              "same at the end: the sync was really deferred", no_sync)
