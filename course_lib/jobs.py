"""Typed job specs and the run file: what the launcher asks the workers to do.

The launcher writes one ``RunFile`` as JSON; every worker reads it back with
the same classes. Each job is a dataclass; its JSON carries a ``job`` tag.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class ParityJob:
    """Both built-in modes on the parity window -> reports/parity.json."""


@dataclass(frozen=True)
class TrainJob:
    run_dir: str
    label: str
    stop: int
    resume: str | None = None


@dataclass(frozen=True)
class AblationsJob:
    """resume-check: the full resume and each ablation vs the continuous run."""

    resume_from: str
    resumed: str
    continuous: str


@dataclass(frozen=True)
class ExerciseJob:
    config: dict


@dataclass(frozen=True)
class SmokeJob:
    """One all_reduce, to check the environment."""


@dataclass(frozen=True)
class BenchJob:
    windows: int
    warmup: int
    repeats: int
    alone: bool = False  # also time each rank's share alone (window_efficiency.py)


@dataclass(frozen=True)
class AuditJob:
    """Every step through every in-launch check -> reports/audit-<step>.json."""

    steps: list[str]
    checks: list[str]
    trajectory_updates: int = 5
    step_timeout: float = 60.0


@dataclass(frozen=True)
class WorldSizeJob:
    """Each step's gradient on one fixed set of sequences, spread over this
    launch's ranks; the parent compares the world sizes."""

    steps: list[str]
    sequence_ids: list[int]
    batch_size: int
    step_timeout: float = 60.0


@dataclass(frozen=True)
class RecipesJob:
    """Each recipe on a balanced and a skewed window, and on an empty one
    -> reports/recipes.json (the parent adds the audit's checks)."""

    recipes: list[str]
    step_timeout: float = 60.0


JOB_TYPES = {
    "parity": ParityJob,
    "train": TrainJob,
    "ablations": AblationsJob,
    "exercise": ExerciseJob,
    "smoke": SmokeJob,
    "bench": BenchJob,
    "audit": AuditJob,
    "world_size": WorldSizeJob,
    "recipes": RecipesJob,
}
_TAGS = {cls: tag for tag, cls in JOB_TYPES.items()}

Job = (ParityJob | TrainJob | AblationsJob | ExerciseJob | SmokeJob | BenchJob
       | AuditJob | WorldSizeJob | RecipesJob)


def tag(job: Job) -> str:
    return _TAGS[type(job)]


def job_to_dict(job: Job) -> dict:
    return {"job": tag(job), **asdict(job)}


def job_from_dict(raw: dict) -> Job:
    cls = JOB_TYPES[raw["job"]]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in raw.items() if k in names})


def run_dir_of(job: Job) -> str | None:
    """Where a job writes, when it is not the launch's ``out``."""
    return getattr(job, "run_dir", None)


@dataclass(frozen=True)
class RunFile:
    config: dict
    backend: str
    device: str
    data_dir: str
    out: str
    jobs: list[Job]
    fault: dict | None = None
    collective_timeout: int = 120

    def write(self, path: Path) -> None:
        doc = asdict(self)
        doc["jobs"] = [job_to_dict(j) for j in self.jobs]
        Path(path).write_text(json.dumps(doc, indent=2))

    @classmethod
    def read(cls, path: Path) -> RunFile:
        doc = json.loads(Path(path).read_text())
        doc["jobs"] = [job_from_dict(j) for j in doc["jobs"]]
        return cls(**doc)


@dataclass(frozen=True)
class LaunchRecord:
    """One line of ``<out>/logs/launches.jsonl``: where a launch's time went.

    The launcher writes it after every launch, failed or not; the workers'
    own logs (``ready``, and ``start``/``done`` per job) split it further.
    """

    started: float  # wall clock, time.time()
    seconds: float
    world_size: int
    jobs: list[str]
    returncode: int
    replayed: bool = False  # copied from an identical launch (replay.py)

    def append_to(self, out: Path) -> None:
        path = Path(out) / "logs" / "launches.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(asdict(self)) + "\n")

    @classmethod
    def read_all(cls, out: Path) -> list[LaunchRecord]:
        path = Path(out) / "logs" / "launches.jsonl"
        if not path.exists():
            return []
        return [cls(**json.loads(line)) for line in path.read_text().splitlines() if line]
