"""Numbers as the chapters print them: only what another CPU cannot change.

A rounding-level error (7e-9 with one CPU's kernels, 4e-9 with another's)
prints as a bound; the exact value stays in the JSON reports, where tests
check it with tolerances.
"""

from __future__ import annotations

from course_lib.core.edition import marks

TINY = 1e-7


def err_bound(x: float | None) -> str:
    """'< 1e-7' for a rounding-level error, else '= ' and three digits (with
    the edition's decimal mark: 6,43e-03 in French)."""
    if x is None:
        return "= n/a"
    return "< 1e-7" if abs(x) < TINY else marks(f"= {x:.2e}")


def short(x: float | None) -> str:
    """Three significant digits, or 'n/a' for a missing or non-finite value."""
    return "n/a" if x is None else f"{x:.3g}"
