"""Token-weighted DDP: the engine behind the course's notebooks.

This is the notebooks' one face: every name a chapter calls, grouped by the
chapter that first needs it. Names load on first use (PEP 562), so a chapter
that does arithmetic by hand never pays for ``import torch``. The layers
behind it are in ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> "module" (the module itself) or "module:attribute"
_EXPORTS: dict[str, str] = {
    # 00 set-up, and every chapter's imports
    "load_config": "course_lib.course.api:load_config",
    "LaunchError": "course_lib.run.diagnose:LaunchError",
    "paths": "course_lib.core.paths",
    "launch": "course_lib.run.launch",
    "progress": "course_lib.run.progress",
    "quiz": "course_lib.course.quiz",
    "check": "course_lib.course.quiz:check",
    "widgets": "course_lib.course.widgets",
    "plots": "course_lib.course.plots",
    "expect": "course_lib.course.timings:expect",
    "number": "course_lib.core.edition:number",  # a count as the edition writes it
    "decimal": "course_lib.core.edition:decimal",  # a float, to its places, likewise
    "date": "course_lib.core.edition:date",  # a stored day (2026-12-05), likewise
    "collectives": "course_lib.course.collectives",
    # 01 the mean of means (the arithmetic, the token explorer, theta)
    "arithmetic": "course_lib.core.arithmetic",
    "global_mean": "course_lib.core.arithmetic:global_mean",
    "mean_of_means": "course_lib.core.arithmetic:mean_of_means",
    # 02 data and plan
    "data": "course_lib.core.data",
    "prepare": "course_lib.course.api:prepare",
    "corpus": "course_lib.course.api:corpus",
    # 03 the global denominator
    "model": "course_lib.core.model",
    "compare": "course_lib.core.reference:compare",
    "flat_grad": "course_lib.core.reference:flat_grad",
    "token_reference": "course_lib.core.reference:token_reference",
    "err_bound": "course_lib.reports.numbers:err_bound",
    # 04 DDP parity
    "objectives": "course_lib.core.objectives",
    "parity": "course_lib.jobs.parity:parity",
    "harness": "course_lib.rank.harness",  # its no_sync() probe, shown
    # 05 the bug lab
    "steps": "course_lib.steps",
    "audit": "course_lib.jobs.audit:audit",
    "bugs": "course_lib.jobs.audit:bugs",
    "checks": "course_lib.checks",  # the named checks: one read in its source
    "describe_audit": "course_lib.jobs.audit:describe",
    "AuditReport": "course_lib.jobs.audit:AuditReport",
    # 06 checkpoint and resume
    "checkpoint": "course_lib.core.checkpoint",
    "train": "course_lib.jobs.train:train",
    "stop_and_continuous": "course_lib.jobs.train:stop_and_continuous",
    "continuous_dir": "course_lib.jobs.train:continuous_dir",
    "resume_check": "course_lib.jobs.resume:resume_check",
    "train_steps": "course_lib.jobs.train:train_steps",
    # 07 evaluation and loss logging
    "evaluate_run": "course_lib.course.api:evaluate_run",
    "evaluation_job": "course_lib.jobs.evaluate",
    "reconcile": "course_lib.course.reconcile",
    "window_loss": "course_lib.core.normalize:window_loss",
    "LoggingData": "course_lib.jobs.frameworks_logging:LoggingData",
    "frameworks_logging": "course_lib.jobs.frameworks_logging:frameworks_logging",
    # 04 DDP parity: the 12 -> 36 exercise
    "exercise": "course_lib.jobs.exercise:exercise",
    # 08 your framework, audited: the recipes, the real code, the real loops
    "recipes": "course_lib.steps.recipes",
    "recipe_audit": "course_lib.jobs.recipes",
    "real_code": "course_lib.frameworks.source",
    "audit_frameworks": "course_lib.jobs.frameworks:audit_frameworks",
    "audit_trainer": "course_lib.jobs.frameworks:audit_trainer",
    "describe_frameworks": "course_lib.jobs.frameworks:describe",
    # the --with configurations: committed, or measured live here
    "describe_configurations": "course_lib.course.configurations:describe",
    "Matrix": "course_lib.frameworks.evidence:Matrix",
    "predicted_formula": "course_lib.jobs.frameworks:predicted",
    "framework_window": "course_lib.jobs.frameworks:window_counts",
    # 05 the bug lab: the uneven layout, and what its check kept of a step
    "uneven_result": "course_lib.checks.uneven:result_path",
    "uneven_layout": "course_lib.rank.harness:uneven_layout",
    "uneven_budget": "course_lib.checks.uneven:MAX_TOKENS",
    # 05 the bug lab: the bugs by family, and one bug read three ways
    "bug_tour": "course_lib.course.bug_tour:tour",
    "show_layouts": "course_lib.course.bug_tour:show_layouts",  # the invariance checks' layouts
    # 09 choose the unit
    "packing_of": "course_lib.rank.harness:packing_of",
    # 09 choose the unit: the steps of any objective, objective_global's source
    "objective_steps": "course_lib.steps.objectives",
    # 09 choose the unit: the RL stacks' aggregations, and each token's weight
    "rl_recipes": "course_lib.steps.rl_recipes",
    # 09 choose the unit: TRL's real GRPOTrainer and RLOOTrainer under torchrun
    "grpo_trainer": "course_lib.jobs.trl_grpo",
    # 10 capstone
    "capstone_check": "course_lib.jobs.capstone:check",
    "describe_capstone": "course_lib.jobs.capstone:describe",
    # what every chapter prints in the learner's language: the placement, 05's
    # step table, the line that asks for a value the learner has not set
    "describe_placement": "course_lib.course.api:describe_placement",
    "step_table": "course_lib.course.api:step_table",
    "unset": "course_lib.course.api:unset",
    # the whole protocol and its summary table (course-lib run-all), and the reports
    "run_all": "course_lib.course.api:run_all",
    "reports": "course_lib.reports",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    if attr:
        value = getattr(value, attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
