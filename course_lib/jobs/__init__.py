"""The job kinds: what a torchrun launch can be asked to do.

Each module holds one kind whole: its spec (what the launcher asks), its
rank function (what every worker does), its parent-side call (what the CLI
and the notebooks run) and its report dataclass. A new job kind is one
module with a ``KIND`` plus its entry in ``KINDS`` and a test. The jobs of
the checks that run apart are registered from the checks themselves
(``Check.apart``): a check is one module.
"""

from course_lib.checks import CHECKS
from course_lib.jobs import (
    audit,
    bench,
    capstone,
    evaluate,
    exercise,
    frameworks,
    frameworks_logging,
    parity,
    recipes,
    resume,
    smoke,
    train,
    trl_grpo,
)
from course_lib.jobs.kind import JobKind
from course_lib.run.runfile import JobSpec

KINDS: dict[str, JobKind] = {k.tag: k for k in (
    parity.KIND,
    train.KIND,
    resume.KIND,
    exercise.KIND,
    smoke.KIND,
    bench.KIND,
    audit.KIND,
    *(JobKind(c.apart.spec, c.apart.rank) for c in CHECKS.values() if c.apart),
    recipes.KIND,
    frameworks.KIND,
    frameworks_logging.KIND,
    capstone.KIND,
    evaluate.KIND,
    trl_grpo.KIND,
)}
SPECS: dict[str, type[JobSpec]] = {tag: k.spec for tag, k in KINDS.items()}

__all__ = ["KINDS", "SPECS", "JobKind", "JobSpec"]
