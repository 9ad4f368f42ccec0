"""parity: every gradient component of every rank against the reference."""

from __future__ import annotations

from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Check, CheckResult
from course_lib.rank.harness import parity_reference


def parity(a: Auditor) -> CheckResult | None:
    base = a.base()
    if not a.is_root:
        return None
    c = a.compare(base.grads, parity_reference(a.ctx).grad)
    return a.result(c.allclose, c.max_abs_err, errors={"window": c.max_abs_err},
                    note=f"{c.violations} violations")


CHECK = Check("parity", "every gradient component of every rank against the reference "
              "(atol 1e-6, rtol 1e-4; with --dtype float64, atol 1e-12: the formula is "
              "exact, not only right within fp32 rounding)", parity)
