"""The same sequences arranged another way must give the same gradient:
split into other microbatches, or dealt to other ranks."""

from __future__ import annotations

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Check, CheckResult
from course_lib.core.verdicts import worst
from course_lib.rank import harness


def _invariance(a: Auditor, layouts: dict[str, harness.Layout], note: str
                ) -> CheckResult | None:
    # The layout as planned was already run (parity's window, fresh weights).
    outcomes = {name: a.base() if layout == a.layout() else a.outcome(layout)
                for name, layout in layouts.items()}
    if not a.is_root:
        return None
    first, *_ = outcomes.values()
    errors: dict[str, float | None] = {}
    passed = True
    for name, out in outcomes.items():
        c = a.compare(out.grads, first.grads[0])
        errors[name] = c.max_abs_err
        passed = passed and c.allclose
    return a.result(passed, worst(errors.values()), errors=errors, note=note)


def accumulation_invariance(a: Auditor) -> CheckResult | None:
    return _invariance(a, harness.accumulation_layouts(a.layout()),
                       "one window's sequences, split per rank as A x B")


def permutation_invariance(a: Auditor) -> CheckResult | None:
    layouts = harness.permuted_layouts(a.layout(), a.ctx.corpus, a.ctx.cfg.seed + 30)
    return _invariance(a, layouts, "the window's sequences dealt to other ranks")


ACCUMULATION = Check("accumulation_invariance", "one window's sequences split per rank "
                     "as 1x16, 2x8, 4x4 and 16x1", accumulation_invariance)
PERMUTATION = Check("permutation_invariance", "the same sequences dealt to other ranks "
                    "(by length, shuffled)", permutation_invariance)
