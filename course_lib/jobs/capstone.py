"""The capstone's grader: a learner's training script, checked by its parts.

The script (``examples/capstone/train.py``) exposes ``step``, ``save``,
``load`` and ``evaluate``. Each property below is measured, never read from
the script:

- the step, by the audit job's own rank function (``jobs.audit.run_rank``,
  what ``course-lib audit --step FILE:step`` runs): its in-launch checks at
  W = 2, -> ``reports/audit-step.json`` beside the capstone's; and
  ``world_size_invariance``, by that check's own rank function, at W = 1, 2
  and 4 (the W = 2 job rides in the first launch);
- ``resume``: a run stopped after ``stop`` updates, saved with the learner's
  ``save``, then loaded with its ``load`` into a fresh state (seeded RNGs,
  initial weights, a new sampler: what a new process starts from) and run
  on must end with the parameters of a continuous run, bit for bit;
- ``evaluate_w2``, ``evaluate_w3``: the learner's evaluation at W = 2 and
  at W = 3, which does not divide the test split, against the single-process
  ``core.evaluate.evaluate`` of the same float64 model, on every rank.

One launch per world size grades every file given (the tests grade each
planted bug alone, in the same two launches); each file's reports go to its
own run directory -> ``<run>/reports/capstone.json``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from course_lib import checks
from course_lib.checks import CheckResult
from course_lib.checks import world_size as world_size_check
from course_lib.core import checkpoint, edition, paths
from course_lib.core.config import Config
from course_lib.core.edition import marks, tr
from course_lib.core.evaluate import RTOL
from course_lib.core.evaluate import evaluate as reference_evaluation
from course_lib.core.model import build_model
from course_lib.jobs import audit
from course_lib.jobs.kind import JobKind, launch
from course_lib.jobs.train import TrainState, fresh_state
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.launch import LaunchError
from course_lib.run.runfile import JobSpec
from course_lib.steps.registry import load_function

FUNCTIONS = ("step", "save", "load", "evaluate")
EVALUATION_WORLDS = (2, 3)  # the audit's W, and one that does not divide the test split
# Each property the grader measures, and what its failure means (never the fix).
# What a failed property says: English here, the learner's language in
# ``describe`` (the catalog has each; tests/test_edition.py reads them here).
PROPERTIES: dict[str, str] = {
    "parity": "the gradient differs from the single-process reference",
    "trajectory": "over 5 updates the gradient leaves the single-process reference",
    "accumulation_invariance": "the gradient changes with the number of microbatches",
    "world_size_invariance": "the gradient changes with the number of ranks",
    "permutation_invariance": "the gradient changes with the ranks the sequences go to",
    "no_sync": "the gradients are synced before the last microbatch, or differ after it",
    "resume": "stop, save, load and go on ends with other parameters than a continuous run",
    **{f"evaluate_w{w}": "at W={w} the evaluation differs from the single-process one"
       for w in EVALUATION_WORLDS},
}
# The step's properties: the audit's checks. world_size_invariance runs
# apart, one launch per W of its own; the others in the audit's launch.
STEP_CHECKS = [name for name in PROPERTIES if name in checks.CHECKS]
AUDITED = [name for name in STEP_CHECKS if checks.CHECKS[name].in_launch]
STEP_WORLDS = world_size_check.WORLD_SIZES


class LearnerError(RuntimeError):
    """A learner's function raised inside the job (or returned the wrong kind of thing)."""


@dataclass(frozen=True)
class CapstoneJob(JobSpec):
    """One file's ``parts``: its step audited (``step``), its step's
    gradients at this W for world_size_invariance (``world_size``), its
    save/load (``resume``), its evaluate (``evaluate``)
    -> <run_dir>/reports/capstone-w<W>."""

    TAG: ClassVar[str] = "capstone"
    file: str
    run_dir: str
    parts: list[str]
    stop: int = 2  # any state a resume loses shows in the very next update
    updates: int = 3

    def writes_to(self) -> str | None:
        return self.run_dir


@dataclass(frozen=True)
class CapstonePart(RunHeader, Report):
    NAME: ClassVar[str] = "capstone-part"  # saved as capstone-w<W>: see file_name
    results: dict[str, CheckResult]
    extra: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def file_name(world_size: int) -> str:
        return f"capstone-w{world_size}"


