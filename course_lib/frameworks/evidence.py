"""The frameworks' evidence: the row a framework's audit measures, and the
committed reports that runs of the real code left in ``data/``.

- ``FrameworkRow``: one configuration, audited (``jobs.frameworks`` writes it);
- ``Matrix``: ``data/frameworks-matrix.json``, those rows for every pinned
  version (``benchmarks/frameworks_matrix.py``);
- ``Configurations``: ``data/frameworks-configurations.json``, every
  ``--with`` configuration on the installed versions, and its table
  (``Configurations.lines``: the chapter's and the site's);
- ``LossRuns``: ``data/trl-grpo-loss.json``, TRL GRPO's real loss function
  against its re-implementation (``benchmarks/trl_grpo_loss.py``,
  ``frameworks.trl_grpo``);
- ``RealCode`` and ``loss_code_text``: what they measured for each recipe;
- ``TrainerRow``: one loss type of TRL's real GRPOTrainer under torchrun
  (``data/trl-grpo-trainer.json``, ``jobs.trl_grpo.TrainerData``).

Evidence, not job code: the chapters, the recipes table and the site read it
without launching anything.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_lib import frameworks
from course_lib.core.edition import marks, reword, tr
from course_lib.core.verdicts import TOLERANCE, Verdict, said
from course_lib.frameworks import candidates, options
from course_lib.frameworks.candidates import CANDIDATES
from course_lib.reports.store import Committed
from course_lib.steps.recipes import RealRun, Recipe

# --- one configuration, audited --------------------------------------------------------


@dataclass(frozen=True)
class RankResult:
    rank: int
    relative_error: float | None
    scale: float | None


@dataclass(frozen=True)
class WindowCounts:
    N: int  # noqa: N815 (the course's notation)
    N_r: list[int]  # noqa: N815
    R: int  # noqa: N815


@dataclass(frozen=True)
class FrameworkRow:
    framework: str
    version: str | None
    model: str
    flags: dict[str, Any]
    # exact, uniformly scaled, biased, ranks disagree, failed or not run
    verdict: Verdict
    reason: str = ""  # why it was not run, or the error it failed with
    uses: dict[str, Any] = field(default_factory=dict)  # --with: name -> state
    # Not run because the learner's own function (--trainer) was bad input:
    # it returned no Trainer, or raised (the CLI's exit 2).
    bad_input: bool = False
    precision: str = "float32"  # the framework's compute precision (its tolerance)
    stack: dict[str, str] = field(default_factory=dict)  # the frameworks installed
    notes: list[str] = field(default_factory=list)  # e.g. a learner's clipping
    seconds: dict[str, float] = field(default_factory=dict)  # with timing: alone, audited
    peak_rss_mb: float | None = None  # with timing: the largest rank's peak memory (MiB)
    factor: float | None = None  # the measured scale, when uniformly scaled
    matches: str | None = None  # the nearest candidate formula
    residual: float | None = None  # its relative residual
    relative_error: float | None = None  # rank 0's ||g - g*|| / ||g*||
    # k when the gradients were compared through a sketch (frameworks/sketch.py):
    # the errors above are then its estimates; None: compared whole
    sketch: int | None = None
    counts: WindowCounts | None = None
    ranks: list[RankResult] = field(default_factory=list)

    @property
    def said(self) -> str:
        """The verdict as every table writes it, in the learner's language: a
        uniform scale with its factor (``verdicts.said``)."""
        return said(self.verdict, self.factor)


# Rows without a gradient: refused or missing here, or raised while training.
UNMEASURED = (Verdict.NOT_RUN, Verdict.FAILED)


# --- the version matrix: data/frameworks-matrix.json ------------------------------------


@dataclass(frozen=True)
class MatrixRow(FrameworkRow):
    entry: str = ""  # the matrix entry (one pinned venv) that measured it


@dataclass(frozen=True)
class MatrixEntry:
    pins: list[str]  # what pip installed in the entry's venv
    frameworks: str  # the adapters audited there; "" for a framework only tried
    status: str  # "measured" or "not run"
    reason: str = ""  # why not run: pip's reason, an import error, no adapter
    rows: list[FrameworkRow] = field(default_factory=list)


@dataclass(frozen=True)
class Matrix(Committed):
    """The committed version matrix: ``benchmarks/frameworks_matrix.py``
    writes it, the recipes table and the chapters read it."""

    NAME: ClassVar[str] = "frameworks-matrix"
    date: str
    torch: str
    python: str
    command: str  # what made it
    models: list[str]
    entries: dict[str, MatrixEntry]
    rows: list[MatrixRow]  # every entry's rows, each with its entry's name
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Matrix:
        """As stored, with the formula names of today (``candidates.RENAMED``):
        the matrix keeps the names it was measured with."""
        data = copy.deepcopy(data)
        rows = [*data.get("rows", []),
                *(r for e in data.get("entries", {}).values() for r in e.get("rows", []))]
        for row in rows:
            row["matches"] = candidates.RENAMED.get(row.get("matches"), row.get("matches"))
        return super().from_dict(data)

    @property
    def measured(self) -> list[MatrixRow]:
        return [r for r in self.rows if r.verdict not in UNMEASURED]

    def describe(self, framework: str = "hf") -> str:
        """One framework's measured rows as a table (version, model, the flag
        ``average_tokens_across_devices``, the formula matched); consecutive
        versions with the same rows share one line of versions. For another
        framework than ``hf``, a column gives the transformers it ran on, and
        the flag column its configuration ("default": none set)."""
        hf = framework == "hf"
        by_version: dict[str, list[tuple[str, str, str, str]]] = {}
        for r in self.measured:
            if r.framework != framework:
                continue
            seen = r.matches or ""
            if r.verdict == Verdict.RANKS_DISAGREE:
                seen = f"ranks disagree ({seen})"
            if hf:
                flag = str(r.flags.get("average_tokens_across_devices", "-"))
            else:
                flag = ",".join(f"{k}={v}" for k, v in r.flags.items()) or "default"
            stack = "" if hf else r.stack.get("transformers", "-")
            by_version.setdefault(r.version or "-", []).append(
                (stack, r.model, flag, seen))
        groups: list[tuple[list[str], list[tuple[str, str, str, str]]]] = []
        for version, found in by_version.items():
            if groups and groups[-1][1] == found:
                groups[-1][0].append(version)
            else:
                groups.append(([version], found))
        flags = max([6, *(len(f[2]) for _, found in groups for f in found)])
        stacks = "" if hf else f"{'transformers':<13}"
        lines = [f"{'versions':<16} {stacks}{'model':<6} {'flag':<{flags}} "
                 "gradient matches"]
        for versions, found in groups:
            shown = "-".join(dict.fromkeys([versions[0], versions[-1]]))
            for stack, model, flag, seen in found:
                tf = "" if hf else f"{stack:<13}"
                lines.append(f"{shown:<16} {tf}{model:<6} {flag:<{flags}} {seen}")
                shown = ""
        return "\n".join(lines)


@dataclass(frozen=True)
class Configurations(Matrix):
    """``data/frameworks-configurations.json``: every ``--with`` configuration
    (``frameworks/options.py``) on the frameworks installed here, each state
    on every model and flag set, measured or not run with its reason
    (``benchmarks/frameworks_matrix.py --configurations``). The version
    matrix's schema: an entry per framework, one launch each."""

    NAME: ClassVar[str] = "frameworks-configurations"

    def lines(self, live: Sequence[FrameworkRow] = (), framework: str | None = None
              ) -> list[ConfigurationLine]:
        """The table: each configuration's state on each flag set, a line for
        the models whose rows say the same. A row measured ``live`` (a
        learner's ``audit_frameworks(..., uses=...)``) stands in for the
        committed row of the same framework, model, state and flags."""
        found: dict[tuple[str, str, str, str], tuple[FrameworkRow, bool]] = {
            _key(r): (r, False) for r in self.rows}
        found.update({_key(r): (r, True) for r in live if r.uses})
        groups: dict[tuple[str, str, str], list[tuple[str, tuple[str, str, str]]]] = {}
        for row, is_live in found.values():
            if framework is not None and row.framework != framework:
                continue
            configuration, state = _state_of(row)
            measured = tr("live {version}") if is_live else tr("committed {version}")
            said = (row.said, measured.format(version=row.version or "-"), finding(row))
            groups.setdefault((row.framework, configuration, state), []).append(
                (row.model, said))
        out = []
        for (fw, configuration, state), rows in groups.items():
            merged: dict[tuple[str, str, str], list[str]] = {}
            for model, said in rows:
                merged.setdefault(said, []).append(model)
            out += [ConfigurationLine(fw, configuration, state, ", ".join(models), *said)
                    for said, models in merged.items()]
        return out


