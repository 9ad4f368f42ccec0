"""The JSON reports of the contract, written atomically and loaded as objects."""

from __future__ import annotations

import json
import math
import os
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any


def report_path(out: Path, name: str) -> Path:
    return Path(out) / "reports" / f"{name}.json"


def location_path(out: Path) -> Path:
    """Written on nodes without global rank 0: where its reports went."""
    return Path(out) / "reports" / "elsewhere.json"


def _finite(obj: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write(out: Path, name: str, data: dict) -> Path:
    path = report_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class ModeResult:
    max_abs_err: float | None
    allclose: bool
    violations: int


@dataclass(frozen=True)
class ParityReport:
    world_size: int
    backend: str
    device: str
    dtype: str
    nccl_reference_path: bool
    torch: str
    compared_values: int
    atol: float
    rtol: float
    step: int
    local_tokens: list[int]
    global_tokens: int
    window_loss_per_token: float
    modes: dict[str, ModeResult]
    no_sync: dict[str, dict]  # mode -> {"ranks_agree_after_micro": [...]}
    grad_sample: dict[str, list]  # "index", "reference" and one list per mode
    passed: bool
    control: str
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def correct(self) -> ModeResult:
        return self.modes["global_token"]

    @property
    def control_mode(self) -> ModeResult:
        return self.modes["mean_of_means"]


@dataclass(frozen=True)
class ResumeReport:
    step: int
    compared_values: int
    max_abs_param_diff: float
    identical: bool
    ablations: dict[str, dict]
    extra: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class EvaluationReport:
    test_sequences: int
    test_tokens: int
    loss_per_token: float
    token_accuracy: float
    entropy_floor: float
    untrained: dict
    extra: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ExerciseReport:
    scenarios: list[dict]
    extra: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class CheckResult:
    """One named check of one step. ``errors`` holds the max |error| per
    update, layout or world size, whichever the check compares."""

    passed: bool
    max_abs_err: float | None
    atol: float
    rtol: float
    errors: dict[str, float | None] = field(default_factory=dict)
    agree_after_micro: list[bool] | None = None
    note: str = ""


@dataclass(frozen=True)
class AuditReport:
    step: str
    kind: str
    description: str
    world_size: int
    backend: str
    device: str
    dtype: str
    compared_values: int
    checks: dict[str, CheckResult]
    passed: bool


@dataclass(frozen=True)
class BugRow:
    kind: str
    description: str
    why: str
    checks: dict[str, bool]
    caught_by: list[str]
    max_abs_err: dict[str, float | None]


@dataclass(frozen=True)
class BugsReport:
    world_size: int
    backend: str
    device: str
    dtype: str
    checks: list[str]
    steps: dict[str, BugRow]
    every_bug_caught: bool
    no_false_alarm: bool


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
class RecipesReport:
    world_size: int
    backend: str
    device: str
    dtype: str
    checks: list[str]
    regimes: dict[str, RegimeInfo]
    recipes: dict[str, RecipeRow]
    every_prediction_holds: bool


TYPES = {
    "parity": ParityReport,
    "resume": ResumeReport,
    "evaluation": EvaluationReport,
    "exercise": ExerciseReport,
    "bugs": BugsReport,
    "recipes": RecipesReport,
}


def _type_of(name: str):
    if name.startswith("audit-"):
        return AuditReport
    return TYPES.get(name)


def build(cls, data: dict):
    """A report object from its JSON: nested reports too, unknown keys in ``extra``."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)} - {"extra"}
    required = {f.name for f in fields(cls) if f.default is MISSING
                and f.default_factory is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{cls.__name__} lacks field {missing[0]!r}")
    kwargs = {k: _value(hints[k], data[k]) for k in known if k in data}
    if "extra" in hints:
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
    return cls(**kwargs)


def _value(hint, value):
    if is_dataclass(hint) and isinstance(value, dict):
        return build(hint, value)
    if typing.get_origin(hint) is dict and isinstance(value, dict):
        inner = typing.get_args(hint)[1]
        if is_dataclass(inner):
            return {k: build(inner, v) for k, v in value.items()}
    return value


def from_dict(name: str, data: dict):
    return build(_type_of(name), data)


def save(out: Path, name: str, report) -> Path:
    """Write a report object: the class is the one definition of its schema."""
    data = asdict(report)
    extra = data.pop("extra", {})
    return write(out, name, {**data, **extra})


def load(out: Path, name: str):
    """Load ``<out>/reports/<name>.json`` as its typed report."""
    path = report_path(out, name)
    if not path.is_file():
        raise FileNotFoundError(f"no {name} report in {path.parent} yet")
    data = json.loads(path.read_text())
    return from_dict(name, data) if _type_of(name) else data


def load_logs(run_dir: Path, job: str = "train") -> dict[int, list[dict]]:
    """Per-rank JSONL logs of one job: {rank: [records]}."""
    logs = {}
    for path in sorted((Path(run_dir) / "logs").glob(f"{job}-rank*.jsonl")):
        rank = int(path.stem.rsplit("rank", 1)[1])
        logs[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return logs


def loss_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, window loss per token) from the per-rank train logs."""
    per_step: dict[int, list[dict]] = {}
    for records in load_logs(run_dir).values():
        for rec in records:
            if rec["event"] == "step":
                per_step.setdefault(rec["step"], []).append(rec)
    return [
        (step, sum(r["local_loss_sum"] for r in recs) / recs[0]["global_tokens"])
        for step, recs in sorted(per_step.items())
    ]
