"""The audit: step functions checked by named checks, under real torchrun jobs.

One launch at the chosen world size runs every step through the in-launch
checks (``course_lib.checks``) and writes ``reports/audit-<step>.json``. A
check that needs launches of its own says what runs apart (``Check.apart``:
``world_size_invariance`` plans its jobs, ``uneven_microbatches`` makes its
launches); the parent runs them and merges their results. ``bugs``
runs every built-in step through every check -> ``reports/bugs.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from course_lib import checks
from course_lib.checks import CheckResult
from course_lib.checks.base import said
from course_lib.core import edition, objectives, paths
from course_lib.core.config import Config
from course_lib.core.edition import marks, tr
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec
from course_lib.steps import StepInfo, load
from course_lib.steps.objectives import CATALOGS


class AuditInputError(ValueError):
    """Bad --step, --checks, --dtype or --objective."""


@dataclass(frozen=True)
class AuditJob(JobSpec):
    """Every step through every in-launch check -> reports/audit-<step>.json."""

    TAG: ClassVar[str] = "audit"
    steps: list[str]
    checks: list[str]
    trajectory_updates: int = 5
    step_timeout: float = 60.0
    objective: str = objectives.DEFAULT  # the reference: token, sequence, ... or constant:C


@dataclass(frozen=True)
class AuditReport(RunHeader, Report):
    NAME: ClassVar[str] = "audit"  # saved as audit-<step>: see file_name
    step: str
    kind: str
    description: str
    compared_values: int
    checks: dict[str, CheckResult]
    passed: bool
    objective: str = objectives.DEFAULT  # a report written before objectives: the token mean
    extra: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def file_name(step: str) -> str:
        return f"audit-{step}"


@dataclass(frozen=True)
class BugRow:
    kind: str
    description: str
    why: str
    checks: dict[str, bool]
    caught_by: list[str]
    max_abs_err: dict[str, float | None]


@dataclass(frozen=True)
class BugsReport(RunHeader, Report):
    NAME: ClassVar[str] = "bugs"
    checks: list[str]
    steps: dict[str, BugRow]
    every_bug_caught: bool
    no_false_alarm: bool
    objective: str = objectives.DEFAULT
    extra: dict = field(default_factory=dict, repr=False)


# --- in the launch ---------------------------------------------------------------


def run_rank(ctx: RankContext, spec: AuditJob, progress: str | None = "audit") -> None:
    """``progress``: the label of its progress lines (None: none, the caller
    reports its own)."""
    ctx.state.step_timeout = spec.step_timeout
    todo = checks.select(spec.checks)
    ctx = ctx.auditing(spec.objective)
    catalog = CATALOGS.get(ctx.objective.name, {})
    for i, name in enumerate(spec.steps):
        step = load(name)
        ctx.state.audited = step.name
        ctx.log("audit_step", step=step.name)
        found = checks.Auditor(ctx, step, spec.trajectory_updates).run(todo)
        if ctx.rank == 0:
            results = {k: v for k, v in found.items() if v is not None}
            AuditReport(
                **ctx.header().fields(),
                step=step.name, kind=catalog.get(step.name, step).kind,
                description=step.description,
                compared_values=int(harness.parity_reference(ctx).grad.numel()),
                checks=results, passed=all(c.passed for c in results.values()),
                objective=ctx.objective.spec,
            ).save(ctx.out, AuditReport.file_name(step.name))
        if progress:
            ctx.progress(progress, i + 1, len(spec.steps))
    ctx.state.audited = None


KIND = JobKind(AuditJob, run_rank)


# --- the parent side ---------------------------------------------------------------


def parse_checks(text: str | None) -> list[str]:
    try:
        return checks.parse(text)
    except checks.UnknownCheck as exc:
        raise AuditInputError(str(exc)) from None


def resolve_steps(specs: list[str]) -> list[tuple[str, StepInfo]]:
    """(spec the workers load, step) pairs; a file path becomes absolute."""
    found = []
    for spec in specs:
        info = load(spec)  # StepSpecError: bad input, before any launch
        where, sep, name = spec.rpartition(":")
        if sep and where.endswith(".py"):
            spec = f"{Path(where).resolve()}:{name}"
        found.append((spec, info))
    names = [info.name for _, info in found]
    if len(set(names)) != len(names):
        raise AuditInputError("--step: two steps share the name "
                              f"{next(n for n in names if names.count(n) > 1)!r}")
    return found


def with_dtype(cfg: Config, dtype: str | None) -> Config:
    if not dtype:
        return cfg
    if dtype not in ("float32", "float64"):
        raise AuditInputError(f"--dtype: expected float32 or float64, got {dtype!r}")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, dtype=dtype))


def parse_objective(text: str | objectives.Objective | None,
                    cfg: Config | None = None) -> objectives.Objective:
    """The objective (parsed here, at the boundary, unless it already is),
    and with ``cfg``: packed rows that fit the model."""
    try:
        found = text if isinstance(text, objectives.Objective) else objectives.parse(text)
    except objectives.ObjectiveError as exc:
        raise AuditInputError(str(exc)) from None
    if cfg is not None and found.packing and found.packing > cfg.data.max_length:
        raise AuditInputError(
            f"--objective {found.spec}: packed rows of {found.packing} tokens are longer "
            f"than the model's {cfg.data.max_length} positions (data.max_length)")
    return found


def audit(cfg: Config, out: Path, specs: list[str], check_names: list[str] | None = None,
          *, dtype: str | None = None, data_dir: Path | None = None,
          trajectory_updates: int = 5, step_timeout: float = 60.0,
          extra_jobs: tuple[JobSpec, ...] = (),
          objective: str | objectives.Objective | None = None,
          **kw: Any) -> dict[str, AuditReport]:
    """Run the checks on each step against ``objective``'s reference (the
    token mean by default); write and return ``audit-<step>.json``.
    ``extra_jobs`` ride along in the first launch, after the audit job."""
    cfg = with_dtype(cfg, dtype).with_world_size(kw.pop("world_size", None))
    unit = parse_objective(objective, cfg).spec
    names = check_names or list(checks.NAMES)
    resolved = resolve_steps(specs)
    worker_specs = [spec for spec, _ in resolved]
    data_dir = data_dir or paths.data_dir()
    out = Path(out)
    world = cfg.train.world_size
    apart = {n: a for n in names if (a := checks.CHECKS[n].apart) is not None}
    plans = [a.plan(cfg, worker_specs, data_dir, step_timeout, unit)
             for a in apart.values() if a.plan]
    first: list[JobSpec] = [
        AuditJob(worker_specs, [c for c in names if checks.CHECKS[c].in_launch],
                 trajectory_updates, step_timeout, unit),
        *extra_jobs, *(p[world] for p in plans if world in p)]
    launch(cfg, out, first, data_dir=data_dir, **kw)
    for p in plans:
        for w, job in p.items():
            if w != world:
                launch(cfg, out, [job], data_dir=data_dir, world_size=w, **kw)
    for a in apart.values():
        if a.run:
            a.run(cfg, out, [(spec, info.name) for spec, info in resolved], step_timeout,
                  unit, data_dir=data_dir, **kw)
    atol, rtol = harness.tolerance(cfg)
    found = {}
    for _, info in resolved:
        name = AuditReport.file_name(info.name)
        report = AuditReport.load(out, name)
        results = dict(report.checks)
        for check, a in apart.items():
            results[check] = a.collect(out, info.name, atol, rtol)
        results = {c: results[c] for c in names}
        report = dataclasses.replace(report, checks=results,
                                     passed=all(c.passed for c in results.values()))
        report.save(out, name)
        found[info.name] = report
    return found


def bugs(cfg: Config, out: Path, objective: str | None = None, **kw: Any) -> BugsReport:
    """Every built-in step of ``objective``'s catalog (``steps.objectives``;
    the token mean's by default) through every check -> ``reports/bugs.json``."""
    unit = parse_objective(objective, cfg)
    catalog = CATALOGS[unit.name]
    found = audit(cfg, out, list(catalog), list(checks.NAMES), objective=unit, **kw)
    rows = {}
    for name, report in found.items():
        info = catalog[name]
        rows[name] = BugRow(
            kind=info.kind, description=info.description, why=info.why,
            checks={c: r.passed for c, r in report.checks.items()},
            caught_by=[c for c, r in report.checks.items() if not r.passed],
            max_abs_err={c: r.max_abs_err for c, r in report.checks.items()})
    first = next(iter(found.values()))
    result = BugsReport(
        **RunHeader.of(first).fields(), checks=list(checks.NAMES), steps=rows,
        every_bug_caught=all(r.caught_by for r in rows.values() if r.kind == "bug"),
        no_false_alarm=not any(r.caught_by for r in rows.values()
                               if r.kind == "correct"), objective=unit.spec)
    result.save(out)
    return result


