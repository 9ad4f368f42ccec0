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
collinearity; and with the reference of the objective the recipe claims
(``Recipe.claims``: the sequence-level mean, a constant normalizer...),
the same way. The RL recipes (``steps.rl_recipes``) weigh each token by a
synthetic advantage, so their token mean is sum A l / N, and the audit's
checks (which compare with the plain cross-entropy's token mean) skip them:
their two verdicts come from this job alone. ``world_size_invariance`` adds a
launch at each other W.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from course_lib import checks
from course_lib.core import edition
from course_lib.core.config import Config
from course_lib.core.data import Corpus, collate, parity_window
from course_lib.core.edition import marks, number, tr
from course_lib.core.model import build_model
from course_lib.core.normalize import EmptyWindowError
from course_lib.core.verdicts import TOLERANCE, EmptyOutcome, Verdict, classify, said
from course_lib.frameworks.evidence import LossRuns, Matrix, loss_code_text, real_code
from course_lib.jobs.audit import AuditInputError, audit, parse_checks, with_dtype
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run.runfile import JobSpec
from course_lib.steps.recipes import (
    RECIPES,
    NonFiniteLossError,
    Prediction,
    Recipe,
    describe_empty,
    empty_outcome,
    matches,
    predictions,
    window_shape,
)
from course_lib.steps.rl_recipes import claim_reference

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
    first_label_rows: int  # R: rows whose first label is not -100
    rows: int = 0  # the window's rows (sequences, completions), every rank's


@dataclass(frozen=True)
class RegimeResult:
    """One recipe on one window, against the reference gradient g*."""

    relative_error: float | None  # ||g - g*|| / ||g*||
    scale: float | None  # least squares <g, g*> / <g*, g*>
    residual: float | None  # ||g - scale g*|| / ||scale g*||: 0 when collinear
    verdict: Verdict  # exact | biased | uniformly scaled | non-finite
    factor: float | None  # the measured scale, when uniformly scaled
    predicted_verdict: Verdict
    predicted_factor: float | None
    matches: bool
    # The same, against the reference of the objective the recipe claims
    # (reports before the claims have none).
    claim: RegimeResult | None = None


@dataclass(frozen=True)
class EmptyWindowResult:
    """One recipe on a window with no supervised token (N = 0)."""

    outcome: EmptyOutcome
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
    verdict: Verdict  # measured on the skewed window: the general case
    factor: float | None
    relative_error: dict[str, float | None]  # per regime
    empty_window: EmptyWindowResult
    matches: bool  # every verdict, against the token mean and the claim, as predicted
    claims: str = "token_mean"  # a key of rl_recipes.CLAIMS
    claimed: str = ""  # what it claims, in words
    claim_verdict: str = ""  # measured on the skewed window, against the claim
    claim_factor: float | None = None
    policy: bool = False  # advantage-weighted (RL): its token mean is sum A l / N


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


# The windows' descriptions, as the report keeps them (English) and a figure
# rewords them (edition.reword).
BALANCED = ("the parity window's sequences, each cut to {length} tokens: every n equal, "
            "no padding")
SKEWED = "the parity window: short sequences on rank 0, long ones on rank 1"
DESCRIPTIONS = (BALANCED, SKEWED)


def regimes(ctx: RankContext) -> dict[str, Regime]:
    layout = ctx.parity_layout()
    length = common_length(ctx.corpus, layout)
    return {
        "balanced": Regime(BALANCED.format(length=length), layout,
                           cut_to(ctx.corpus, length)),
        "skewed": Regime(SKEWED, layout, ctx.corpus),
    }


def predicted_on_parity_window(cfg: Config, corpus: Corpus,
                               world_size: int | None = None) -> dict[str, Prediction]:
    """Each recipe's predicted verdict on the skewed (parity) window, no job run."""
    cfg = cfg.with_world_size(world_size)
    layout = parity_window(cfg, corpus, cfg.train.world_size)
    shape = window_shape([[collate(corpus, ids) for ids in rank] for rank in layout])
    return {name: predictions(r, shape)[0] for name, r in RECIPES.items()}


def _empty_window(ctx: RankContext, recipe: Recipe, layout: harness.Layout
                  ) -> tuple[EmptyOutcome, bool | None, str]:
    """Run the recipe on the window with every label ignored, on every rank."""
    step = recipe.step
    micro = [collate(ctx.corpus, ids, False, ctx.device) for ids in layout[ctx.rank]]
    ddp = harness.fresh_ddp(ctx, step)
    ddp.zero_grad(set_to_none=True)
    try:
        logged = step.func(ddp, micro, ctx.world_size)
    except (EmptyWindowError, NonFiniteLossError) as exc:
        # Every recipe decides from a global value: all ranks raise together.
        return EmptyOutcome.RAISES, None, type(exc).__name__
    harness.fence(ctx, ctx.state.step_timeout)
    grads = harness.gather_grads(ddp.module)
    finite = None if logged is None else math.isfinite(logged)
    return empty_outcome(False, grads), finite, ""


def _regime_result(measured, predicted, claim: RegimeResult | None = None) -> RegimeResult:
    return RegimeResult(
        relative_error=measured.relative_error, scale=measured.scale,
        residual=measured.residual, verdict=measured.verdict, factor=measured.factor,
        predicted_verdict=predicted.verdict, predicted_factor=predicted.factor,
        matches=matches(measured, predicted), claim=claim)


# What a reference is of: (claim, advantage-weighted, generation).
RefKey = tuple[str, bool, int]
PLAIN_TOKEN_MEAN: RefKey = ("token_mean", False, 1)


def _reference_keys(recipe: Recipe) -> tuple[RefKey, RefKey]:
    """(the token mean's, the claim's) for this recipe."""
    return ((("token_mean", recipe.policy, recipe.generation)),
            (recipe.claims, recipe.policy, recipe.generation))


def _reference(ctx: RankContext, regime: Regime, key: RefKey):
    """Rank 0: one process, every rank's microbatches, the claimed objective."""
    model = build_model(ctx.cfg).to(ctx.device).eval()
    everything = [harness.microbatches(ctx, regime.layout, r, regime.corpus)
                  for r in range(ctx.world_size)]
    claim, policy, generation = key
    return claim_reference(model, everything, claim, policy, generation).double().cpu()


def run_rank(ctx: RankContext, spec: RecipesJob) -> None:
    """Worker side: every recipe on the balanced, skewed and empty windows."""
    ctx.state.step_timeout = spec.step_timeout
    found = regimes(ctx)
    root = ctx.rank == 0
    shapes = {name: window_shape([harness.microbatches(ctx, r.layout, rank, r.corpus)
                                  for rank in range(ctx.world_size)])
              for name, r in found.items()}
    refs: dict[tuple[str, RefKey], Any] = {}
    if root:
        refs = {(name, PLAIN_TOKEN_MEAN): (
            harness.parity_reference(ctx) if name == "skewed" else
            harness.window_reference(ctx, r.layout, corpus=r.corpus)).grad
            for name, r in found.items()}
        for name, r in found.items():
            for recipe in (RECIPES[n] for n in spec.recipes):
                for key in _reference_keys(recipe):
                    if (name, key) not in refs:
                        refs[name, key] = _reference(ctx, r, key)
    tol = TOLERANCE.exact[ctx.cfg.train.dtype]
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
                token_key, claim_key = _reference_keys(recipe)
                token, claimed = predictions(recipe, shapes[regime])
                claim = _regime_result(classify(out.grads[0], refs[regime, claim_key], tol),
                                       claimed)
                results[regime] = _regime_result(
                    classify(out.grads[0], refs[regime, token_key], tol), token, claim)
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
            first_label_rows=shapes[name].first_label_rows,
            rows=shapes[name].rows) for name, r in found.items()}
        RecipesReport(
            **ctx.header().fields(), checks=[], regimes=info, recipes=rows,
            every_prediction_holds=all(row.matches for row in rows.values())).save(ctx.out)


