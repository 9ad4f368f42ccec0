"""Audit the frameworks' recipes: which production setups train the objective
they claim. ``course-lib recipes`` -> ``reports/recipes.json``.

One torchrun launch runs every recipe (see ``recipes``) through the audit's
in-launch checks and then through three windows:

- balanced: the parity window's sequences, each cut to one common length,
  so every microbatch holds the same n and nothing is padded;
- skewed: the parity window itself (short sequences on rank 0, long ones
  on rank 1), where a mean of means and a token mean part ways;
- empty: the parity window with every label ignored (N = 0).

On the first two, each gradient g is compared with the reference g* of the
token mean: relative error ||g - g*|| / ||g*||, least-squares scale and
collinearity. ``world_size_invariance`` adds a launch at each other W.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_lib import checks, frameworks
from course_lib.core.config import Config
from course_lib.core.data import Corpus, collate, parity_window
from course_lib.core.normalize import EmptyWindowError
from course_lib.frameworks.candidates import CANDIDATES
from course_lib.jobs.audit import AuditInputError, audit, parse_checks
from course_lib.jobs.frameworks import Matrix, MatrixRow
from course_lib.jobs.kind import JobKind
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec
from course_lib.steps.recipes import (
    EXACT_TOL,
    RAISES,
    RECIPES,
    SCALED,
    NonFiniteLossError,
    Prediction,
    RealRun,
    Recipe,
    classify,
    describe_empty,
    empty_outcome,
    matches,
    predict,
    window_shape,
)

REGIMES = ("balanced", "skewed")


@dataclass(frozen=True)
class RecipesJob(JobSpec):
    """Each recipe on a balanced and a skewed window, and on an empty one
    -> reports/recipes.json (the parent adds the audit's checks)."""

    TAG: ClassVar[str] = "recipes"
    recipes: list[str]
    step_timeout: float = 60.0


@dataclass(frozen=True)
class RegimeInfo:
    """One window the recipes are measured on, and its counts."""

    description: str
    local_tokens: list[int]
    microbatch_tokens: list[list[int]]
    global_tokens: int
    first_label_rows: int  # R: rows whose first label is supervised


@dataclass(frozen=True)
class RegimeResult:
    """One recipe on one window, against the reference gradient g*."""

    relative_error: float | None  # ||g - g*|| / ||g*||
    scale: float | None  # least squares <g, g*> / <g*, g*>
    residual: float | None  # ||g - scale g*|| / ||g*||: 0 when collinear
    verdict: str  # exact | biased | uniformly scaled | non-finite
    factor: float | None  # the measured scale, when uniformly scaled
    predicted_verdict: str
    predicted_factor: float | None
    matches: bool


@dataclass(frozen=True)
class EmptyWindowResult:
    """One recipe on a window with no supervised token (N = 0)."""

    outcome: str  # raises | zero step | NaN
    loss_finite: bool | None  # None when the step raised or returns no loss
    error: str
    predicted: str
    matches: bool


@dataclass(frozen=True)
class RecipeRow:
    label: str
    framework: str
    versions: str
    citation: str
    backprop: str
    reduction: str
    objective: str
    summary: str
    checks: dict[str, bool]
    regimes: dict[str, RegimeResult]
    verdict: str  # measured on the skewed window: the general case
    factor: float | None
    relative_error: dict[str, float | None]  # per regime
    empty_window: EmptyWindowResult
    matches: bool


@dataclass(frozen=True)
class RecipesReport(RunHeader, Report):
    NAME: ClassVar[str] = "recipes"
    checks: list[str]
    regimes: dict[str, RegimeInfo]
    recipes: dict[str, RecipeRow]
    every_prediction_holds: bool
    extra: dict = field(default_factory=dict, repr=False)



@dataclass(frozen=True)
class Regime:
    description: str
    layout: harness.Layout
    corpus: Corpus


def common_length(corpus: Corpus, layout: harness.Layout) -> int:
    """The shortest sequence of the window: every sequence can be cut to it."""
    return min(len(corpus.sequences[i]) for rank in layout for mb in rank for i in mb)


def cut_to(corpus: Corpus, length: int) -> Corpus:
    """A scratch corpus: every sequence cut to ``length`` tokens (same ids)."""
    return Corpus(tuple(s[:length] for s in corpus.sequences), corpus.splits,
                  corpus.source, "")


def regimes(ctx: RankContext) -> dict[str, Regime]:
    layout = ctx.parity_layout()
    length = common_length(ctx.corpus, layout)
    return {
        "balanced": Regime(f"the parity window's sequences, each cut to {length} tokens: "
                           "every n equal, no padding", layout, cut_to(ctx.corpus, length)),
        "skewed": Regime("the parity window: short sequences on rank 0, long ones on "
                         "rank 1", layout, ctx.corpus),
    }


def predicted_on_parity_window(cfg: Config, corpus: Corpus,
                               world_size: int | None = None) -> dict[str, Prediction]:
    """Each recipe's predicted verdict on the skewed (parity) window, no job run."""
    world = world_size or cfg.train.world_size
    layout = parity_window(cfg, corpus, world)
    shape = window_shape([[collate(corpus, ids) for ids in rank] for rank in layout])
    return {name: predict(r.objective, shape) for name, r in RECIPES.items()}


def _empty_window(ctx: RankContext, recipe: Recipe, layout: harness.Layout):
    """Run the recipe on the window with every label ignored, on every rank."""
    step = recipe.step
    micro = [collate(ctx.corpus, ids, False, ctx.device) for ids in layout[ctx.rank]]
    ddp = harness.fresh_ddp(ctx, step)
    ddp.zero_grad(set_to_none=True)
    try:
        logged = step.func(ddp, micro, ctx.world_size)
    except (EmptyWindowError, NonFiniteLossError) as exc:
        # Every recipe decides from a global value: all ranks raise together.
        return RAISES, None, type(exc).__name__
    harness.fence(ctx, ctx.state.step_timeout)
    grads = harness.gather_grads(ddp.module)
    finite = None if logged is None else math.isfinite(logged)
    return empty_outcome(False, grads), finite, ""


def _regime_result(measured, predicted) -> RegimeResult:
    return RegimeResult(
        relative_error=measured.relative_error, scale=measured.scale,
        residual=measured.residual, verdict=measured.verdict, factor=measured.factor,
        predicted_verdict=predicted.verdict, predicted_factor=predicted.factor,
        matches=matches(measured, predicted))


def run_rank(ctx: RankContext, spec: RecipesJob) -> None:
    """Worker side: every recipe on the balanced, skewed and empty windows."""
    ctx.state.step_timeout = spec.step_timeout
    found = regimes(ctx)
    root = ctx.rank == 0
    shapes = {name: window_shape([harness.microbatches(ctx, r.layout, rank, r.corpus)
                                  for rank in range(ctx.world_size)])
              for name, r in found.items()}
    refs = {}
    if root:
        refs = {name: (harness.parity_reference(ctx) if name == "skewed" else
                       harness.window_reference(ctx, r.layout, corpus=r.corpus))
                for name, r in found.items()}
    tol = EXACT_TOL[ctx.cfg.train.dtype]
    rows = {}
    for i, name in enumerate(spec.recipes):
        recipe = RECIPES[name]
        ctx.state.audited = name
        results = {}
        for regime, r in found.items():
            ctx.state.check = f"{regime} window"
            micro = harness.microbatches(ctx, r.layout, ctx.rank, r.corpus)
            step = recipe.step
            out = harness.run_step(ctx, step, harness.fresh_ddp(ctx, step), micro)
            if root:
                results[regime] = _regime_result(
                    classify(out.grads[0], refs[regime].grad, tol),
                    predict(recipe.objective, shapes[regime]))
        ctx.state.check = "empty window"
        outcome, finite, error = _empty_window(ctx, recipe, ctx.parity_layout())
        ctx.state.check = None
        if root:
            rows[name] = _row(recipe, results, outcome, finite, error)
        ctx.progress("recipes", i + 1, len(spec.recipes))
    ctx.state.audited = None
    if root:
        info = {name: RegimeInfo(
            description=r.description, local_tokens=shapes[name].local_tokens,
            microbatch_tokens=shapes[name].microbatch_tokens,
            global_tokens=shapes[name].tokens,
            first_label_rows=shapes[name].first_label_rows) for name, r in found.items()}
        RecipesReport(
            **ctx.header().fields(), checks=[], regimes=info, recipes=rows,
            every_prediction_holds=all(row.matches for row in rows.values())).save(ctx.out)


KIND = JobKind(RecipesJob, run_rank)


def _row(recipe: Recipe, results: dict, outcome: str, finite: bool | None,
         error: str) -> RecipeRow:
    predicted = recipe.predicted_empty
    empty = EmptyWindowResult(
        outcome=outcome, loss_finite=finite, error=error, predicted=predicted,
        matches=describe_empty(outcome, finite) == predicted)
    skewed = results["skewed"]
    return RecipeRow(
        label=recipe.label, framework=recipe.framework, versions=recipe.versions,
        citation=recipe.citation, backprop=recipe.backprop, reduction=recipe.reduction,
        objective=recipe.effective, summary=recipe.verdict, checks={}, regimes=results,
        verdict=skewed.verdict, factor=skewed.factor,
        relative_error={k: v.relative_error for k, v in results.items()},
        empty_window=empty,
        matches=empty.matches and all(v.matches for v in results.values()))


# --- the parent side ---------------------------------------------------------------------


def run(cfg: Config, out: Path, check_names: list[str] | str | None = None, *,
        names: list[str] | None = None, dtype: str | None = None,
        step_timeout: float = 60.0, **kw: Any) -> RecipesReport:
    """Every recipe (or ``names``) through the checks and the three windows:
    one launch at the chosen W, plus one per other W for world_size_invariance."""
    if isinstance(check_names, str):  # "parity,no_sync", or "all"
        check_names = None if check_names == "all" else parse_checks(check_names)
    names = list(names or RECIPES)
    check_names = list(check_names or checks.NAMES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise AuditInputError(f"--recipes: unknown recipe {unknown[0]!r} "
                                    f"(choose from {', '.join(RECIPES)})")
    found = audit(cfg, out, names, check_names, dtype=dtype, step_timeout=step_timeout,
                  extra_jobs=(RecipesJob(names, step_timeout),), **kw)
    measured = RecipesReport.load(out)
    rows = {name: dataclasses.replace(row, checks={c: r.passed for c, r in
                                                   found[name].checks.items()})
            for name, row in measured.recipes.items()}
    report = dataclasses.replace(measured, checks=check_names, recipes=rows)
    report.save(out)
    return report


def error_text(x: float | None, tol: float) -> str:
    """Three significant digits; below the exactness bound, the bound itself
    (float32 rounding differs from CPU to CPU, the bound does not)."""
    if x is None:
        return "n/a"
    return f"<{tol:.0e}" if x <= tol else f"{x:.3g}"


def verdict_text(verdict: str, factor: float | None) -> str:
    return f"scaled x{factor:.4g}" if verdict == SCALED else verdict


def empty_text(row: RecipeRow) -> str:
    e = row.empty_window
    return describe_empty(e.outcome, e.loss_finite)


def describe(report: RecipesReport) -> str:
    """The verdict table: one line per recipe, digits that hold on any CPU."""
    tol = EXACT_TOL.get(report.dtype, EXACT_TOL["float32"])
    lines = [f"Production recipes: {report.world_size} ranks, {report.backend} on "
             f"{report.device}, {report.dtype}; relative gradient error per window",
             f"{'recipe':<26} {'verdict (skewed)':<17} {'balanced':>8} {'skewed':>8}  "
             f"{'empty window':<20} {'fails'}"]
    for name, row in report.recipes.items():
        failed = ",".join(c for c, ok in row.checks.items() if not ok) or "-"
        mark = "" if row.matches else "  << not as predicted"
        errors = [error_text(row.relative_error[r], tol) for r in REGIMES]
        lines.append(
            f"{name:<26} {verdict_text(row.verdict, row.factor):<17} "
            f"{errors[0]:>8} {errors[1]:>8}  {empty_text(row):<20} {failed}{mark}")
    lines.append(f"every prediction holds: {report.every_prediction_holds}")
    return "\n".join(lines)


def describe_recipes() -> str:
    """The recipes as the sources describe them: backprop, reduction, claim."""
    lines = [f"  {'recipe':<26} {'per-microbatch backprop':<38} {'reduction'}"]
    for name, r in RECIPES.items():
        lines.append(f"  {name:<26} {r.backprop:<38} {r.reduction}")
    return "\n".join(lines)


# --- the real code: what the version matrix measured for each recipe -----------------------


@dataclass(frozen=True)
class RealCode:
    """The runs of the real code behind one recipe (rows of the committed
    version matrix), and whether each trained the recipe's objective."""

    recipe: str
    formula: str | None  # the candidate formula the recipe's objective is
    rows: list[MatrixRow]
    unrun: str  # why the real code was not run, when no row is
    tried: str = ""  # the matrix entry that tried it, and what it found

    @property
    def disagreeing(self) -> list[MatrixRow]:
        return [r for r in self.rows if r.matches != self.formula]

    @property
    def agrees(self) -> bool:
        return bool(self.rows) and not self.disagreeing

    def text(self) -> str:
        """One line: which versions and model classes were run, and the outcome."""
        if not self.rows:
            tried = f"; tried: {self.tried}" if self.tried else ""
            return f"not run ({self.unrun}{tried})"
        ran = "; ".join(_versions(self.rows, fw) for fw in dict.fromkeys(
            r.framework for r in self.rows))
        if self.agrees:
            return f"run: {ran}: {self.formula}, as predicted"
        odd = ", ".join(f"{r.entry} {r.model} {r.matches}" for r in self.disagreeing)
        return f"run: {ran}: {len(self.disagreeing)} of {len(self.rows)} differ ({odd})"


def _package(sel: RealRun) -> str:
    return sel.package or frameworks.adapter(sel.framework).package


def selects(sel: RealRun, row: MatrixRow) -> bool:
    """Whether a measured matrix row ran the real code this selector names."""
    version = row.stack.get(_package(sel)) or row.version
    return (row.verdict != "not run" and row.framework == sel.framework
            and version is not None and Version(version) in SpecifierSet(sel.versions)
            and (not sel.models or row.model in sel.models)
            and all(row.flags.get(k) == v for k, v in sel.flags))


def _versions(rows: Sequence[MatrixRow], framework: str) -> str:
    mine = [r for r in rows if r.framework == framework]
    versions = sorted({r.version or "?" for r in mine}, key=Version)
    models = sorted({r.model for r in mine})
    label = frameworks.adapter(framework).package
    return f"{label} {', '.join(versions)} on {', '.join(models)}"


def real_code(recipe: Recipe, matrix: Matrix) -> RealCode:
    formula = next((c.name for c in CANDIDATES if c.objective == recipe.objective), None)
    rows = [r for r in matrix.measured if any(selects(sel, r) for sel in recipe.real)]
    entry = matrix.entries.get(recipe.tried) if recipe.tried else None
    tried = f"{recipe.tried}, {entry.reason}" if entry else ""
    return RealCode(recipe.name, formula, rows, recipe.unrun, tried)


def describe_real(matrix: Matrix | None = None) -> str:
    """Each recipe's real-code line, from the committed version matrix."""
    matrix = matrix or Matrix.committed()
    lines = [f"Real code, from {Matrix.path().name} ({matrix.date}, torch {matrix.torch}):"]
    for name, recipe in RECIPES.items():
        lines.append(f"  {name:<26} {real_code(recipe, matrix).text()}")
    return "\n".join(lines)