# What the configurations' table shows, in its order: the face's text and
# the site's page are this one table.
CONFIGURATION_HEAD = ("framework", "configuration", "flag state", "models", "verdict",
                      "measured", "finding")


@dataclass(frozen=True)
class ConfigurationLine:
    """One line of the configurations' table (``CONFIGURATION_HEAD``)."""

    framework: str
    configuration: str  # the --with option(s)
    state: str  # the option's state, then the framework's own flags
    models: str  # those whose rows say the same
    verdict: str
    measured: str  # "live" or "committed", and the framework's version
    finding: str  # the formula the gradient is, or why there is none: one line

    @property
    def cells(self) -> tuple[str, ...]:
        return (self.framework, self.configuration, self.state, self.models, self.verdict,
                self.measured, self.finding)


def _key(row: FrameworkRow) -> tuple[str, str, str, str]:
    return (row.framework, row.model, json.dumps(row.uses, sort_keys=True, default=str),
            json.dumps(row.flags, sort_keys=True, default=str))


def _state_of(row: FrameworkRow) -> tuple[str, str]:
    """(the --with option(s), their state then the framework's own flags:
    those the options did not set), in a few words."""
    set_by: set[str] = set()
    for name, state in row.uses.items():
        if name in options.OPTIONS:
            set_by |= set(options.OPTIONS[name].flags(state))
    states = [",".join(f"{k}={v}" for k, v in state.items()) if isinstance(state, dict)
              else str(state) for state in row.uses.values()]
    own = [f"{k}={v}" for k, v in row.flags.items() if k not in set_by] or ["defaults"]
    if row.precision != "float32":  # what the framework's defaults computed in
        own.append(row.precision)
    return "+".join(row.uses) or "-", "; ".join([*states, *own])