def describe(report: AuditReport) -> str:
    """The audit as a short table: one line per check (in the learner's
    language: ``COURSE_EDITION``; a check's note as ``checks.base.said`` reads it)."""
    from course_lib.reports.numbers import short

    lines = [tr("Audit of {step} ({kind}): {ranks} ranks, {backend} on {device}, "
                "{dtype}").format(
        step=report.step, kind=tr(report.kind), ranks=report.world_size, backend=report.backend,
        device=edition.device(report.device),
        dtype=report.dtype)
        + ("" if report.objective == objectives.DEFAULT
           else tr("; objective {objective}").format(objective=report.objective))]
    width = max(len(tr("PASS")), len(tr("FAIL")))  # the details in one column
    for name, c in report.checks.items():
        verdict = tr("PASS") if c.passed else tr("FAIL")
        if c.max_abs_err is None:
            detail = said(c.note)
        elif c.passed:  # rounding decides the digits: the report keeps them
            detail = tr("max |err| within atol {atol}, rtol {rtol}").format(
                atol=marks(f"{c.atol:g}"), rtol=marks(f"{c.rtol:g}"))
        else:
            detail = tr("max |err| {err} (atol {atol}, rtol {rtol})").format(
                err=marks(short(c.max_abs_err)), atol=marks(f"{c.atol:g}"),
                rtol=marks(f"{c.rtol:g}"))
        lines.append(f"  {name:<24} {verdict:<{width}}  {detail}")
    lines.append(f"  {tr('verdict'):<24} {tr('PASS') if report.passed else tr('FAIL')}")
    return "\n".join(lines)


def describe_bugs(report: BugsReport) -> str:
    """The step x check matrix as text: '.' passes, 'X' fails."""
    abbrev = {c: c.split("_")[0][:6] for c in report.checks}
    head = f"  {'step':<28} {'kind':<8} " + " ".join(f"{s:>6}" for s in abbrev.values())
    lines = [f"Bug catalog: {report.world_size} ranks, {report.backend} on "
             f"{report.device}, {report.dtype}"
             + ("" if report.objective == objectives.DEFAULT
                else f"; objective {report.objective}"), head]
    for name, row in report.steps.items():
        marks = " ".join(f"{'.' if row.checks[c] else 'X':>6}" for c in report.checks)
        lines.append(f"  {name:<28} {row.kind:<8} {marks}")
    lines.append(f"  every bug caught: {report.every_bug_caught}; "
                 f"no false alarm: {report.no_false_alarm}")
    return "\n".join(lines)