@dataclass(frozen=True)
class CapstoneReport(RunHeader, Report):
    NAME: ClassVar[str] = "capstone"
    file: str
    properties: dict[str, CheckResult]
    failed: list[str]
    passed: bool
    extra: dict = field(default_factory=dict, repr=False)


# --- in the launch ---------------------------------------------------------------


def call(name: str, func: Callable[..., Any], *args: Any) -> Any:
    """The learner's ``name``; whatever it raises becomes one LearnerError."""
    try:
        return func(*args)
    except Exception as exc:  # a learner's code: any error is theirs
        raise LearnerError(f"{name}() raised {type(exc).__name__}: {exc}") from exc


def train_for(ctx: RankContext, state: TrainState, step: Callable[..., Any],
              stop: int) -> None:
    """The course's loop (jobs.train) with the learner's step: one window, one SGD step."""
    while state.update < stop:
        micro = harness.microbatches(ctx, state.sampler.next_window(), ctx.rank)
        state.ddp.zero_grad(set_to_none=True)
        call("step", step, state.ddp, micro, ctx.world_size)
        state.optimizer.step()
        state.update += 1


def params(state: TrainState) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in state.model.state_dict().items()}


def resume(ctx: RankContext, spec: CapstoneJob, funcs: dict[str, Any]) -> CheckResult | None:
    continuous = fresh_state(ctx)
    train_for(ctx, continuous, funcs["step"], spec.updates)
    target = params(continuous)
    del continuous
    where = ctx.out / "capstone" / f"step-{spec.stop:04d}"
    if ctx.rank == 0:  # an earlier run's checkpoint must never be loaded
        shutil.rmtree(where, ignore_errors=True)
    dist.barrier()
    stopped = fresh_state(ctx)
    train_for(ctx, stopped, funcs["step"], spec.stop)
    call("save", funcs["save"], where, stopped.ddp, stopped.optimizer, stopped.sampler,
         spec.stop)
    del stopped
    dist.barrier()  # the resume comes later, in a new process
    resumed = fresh_state(ctx)
    done = call("load", funcs["load"], where, resumed.ddp, resumed.optimizer,
                resumed.sampler)
    resumed.update = spec.stop  # every rank runs the same updates, whatever load says
    train_for(ctx, resumed, funcs["step"], spec.updates)
    if ctx.rank != 0:
        return None
    cmp = checkpoint.compare_params(params(resumed), target)
    note = (f"stopped after {spec.stop} of {spec.updates} updates; "
            f"{cmp['compared_values']} parameters compared")
    counted = isinstance(done, int) and done == spec.stop
    if not counted:
        note += f"; load() returned {done!r:.40}, not the {spec.stop} updates done"
    return CheckResult(passed=cmp["identical"] and counted,
                       max_abs_err=cmp["max_abs_param_diff"], atol=0.0, rtol=0.0,
                       errors={"parameters": cmp["max_abs_param_diff"]}, note=note)


METRICS = ("loss_per_token", "token_accuracy")


def evaluation(ctx: RankContext, funcs: dict[str, Any]) -> CheckResult | None:
    model = build_model(ctx.cfg, torch.float64).to(ctx.device).eval()
    # The same initial model for every file of the launch: scored once, on rank 0,
    # before any learner's code holds it.
    ref = ctx.cached("capstone_evaluation", lambda: reference_evaluation(
        model, ctx.corpus, device=ctx.device)) if ctx.rank == 0 else {}
    got = call("evaluate", funcs["evaluate"], model, ctx.corpus, ctx.device)
    try:
        values = [float(got[k]) for k in METRICS]
    except (KeyError, TypeError, ValueError):
        raise LearnerError(f"evaluate() returned {type(got).__name__} {got!r:.80}, not a "
                           f"dict with {' and '.join(METRICS)}") from None
    everyone = [harness.gather_floats(v, ctx.device) for v in values]
    if ctx.rank != 0:
        return None
    errors = {k: max(abs(v - ref[k]) for v in ranks)
              for k, ranks in zip(METRICS, everyone, strict=True)}
    passed = all(abs(v - ref[k]) <= RTOL * abs(ref[k])
                 for k, ranks in zip(METRICS, everyone, strict=True) for v in ranks)
    return CheckResult(
        passed=passed, max_abs_err=max(errors.values()), atol=0.0, rtol=RTOL,
        errors=errors,
        note=f"{ref['sequences']} test sequences over {ctx.world_size} ranks, "
             f"{ref['tokens']} tokens; the initial model in float64")