KIND = JobKind(RecipesJob, run_rank)


def _row(recipe: Recipe, results: dict, outcome: EmptyOutcome, finite: bool | None,
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
        matches=empty.matches and all(v.matches and v.claim is not None and v.claim.matches
                                      for v in results.values()),
        claims=recipe.claims, claimed=recipe.claimed,
        claim_verdict=skewed.claim.verdict if skewed.claim else "",
        claim_factor=skewed.claim.factor if skewed.claim else None, policy=recipe.policy)


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
    job = RecipesJob(names, step_timeout)
    plain = [n for n in names if not RECIPES[n].policy]  # the audit's checks: no RL
    found = {}
    if plain:
        found = audit(cfg, out, plain, check_names, dtype=dtype, step_timeout=step_timeout,
                      extra_jobs=(job,), **kw)
    else:
        launch(with_dtype(cfg, dtype), out, [job], **kw)
    measured = RecipesReport.load(out)
    rows = {name: dataclasses.replace(row, checks={c: r.passed for c, r in
                                                   found[name].checks.items()}
                                      if name in found else {})
            for name, row in measured.recipes.items()}
    report = dataclasses.replace(measured, checks=check_names, recipes=rows)
    report.save(out)
    return report


def error_text(x: float | None, tol: float) -> str:
    """Three significant digits; below the exactness bound, the bound itself
    (float32 rounding differs from CPU to CPU, the bound does not). In the
    edition's marks."""
    if x is None:
        return tr("n/a")
    return marks(f"<{tol:.0e}" if x <= tol else f"{x:.3g}")


