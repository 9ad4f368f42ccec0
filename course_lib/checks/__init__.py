"""The named checks: the one list of them, for the audit, the CLI and the quiz.

A new check is one module here that defines a ``Check`` (a function of the
``Auditor``, or the job it runs apart: ``Apart``), plus its entry below and
a test. Order matters: it is the order of the columns in every report and
table. A check without exactly one way to run fails at import.
"""

from course_lib.checks import invariance, no_sync, parity, trajectory, uneven, world_size
from course_lib.checks.auditor import Auditor
from course_lib.checks.base import Apart, Check, CheckDefinitionError, CheckResult


def registry(*found: Check) -> dict[str, Check]:
    """{name: check}, in order; a name given twice fails at import."""
    names = [c.name for c in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CheckDefinitionError(f"two checks share the name {twice[0]!r}")
    return {c.name: c for c in found}


CHECKS: dict[str, Check] = registry(
    parity.CHECK,
    trajectory.CHECK,
    invariance.ACCUMULATION,
    world_size.CHECK,
    invariance.PERMUTATION,
    uneven.CHECK,
    no_sync.CHECK,
)
NAMES: tuple[str, ...] = tuple(CHECKS)


class UnknownCheck(ValueError):
    """A check name that is not in ``CHECKS``."""


def parse(text: str | None) -> list[str]:
    """``--checks a,b`` -> [a, b] (every check when empty); unknown names refused."""
    if not text:
        return list(NAMES)
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHECKS]
    if unknown or not names:
        raise UnknownCheck(f"--checks: unknown check {unknown[0] if unknown else text!r}"
                           f" (choose from {', '.join(NAMES)})")
    return list(dict.fromkeys(names))


def select(names: list[str] | tuple[str, ...]) -> list[Check]:
    """The in-launch checks among ``names``, in the order given."""
    return [CHECKS[n] for n in names if CHECKS[n].in_launch]


__all__ = ["CHECKS", "NAMES", "Apart", "Auditor", "Check", "CheckDefinitionError",
           "CheckResult", "UnknownCheck", "parse", "registry", "select"]