def finding(row: FrameworkRow) -> str:
    """One line: the formula a measured row's gradient is (the nearest, with
    its residual, when none is within the tolerance), or why the row has no
    gradient. Never a pass for a row that was not run."""
    if row.verdict in UNMEASURED:
        return row.reason or tr("no reason recorded")
    text = tr(row.matches) if row.matches else tr("no formula")
    if row.verdict == Verdict.RANKS_DISAGREE:
        text = tr("the ranks hold different gradients (rank 0: {formula})").format(
            formula=text)
    if row.residual is not None and row.residual > TOLERANCE.of(row.precision):
        text += nearest(row.residual)
    return text


def nearest(residual: float) -> str:
    """What a formula matched only as the nearest says: its residual."""
    return tr(" (nearest; residual {residual})").format(residual=marks(f"{residual:.1e}"))


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
            tried = tr("; tried: {tried}").format(tried=self.tried) if self.tried else ""
            return tr("not run ({why})").format(why=self.unrun + tried)
        ran = tr("; ").join(_versions(self.rows, fw) for fw in dict.fromkeys(
            r.framework for r in self.rows))
        if self.agrees:
            return tr("run: {ran}: {formula}, as predicted").format(
                ran=ran, formula=tr(self.formula) if self.formula else self.formula)
        odd = ", ".join(f"{r.entry} {r.model} {tr(r.matches) if r.matches else r.matches}"
                        for r in self.disagreeing)
        return tr("run: {ran}: {differ} of {rows} differ ({which})").format(
            ran=ran, differ=len(self.disagreeing), rows=len(self.rows), which=odd)


def _package(sel: RealRun) -> str:
    return sel.package or frameworks.adapter(sel.framework).package


def selects(sel: RealRun, row: MatrixRow) -> bool:
    """Whether a measured matrix row ran the real code this selector names."""
    version = row.stack.get(_package(sel)) or row.version
    return (row.verdict != Verdict.NOT_RUN and row.framework == sel.framework
            and version is not None and Version(version) in SpecifierSet(sel.versions)
            and (not sel.models or row.model in sel.models)
            and all(row.flags.get(k) == v for k, v in sel.flags))


def _versions(rows: Sequence[MatrixRow], framework: str) -> str:
    mine = [r for r in rows if r.framework == framework]
    versions = sorted({r.version or "?" for r in mine}, key=Version)
    models = sorted({r.model for r in mine})
    label = frameworks.adapter(framework).package
    return tr("{package} {versions} on {models}").format(
        package=label, versions=", ".join(versions), models=", ".join(models))


def real_code(recipe: Recipe, matrix: Matrix) -> RealCode:
    formula = next((c.name for c in CANDIDATES if c.objective == recipe.objective), None)
    rows = [r for r in matrix.measured if any(selects(sel, r) for sel in recipe.real)]
    entry = matrix.entries.get(recipe.tried) if recipe.tried else None
    tried = f"{recipe.tried}, {entry.reason}" if entry else ""
    return RealCode(recipe.name, formula, rows, recipe.unrun, tried)


# --- the real loss: TRL GRPO's _compute_loss against the re-implementation ---------------

# Why a version's loss type was not run, as benchmarks/trl_grpo_loss.py writes it.
NO_LOSS_TYPE = "trl {version} has no loss_type '{loss_type}'"