def verdict_text(verdict: Verdict, factor: float | None) -> str:
    """A verdict in the learner's language, a uniform scale with its factor."""
    return said(verdict, factor)


def empty_text(row: RecipeRow) -> str:
    """What the empty window does, in the learner's language."""
    e = row.empty_window
    return tr(describe_empty(e.outcome, e.loss_finite))


def _regimes() -> tuple[str, ...]:
    """The windows' names (``REGIMES``) in the learner's language."""
    shown = {"balanced": tr("balanced"), "skewed": tr("skewed")}
    return tuple(shown[r] for r in REGIMES)


def describe(report: RecipesReport, names: Sequence[str] | None = None) -> str:
    """The verdict table: one line per recipe (every one, or ``names``),
    digits that hold on any CPU; each verdict against the token mean, then
    against the recipe's claim (in the learner's language: ``COURSE_EDITION``)."""
    tol = TOLERANCE.of(report.dtype)
    names = list(names or report.recipes)
    rows = [report.recipes[name] for name in names]
    balanced, skewed = _regimes()
    mine = [verdicts(row, False) for row in rows]
    theirs = [verdicts(row, True) for row in rows]
    empty = [empty_text(row) for row in rows]
    # each column as wide as this edition's words (English: as it was)
    token = max([31, len(tr("token mean")), *map(len, mine)])
    claim = max([31, len(tr("its claim")), *map(len, theirs)])
    windows = max([8, len(balanced), len(skewed)])
    blank = max([20, len(tr("empty window")), *map(len, empty)])
    lines = [tr("Production recipes: {ranks} ranks, {backend} on {device}, {dtype}; verdicts "
                "balanced | skewed, and the relative gradient error per window, against "
                "the token mean (RL: sum A l / N)").format(
        ranks=report.world_size, backend=report.backend,
        device=edition.device(report.device), dtype=report.dtype),
             f"{tr('recipe'):<26} {tr('token mean'):<{token}} {balanced:>{windows}} "
             f"{skewed:>{windows}}  {tr('claims'):<16} {tr('its claim'):<{claim}} "
             f"{tr('empty window'):<{blank}} {tr('fails')}"]
    for name, row, against, own, nothing in zip(names, rows, mine, theirs, empty,
                                                strict=True):
        failed = ",".join(c for c, ok in row.checks.items() if not ok) or "-"
        if row.policy:
            failed = tr("n/a (RL)")
        mark = "" if row.matches else tr("  << not as predicted")
        errors = [error_text(row.relative_error[r], tol) for r in REGIMES]
        lines.append(
            f"{name:<26} {against:<{token}} {errors[0]:>{windows}} {errors[1]:>{windows}}  "
            f"{row.claims:<16} {own:<{claim}} {nothing:<{blank}} {failed}{mark}")
    lines.append(tr("every prediction holds: {holds}").format(
        holds=all(r.matches for r in rows)))
    return "\n".join(lines)


