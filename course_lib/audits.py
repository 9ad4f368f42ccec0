"""Audit step functions by named checks, under real torchrun jobs.

One launch at the chosen world size runs every step through the in-launch
checks; ``world_size_invariance`` adds a launch at each other W in (1, 2, 4),
on one fixed set of sequences, and compares the gradients here.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from . import checks, jobs, launch, paths, reports, steps, window
from .config import Config
from .data import Corpus, load_corpus

WORLD_SIZE_SEQUENCES = 32  # divisible by every W in checks.WORLD_SIZES, and by 8


class AuditInputError(ValueError):
    """Bad --step or --checks."""


def parse_checks(text: str | None) -> list[str]:
    if not text:
        return list(checks.ALL)
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in checks.ALL]
    if unknown or not names:
        raise AuditInputError(f"--checks: unknown check {unknown[0] if unknown else text!r}"
                              f" (choose from {', '.join(checks.ALL)})")
    return list(dict.fromkeys(names))


def resolve_steps(specs: list[str]) -> list[tuple[str, steps.StepInfo]]:
    """(spec the workers load, step) pairs; a file path becomes absolute."""
    found = []
    for spec in specs:
        info = steps.load(spec)  # StepSpecError: bad input, before any launch
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


def world_size_sequences(cfg: Config, corpus: Corpus) -> list[int]:
    """A fixed set of training sequences, sorted by length: the plan of the
    world-size check never depends on W, and contiguous slices stay skewed."""
    ids = random.Random(cfg.seed + 20).sample(corpus.splits["train"],
                                              WORLD_SIZE_SEQUENCES)
    return sorted(ids, key=lambda i: (len(corpus.sequences[i]), i))


def _world_size_check(out: Path, name: str, atol: float, rtol: float
                      ) -> reports.CheckResult:
    found = {w: torch.load(checks.world_size_grad_path(out, w, name), weights_only=True)
             for w in checks.WORLD_SIZES}
    base = found[1]["grads"][0]
    errors, passed = {}, True
    for w, saved in found.items():
        c = window.compare_ranks(saved["grads"], base, atol, rtol)
        errors[f"W={w}"] = c["max_abs_err"]
        passed = passed and c["allclose"]
    worst = None if any(e is None for e in errors.values()) else max(errors.values())
    return reports.CheckResult(
        passed=passed, max_abs_err=worst, atol=atol, rtol=rtol, errors=errors,
        note=f"{WORLD_SIZE_SEQUENCES} sequences over W = 1, 2, 4; compared with W = 1")


def audit(cfg: Config, out: Path, specs: list[str], check_names: list[str] | None = None,
          *, dtype: str | None = None, data_dir: Path | None = None,
          trajectory_updates: int = 5, step_timeout: float = 60.0,
          extra_jobs: tuple[jobs.Job, ...] = (),
          **kw) -> dict[str, reports.AuditReport]:
    """Run the checks on each step; write and return ``audit-<step>.json``.
    ``extra_jobs`` ride along in the first launch, after the audit job."""
    cfg = with_dtype(cfg, dtype)
    names = check_names or list(checks.ALL)
    resolved = resolve_steps(specs)
    worker_specs = [spec for spec, _ in resolved]
    data_dir = data_dir or paths.data_dir()
    out = Path(out)
    world = kw.pop("world_size", None) or cfg.train.world_size
    in_launch = [c for c in names if c in checks.IN_LAUNCH]
    todo: list[jobs.Job] = [jobs.AuditJob(worker_specs, in_launch, trajectory_updates,
                                         step_timeout), *extra_jobs]
    ws = "world_size_invariance" in names
    if ws:
        ids = world_size_sequences(cfg, load_corpus(cfg, data_dir))
        ws_job = jobs.WorldSizeJob(worker_specs, ids, cfg.train.batch_size_per_rank,
                                   step_timeout)
        if world in checks.WORLD_SIZES:
            todo.append(ws_job)
    launch.launch(cfg, out, todo, data_dir=data_dir, world_size=world, **kw)
    if ws:
        for w in checks.WORLD_SIZES:
            if w != world:
                launch.launch(cfg, out, [ws_job], data_dir=data_dir, world_size=w, **kw)
    atol, rtol = window.tolerance(cfg)
    found = {}
    for _, info in resolved:
        name = f"audit-{info.name}"
        report = reports.load(out, name)
        results = dict(report.checks)
        if ws:
            results["world_size_invariance"] = _world_size_check(out, info.name, atol, rtol)
        results = {c: results[c] for c in names}
        report = dataclasses.replace(report, checks=results,
                                     passed=all(c.passed for c in results.values()))
        reports.save(out, name, report)
        found[info.name] = report
    return found


def bugs(cfg: Config, out: Path, **kw) -> reports.BugsReport:
    """Every built-in step through every check -> ``reports/bugs.json``."""
    found = audit(cfg, out, list(steps.BUILTIN), list(checks.ALL), **kw)
    rows = {}
    for name, report in found.items():
        info = steps.BUILTIN[name]
        rows[name] = reports.BugRow(
            kind=info.kind, description=info.description, why=info.why,
            checks={c: r.passed for c, r in report.checks.items()},
            caught_by=[c for c, r in report.checks.items() if not r.passed],
            max_abs_err={c: r.max_abs_err for c, r in report.checks.items()})
    first = next(iter(found.values()))
    result = reports.BugsReport(
        world_size=first.world_size, backend=first.backend, device=first.device,
        dtype=first.dtype, checks=list(checks.ALL), steps=rows,
        every_bug_caught=all(r.caught_by for r in rows.values() if r.kind == "bug"),
        no_false_alarm=not any(r.caught_by for r in rows.values()
                               if r.kind == "correct"))
    reports.save(out, "bugs", result)
    return result


def _err(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def describe(report: reports.AuditReport) -> str:
    """The audit as a short table: one line per check."""
    lines = [f"Audit of {report.step} ({report.kind}): {report.world_size} ranks, "
             f"{report.backend} on {report.device}, {report.dtype}"]
    for name, c in report.checks.items():
        verdict = "PASS" if c.passed else "FAIL"
        if c.max_abs_err is None:
            detail = c.note
        elif c.passed:  # rounding decides the digits: the report keeps them
            detail = f"max |err| within atol {c.atol:g}, rtol {c.rtol:g}"
        else:
            detail = f"max |err| {_err(c.max_abs_err)} (atol {c.atol:g}, rtol {c.rtol:g})"
        lines.append(f"  {name:<24} {verdict}  {detail}")
    lines.append(f"  {'verdict':<24} {'PASS' if report.passed else 'FAIL'}")
    return "\n".join(lines)


def describe_bugs(report: reports.BugsReport) -> str:
    """The step x check matrix as text: '.' passes, 'X' fails."""
    short = {c: c.split("_")[0][:6] for c in report.checks}
    head = f"  {'step':<28} {'kind':<8} " + " ".join(f"{s:>6}" for s in short.values())
    lines = [f"Bug catalog: {report.world_size} ranks, {report.backend} on "
             f"{report.device}, {report.dtype}", head]
    for name, row in report.steps.items():
        marks = " ".join(f"{'.' if row.checks[c] else 'X':>6}" for c in report.checks)
        lines.append(f"  {name:<28} {row.kind:<8} {marks}")
    lines.append(f"  every bug caught: {report.every_bug_caught}; "
                 f"no false alarm: {report.no_false_alarm}")
    return "\n".join(lines)
