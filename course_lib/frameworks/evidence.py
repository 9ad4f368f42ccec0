"""The frameworks' evidence: the row a framework's audit measures, and the
committed reports that runs of the real code left in ``data/``.

- ``FrameworkRow``: one configuration, audited (``jobs.frameworks`` writes it);
- ``Matrix``: ``data/frameworks-matrix.json``, those rows for every pinned
  version (``benchmarks/frameworks_matrix.py``);
- ``LossRuns``: ``data/trl-grpo-loss.json``, TRL GRPO's real loss function
  against its re-implementation (``benchmarks/trl_grpo_loss.py``,
  ``frameworks.trl_grpo``);
- ``RealCode`` and ``loss_code_text``: what they measured for each recipe.

Evidence, not job code: the chapters, the recipes table and the site read it
without launching anything.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_lib import frameworks
from course_lib.core.verdicts import Verdict
from course_lib.frameworks import candidates
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
    peak_rss_mb: float | None = None  # with timing: rank 0's peak memory
    factor: float | None = None  # the measured scale, when uniformly scaled
    matches: str | None = None  # the nearest candidate formula
    residual: float | None = None  # its relative residual
    relative_error: float | None = None  # rank 0's ||g - g*|| / ||g*||
    counts: WindowCounts | None = None
    ranks: list[RankResult] = field(default_factory=list)


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
    return (row.verdict != Verdict.NOT_RUN and row.framework == sel.framework
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


# --- the real loss: TRL GRPO's _compute_loss against the re-implementation ---------------


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
        return f"not run ({LossRuns.path().name} was never written)"
    found = runs.by_key()
    mine = [found.get(k) for k in recipe.loss_runs]
    missing = [k for k, r in zip(recipe.loss_runs, mine, strict=True) if r is None]
    if missing:
        return f"not run ({', '.join(missing)}: not in {LossRuns.path().name})"
    done = [r for r in mine if r is not None and r.status == "run"]
    if not done:
        return "not run (" + "; ".join(f"{r.key}: {r.reason}" for r in mine if r) + ")"
    bad = [r.key for r in done if not r.agrees]
    where = ", ".join(f"trl {r.version}" for r in done)
    worst = max(r.grad_max_abs_diff or 0.0 for r in done)
    if bad:
        return f"run (loss function, {where}): differs ({', '.join(bad)})"
    skipped = [r.key for r in mine if r is not None and r.status != "run"]
    tail = f"; not run: {', '.join(skipped)}" if skipped else ""
    return (f"run (loss function, {where}): loss and gradient allclose, "
            f"max |dg| {worst:.1e}{tail}")