def run_rank(ctx: RankContext, spec: CapstoneJob) -> None:
    funcs = {name: load_function(f"{spec.file}:{name}", "capstone check")
             for name in FUNCTIONS}
    found: dict[str, CheckResult | None] = {}
    label = f"capstone at W={ctx.world_size}"  # progress: one tick per part graded
    if "step" in spec.parts:  # the audit's own job, in this launch: audit-step.json
        audit.run_rank(ctx, audit.AuditJob([f"{spec.file}:step"], AUDITED), progress=None)
        ctx.progress(label, spec.parts.index("step") + 1, len(spec.parts))
    if "world_size" in spec.parts:  # the check's own job: <run_dir>/audit/world-size/
        job = world_size_check.WorldSizeJob(
            [f"{spec.file}:step"], world_size_check.sequences(ctx.cfg, ctx.corpus),
            ctx.cfg.train.batch_size_per_rank)
        world_size_check.run_rank(ctx, job, progress=None)
        ctx.progress(label, spec.parts.index("world_size") + 1, len(spec.parts))
    if "resume" in spec.parts:
        found["resume"] = resume(ctx, spec, funcs)
        ctx.progress(label, spec.parts.index("resume") + 1, len(spec.parts))
    if "evaluate" in spec.parts:
        found[f"evaluate_w{ctx.world_size}"] = evaluation(ctx, funcs)
        ctx.progress(label, spec.parts.index("evaluate") + 1, len(spec.parts))
    if ctx.rank == 0 and found:  # a launch of world-size jobs alone has none
        CapstonePart(**ctx.header().fields(),
                     results={k: v for k, v in found.items() if v is not None},
                     ).save(ctx.out, CapstonePart.file_name(ctx.world_size))


KIND = JobKind(CapstoneJob, run_rank)


# --- the parent side ---------------------------------------------------------------


class CapstoneInputError(ValueError):
    """A learner's file that cannot be graded: one line, exit 2."""


# The first line of a LaunchError whose rank failed in the learner's code.
_IN_STEP = re.compile(r"failed in \w+ \(step (?P<name>[^,)]+)(?:, check (?P<check>[^)]+))?\)"
                      r"(?: at step \d+)?: (?P<error>.*?)(?: \[[^\]]*\])?$")
_IN_JOB = re.compile(r"LearnerError: (?P<error>.*?)(?: \[[^\]]*\])?$")


