"""The JSON reports of the contract, written atomically and loaded as objects."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def report_path(out: Path, name: str) -> Path:
    return Path(out) / "reports" / f"{name}.json"


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
    compared_values: int
    atol: float
    rtol: float
    local_tokens: list[int]
    global_tokens: int
    modes: dict[str, ModeResult]
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


TYPES = {
    "parity": ParityReport,
    "resume": ResumeReport,
    "evaluation": EvaluationReport,
    "exercise": ExerciseReport,
}


def from_dict(name: str, data: dict):
    cls = TYPES[name]
    known = {f.name for f in fields(cls)} - {"extra"}
    missing = sorted(known - set(data))
    if missing:
        raise ValueError(f"{name}.json lacks field {missing[0]!r}")
    kwargs = {k: data[k] for k in known}
    if cls is ParityReport:
        kwargs["modes"] = {m: ModeResult(**v) for m, v in data["modes"].items()}
    kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
    return cls(**kwargs)


def load(out: Path, name: str):
    """Load ``<out>/reports/<name>.json`` as its typed report."""
    path = report_path(out, name)
    if not path.is_file():
        raise FileNotFoundError(f"no {name} report in {path.parent} yet")
    data = json.loads(path.read_text())
    return from_dict(name, data) if name in TYPES else data


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