@dataclass(frozen=True)
class LossRun:
    """One TRL version's real ``GRPOTrainer._compute_loss`` for one loss type,
    on one process, against ``rl_recipes.trl_grpo_loss`` on the same tensors
    (``benchmarks/trl_grpo_loss.py``): the loss value on TRL's own per-token
    terms, and the gradient against the recipe's A-weighted cross-entropy."""

    key: str  # entry/loss_type[/case]: what Recipe.loss_runs names
    entry: str  # the venv's name, e.g. trl-1.16.0
    loss_type: str
    accumulation: int  # GA, as current_gradient_accumulation_steps
    steps_per_generation: int
    world_size: int  # accelerator.num_processes, as the loss saw it
    status: str  # "run" or "not run"
    reason: str = ""  # why not run
    version: str | None = None  # trl's, as imported
    entry_point: str = ""  # what was called, and what was applied after it
    loss_trl: float | None = None
    loss_mine: float | None = None
    loss_allclose: bool | None = None
    grad_max_abs_diff: float | None = None
    grad_allclose: bool | None = None

    @property
    def agrees(self) -> bool:
        return self.status == "run" and bool(self.loss_allclose) and bool(self.grad_allclose)

    @property
    def said_reason(self) -> str:
        """``reason`` in the learner's language (chapter 09 prints it)."""
        return reword(self.reason, (NO_LOSS_TYPE,))


@dataclass(frozen=True)
class LossRuns(Committed):
    """The committed comparison, ``data/trl-grpo-loss.json``: written by
    ``benchmarks/trl_grpo_loss.py``, read by the recipes' real-code lines."""

    NAME: ClassVar[str] = "trl-grpo-loss"
    date: str
    torch: str
    command: str
    dtype: str
    runs: list[LossRun]
    extra: dict = field(default_factory=dict, repr=False)

    def by_key(self) -> dict[str, LossRun]:
        return {r.key: r for r in self.runs}


def loss_code_text(recipe: Recipe, runs: LossRuns | None) -> str:
    """The real-code line of a recipe whose loss function was run (TRL GRPO)."""
    if runs is None:
        return tr("not run ({file} was never written)").format(file=LossRuns.path().name)
    found = runs.by_key()
    mine = [found.get(k) for k in recipe.loss_runs]
    missing = [k for k, r in zip(recipe.loss_runs, mine, strict=True) if r is None]
    if missing:
        return tr("not run ({keys}: not in {file})").format(
            keys=", ".join(missing), file=LossRuns.path().name)
    done = [r for r in mine if r is not None and r.status == "run"]
    if not done:  # the reasons are the runs' own
        return tr("not run ({why})").format(
            why="; ".join(f"{r.key}: {r.reason}" for r in mine if r))
    bad = [r.key for r in done if not r.agrees]
    where = ", ".join(f"trl {r.version}" for r in done)
    worst = max(r.grad_max_abs_diff or 0.0 for r in done)
    if bad:
        return tr("run (loss function, {where}): differs ({keys})").format(
            where=where, keys=", ".join(bad))
    skipped = [r.key for r in mine if r is not None and r.status != "run"]
    tail = tr("; not run: {keys}").format(keys=", ".join(skipped)) if skipped else ""
    return tr("run (loss function, {where}): loss and gradient allclose, max |dg| "
              "{worst}{tail}").format(where=where, worst=marks(f"{worst:.1e}"), tail=tail)


# --- the real RL trainers under torchrun: data/trl-grpo-trainer.json -------------------------


@dataclass(frozen=True)
class TrainerRow(FrameworkRow):
    """One loss type of TRL's real GRPOTrainer (or its RLOOTrainer), one
    optimizer step on every rank under torchrun (``jobs.trl_grpo``,
    ``frameworks.trl_grpo_trainer``). ``verdict`` is against the global
    token mean of every rank's completion tokens, ``claim_verdict`` against
    the objective the loss type claims; each is torch.allclose per component
    on every rank (else uniformly scaled or biased)."""

    trainer: str = ""  # "grpo" or "rloo"
    loss_type: str = ""  # GRPOConfig.loss_type; "" for RLOO
    claim: str | None = None  # a key of rl_recipes.CLAIMS; None: none stated
    claim_source: str = ""  # where the claim is written
    claim_verdict: Verdict | None = None
    max_err: float | None = None  # max over ranks, components |g - g*| / max |g*|
    claim_max_err: float | None = None  # the same against the claim
    trains: list[str] = field(default_factory=list)  # every objective it is allclose to
    recipe: Verdict | None = None  # against rl_recipes.trl_grpo_loss; None: no recipe
    tokens: list[list[int]] = field(default_factory=list)  # [rank][microbatch] tokens
    lengths: list[list[list[int]]] = field(default_factory=list)  # [rank][micro][completion]
    advantages: list[list[list[float]]] = field(default_factory=list)  # the same shape
