"""The run file: what the launcher asks the workers of one launch to do.

The launcher writes one ``RunFile`` as JSON; every worker reads it back with
the same classes. Each job's spec is a frozen dataclass deriving from
``JobSpec``, with a ``TAG`` that its JSON carries as ``"job"``. The spec
classes live beside their jobs (``course_lib.jobs``); the worker hands their
registry to ``RunFile.read``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar


class JobSpec:
    """Base of every job spec: a frozen dataclass with a ``TAG``."""

    TAG: ClassVar[str]

    def writes_to(self) -> str | None:
        """Where the job writes, when it is not the launch's ``out``."""
        return None


def tag(job: JobSpec) -> str:
    return job.TAG


def job_to_dict(job: JobSpec) -> dict[str, Any]:
    return {"job": job.TAG, **asdict(job)}  # type: ignore[call-overload]


def job_from_dict(raw: dict[str, Any], specs: Mapping[str, type[JobSpec]]) -> JobSpec:
    cls = specs[raw["job"]]
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True)
class RunFile:
    config: dict
    backend: str
    device: str
    data_dir: str
    out: str
    jobs: list[JobSpec]
    fault: dict | None = None
    collective_timeout: int = 120

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["jobs"] = [job_to_dict(j) for j in self.jobs]
        return doc

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def read(cls, path: Path, specs: Mapping[str, type[JobSpec]]) -> RunFile:
        doc = json.loads(Path(path).read_text())
        doc["jobs"] = [job_from_dict(j, specs) for j in doc["jobs"]]
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
    # How torchrun started: "forkserver" or "plain"; "replayed" when a test
    # session copied an identical launch instead (tests/machinery/replay.py).
    path: str = "forkserver"

    @property
    def replayed(self) -> bool:
        return self.path == "replayed"

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