def learner_failure(exc: LaunchError) -> str | None:
    """One line naming the learner's function that raised, or None when the
    launch failed for another reason."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    rank = [f"rank {exc.rank}"] if exc.rank is not None else []
    if m := _IN_STEP.search(first):
        where = rank + ([f"the audit's {m['check']} check"] if m["check"] else [])
        said = f" ({', '.join(where)})" if where else ""
        return f"{m['name']}() raised {m['error']}{said}"
    if m := _IN_JOB.search(first):
        return m["error"] + (f" ({rank[0]})" if rank else "")
    return None


def grade(cfg: Config, out: Path, runs: dict[Path, Path],
          **kw: Any) -> dict[Path, CapstoneReport]:
    """Grade each file of ``runs`` (run directory -> file): its step (at
    each of ``STEP_WORLDS`` for world_size_invariance), its resume, its
    evaluation at each of ``EVALUATION_WORLDS``, one launch per world size
    -> ``<run>/reports/capstone.json``."""
    if kw.get("backend", "auto") not in ("auto", "gloo") or \
            kw.get("device", "auto") not in ("auto", "cpu"):
        raise CapstoneInputError("capstone check: the script runs gloo on the CPU, and so "
                                 "does its grade (--backend gloo, --device cpu)")
    if kw.get("multinode"):
        raise CapstoneInputError("capstone check: runs on one node (--nnodes 1)")
    # The script's own placement, on any machine: its RNG states are the CPU's.
    kw = {**kw, "backend": "gloo", "device": "cpu"}
    runs = {Path(d).resolve(): Path(f).resolve() for d, f in runs.items()}
    for path in runs.values():  # StepSpecError (bad input) before any launch
        for name in FUNCTIONS:
            load_function(f"{path}:{name}", "capstone check")
    uneven = EVALUATION_WORLDS[-1]
    if cfg.data.test_sequences % uneven == 0:
        raise CapstoneInputError(
            f"capstone check: the config's {cfg.data.test_sequences} test sequences split "
            f"evenly over {uneven} ranks, so padded duplicates would go unseen")
    first = EVALUATION_WORLDS[0]  # the audit's W: its launch grades every part
    plan = {first: ["step", "world_size", "resume", "evaluate"]}
    for w in EVALUATION_WORLDS[1:]:
        plan.setdefault(w, []).append("evaluate")
    for w in STEP_WORLDS:
        if w != first:
            plan.setdefault(w, []).append("world_size")
    try:
        for w, parts in plan.items():
            launch(cfg, out, [CapstoneJob(str(f), str(d), parts) for d, f in runs.items()],
                   world_size=w, **kw)
    except LaunchError as exc:
        reason = learner_failure(exc)
        if reason is None:
            raise
        named = f"{next(iter(runs.values())).name}: " if len(runs) == 1 else ""
        raise CapstoneInputError(named + reason) from None
    atol, rtol = harness.tolerance(cfg)
    return {d: _report(d, f, atol, rtol) for d, f in runs.items()}


def _report(run_dir: Path, file: Path, atol: float, rtol: float) -> CapstoneReport:
    audited = audit.AuditReport.load(run_dir, audit.AuditReport.file_name("step"))
    found = dict(audited.checks)
    found[world_size_check.NAME] = world_size_check.collect(run_dir, "step", atol, rtol)
    for w in EVALUATION_WORLDS:
        found.update(CapstonePart.load(run_dir, CapstonePart.file_name(w)).results)
    properties = {name: found[name] for name in PROPERTIES}
    failed = [name for name, r in properties.items() if not r.passed]
    report = CapstoneReport(**RunHeader.of(audited).fields(), file=str(file),
                            properties=properties, failed=failed, passed=not failed)
    report.save(run_dir)
    return report


def check(cfg: Config, out: Path, file: Path, **kw: Any) -> CapstoneReport:
    """``course-lib capstone check FILE``: one file, its reports in ``out``."""
    (report,) = grade(cfg, out, {Path(out): Path(file)}, **kw).values()
    return report


def describe(report: CapstoneReport) -> str:
    """One line per property: PASS, or FAIL and what failed (in the learner's
    language: ``COURSE_EDITION``; the CLI's stays English)."""
    from course_lib.reports.numbers import short

    file = Path(report.file)
    shown = file.relative_to(paths.project_root()) if file.is_relative_to(
        paths.project_root()) else file
    others = [w for w in STEP_WORLDS if w != report.world_size]
    also = tr(" and ")
    lines = [tr("Capstone check of {file}: the step and resume at {ranks} ranks (the step "
                "also at {others}), the evaluation at {evaluation}; {backend} on {device}, "
                "{dtype} (the evaluation in float64)").format(
        file=shown, ranks=report.world_size, others=also.join(map(str, others)),
        evaluation=also.join(map(str, EVALUATION_WORLDS)), backend=report.backend,
        device=edition.device(report.device),
        dtype=report.dtype)]
    width = max(len(tr("PASS")), len(tr("FAIL")))  # what failed, in one column
    for name, r in report.properties.items():
        if r.passed:
            lines.append(f"  {name:<24} {tr('PASS')}")
            continue
        err = f" (max |err| {marks(short(r.max_abs_err))})" if r.max_abs_err else ""
        known = {k: v for k, v in r.errors.items() if v is not None}
        if name.startswith("evaluate") and known:  # which metric is off
            worst = max(known, key=lambda k: known[k])
            err = f" ({worst} |err| {marks(short(known[worst]))})"
        said = tr(PROPERTIES[name]).format(w=name.removeprefix("evaluate_w"))
        lines.append(f"  {name:<24} {tr('FAIL'):<{width}}  {said}{err}")
    lines.append(f"  {tr('verdict'):<24} {tr('PASS') if report.passed else tr('FAIL')}")
    return "\n".join(lines)