def describe_verdicts(report: RecipesReport, names: Sequence[str] | None = None) -> str:
    """The verdict table, short (chapter 08): per recipe, its verdict against
    the token mean on each window, the skewed window's relative error, and
    what the empty window does (in the learner's language). ``describe`` has
    every column."""
    tol = TOLERANCE.of(report.dtype)
    names = list(names or report.recipes)
    shown = {name: [verdict_text(report.recipes[name].regimes[r].verdict,
                                 report.recipes[name].regimes[r].factor) for r in REGIMES]
             for name in names}
    head = (tr("recipe"), *_regimes(), tr("skewed error"))
    # each column as wide as this edition's words (English: as it was)
    widths = [max([20, len(head[0])]),
              *(max([15, len(head[i + 1]), *(len(v[i]) for v in shown.values())])
                for i in range(len(REGIMES))),
              max([12, len(head[-1])])]
    lines = [" ".join(h.ljust(w) for h, w in zip(head[:-1], widths, strict=False))
             + f" {head[-1]:>{widths[-1]}}  {tr('empty window')}"]
    for name in names:
        row = report.recipes[name]
        error = error_text(row.relative_error[REGIMES[-1]], tol)
        lines.append(" ".join(c.ljust(w) for c, w in zip([name, *shown[name]], widths,
                                                           strict=False))
                     + f" {error:>{widths[-1]}}  {empty_text(row)}")
    lines.append(tr("every prediction holds: {holds}").format(
        holds=report.every_prediction_holds))
    return "\n".join(lines)


def mismatches(report: RecipesReport) -> list[str]:
    """'name (what)' for each row not as predicted: against the token mean,
    against its claim, or on the empty window."""
    found = []
    for name, row in report.recipes.items():
        what = [label for label, ok in (
            ("token mean", all(r.matches for r in row.regimes.values())),
            ("its claim", all(r.claim is not None and r.claim.matches
                              for r in row.regimes.values())),
            ("empty window", row.empty_window.matches)) if not ok]
        if what or not row.matches:
            found.append(f"{name} ({', '.join(what) or 'row'})")
    return found


def verdicts(row: RecipeRow, claim: bool) -> str:
    """'balanced | skewed' verdicts, against the token mean or the claim."""
    found = [row.regimes[r].claim if claim else row.regimes[r] for r in REGIMES]
    return " | ".join("-" if f is None else verdict_text(f.verdict, f.factor) for f in found)


# 08: a token's weight in the gradient once the ranks are combined, for the
# objectives that the counts of the token's microbatch (r, m) decide: the
# formula, and the weight times N (the token mean's 1 / N is 1).
def _microbatch_means(w: RegimeInfo, r: int, m: int) -> float:
    n = w.microbatch_tokens[r][m]
    steps = len(w.microbatch_tokens[r])
    return w.global_tokens / (len(w.microbatch_tokens) * steps * n) if n else 0.0


def _microbatch_sums(w: RegimeInfo, r: int, m: int) -> float:
    n = w.microbatch_tokens[r][m]
    return w.global_tokens / (len(w.microbatch_tokens) * n) if n else 0.0


WEIGHTS: dict[str, tuple[str, Any]] = {
    "token_mean": ("1 / N", lambda w, r, m: 1.0),
    "microbatch_means": ("1 / (W·M·n_r,m)", _microbatch_means),
    "microbatch_sums": ("1 / (W·n_r,m)", _microbatch_sums),
    "rank_means": ("1 / (W·N_r)",
                   lambda w, r, m: w.global_tokens / (len(w.local_tokens) * w.local_tokens[r])),
    "shift_scaled": ("1 / (N + R)",
                     lambda w, r, m: w.global_tokens / (w.global_tokens + w.first_label_rows)),
    "world_scaled": ("1 / (W·N)", lambda w, r, m: 1.0 / len(w.local_tokens)),
}


@dataclass(frozen=True)
class TokenWeight:
    formula: str  # what a token weighs, in S_r,m, n_r,m, N_r, N, R, W, M (plain text)
    times_n: list[list[float]]  # [rank][micro]: that weight times N, on one window


def token_weights(info: RegimeInfo, names: Sequence[str]) -> dict[str, TokenWeight]:
    """08: each recipe's token weight on the window ``info``, from its
    objective (a recipe whose objective one microbatch's counts do not
    decide, a sequence-level one, is left out)."""
    found = {}
    for name in names:
        objective = RECIPES[name].objective
        if objective in WEIGHTS:
            formula, weight = WEIGHTS[objective]
            found[name] = TokenWeight(formula, [
                [weight(info, r, m) for m in range(len(rank))]
                for r, rank in enumerate(info.microbatch_tokens)])
    return found


def describe_weights(info: RegimeInfo, weights: dict[str, TokenWeight]) -> str:
    """The recipes' token weights as a table: the formula, then the weight
    times N of a token of each microbatch of ``info`` (1: the token mean's),
    in the learner's language and marks."""
    cells = [(r, m, n) for r, rank in enumerate(info.microbatch_tokens)
             for m, n in enumerate(rank)]
    width = max(len(w.formula) for w in weights.values()) + 2
    recipe = max(20, len(tr("recipe")))
    head = "".join(f"{f'r{r},m{m}':>9}" for r, m, _ in cells)
    counts = "".join(f"{'n=' + number(n, 'd'):>9}" for _, _, n in cells)
    lines = [f"{'':<{recipe}} {'':<{width}}" + tr("a token's weight x N, by microbatch"),
             f"{tr('recipe'):<{recipe}} {tr('a token weighs'):<{width}}{head.lstrip()}",
             f"{'':<{recipe}} {'':<{width}}{counts.lstrip()}"]
    for name, w in weights.items():
        values = "".join(f"{marks(f'{x:.3f}'):>9}" for rank in w.times_n for x in rank)
        lines.append(f"{name:<{recipe}} {w.formula:<{width}}{values.lstrip()}")
    return "\n".join(lines)


def describe_recipes(names: Sequence[str] | None = None) -> str:
    """The recipes (every one, or ``names``) as the sources describe them:
    backprop, reduction, claim."""
    shown = [(name, tr(RECIPES[name].backprop), tr(RECIPES[name].reduction))
             for name in names or RECIPES]
    # the columns as wide as their longest entry in the edition (French is longer)
    back = max([38, *(len(b) + 1 for _, b, _ in shown)])
    red = max([34, *(len(r) + 1 for _, _, r in shown)])
    lines = [f"  {tr('recipe'):<26} {tr('per-microbatch backprop'):<{back}} "
             f"{tr('reduction'):<{red}} {tr('claims')}"]
    lines += [f"  {name:<26} {b:<{back}} {r:<{red}} {_claim(RECIPES[name].claims)}"
              for name, b, r in shown]
    return "\n".join(lines)


def _claim(key: str) -> str:
    """A recipe's claimed objective: its key in English (the docs' tables
    print the code's names), its name in French."""
    return {"token_mean": tr("token_mean"), "microbatch_means": tr("microbatch_means"),
            "sequence_means": tr("sequence_means"), "sequence_sums": tr("sequence_sums"),
            "constant": tr("constant")}[key]


def describe_real(matrix: Matrix | None = None, names: Sequence[str] | None = None) -> str:
    """Each recipe's real-code line (every one, or ``names``), from the
    committed version matrix (in the learner's language)."""
    matrix = matrix or Matrix.committed()
    runs = LossRuns.committed()
    lines = [tr("Real code, from {matrix} ({date}, torch {torch}) and {runs}:").format(
        matrix=Matrix.path().name, date=matrix.date, torch=matrix.torch,
        runs=LossRuns.path().name)]
    for name in names or RECIPES:
        recipe = RECIPES[name]
        text = (loss_code_text(recipe, runs) if recipe.loss_runs
                else real_code(recipe, matrix).text())
        lines.append(f"  {name:<26} {text}")
    return "\n".join(lines)


