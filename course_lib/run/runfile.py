"""The run file: what the launcher asks the workers of one launch to do.

The launcher writes one ``RunFile`` as JSON; every worker reads it back with
the same classes, through the one decoder (``core.typed``), nested
dataclasses included: a key a spec does not know, or one it lacks, fails in
one line. Each job's spec is a frozen dataclass deriving from ``JobSpec``,
with a ``TAG`` that its JSON carries as ``"job"``. The spec classes live
beside their jobs (``course_lib.jobs``); the worker hands their registry to
``RunFile.read``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from course_lib.core.typed import DecodeError, decode, encode


class JobSpec:
    """Base of every job spec: a frozen dataclass with a ``TAG``."""

    TAG: ClassVar[str]

    def writes_to(self) -> str | None:
        """Where the job writes, when it is not the launch's ``out``."""
        return None

    def preload(self) -> tuple[str, ...]:
        """Modules its workers will import that the agent server may import
        once, before it forks them (a framework's: seconds per worker)."""
        return ()


def tag(job: JobSpec) -> str:
    return job.TAG


def job_to_dict(job: JobSpec) -> dict[str, Any]:
    return {"job": job.TAG, **encode(job)}


def job_from_dict(raw: Mapping[str, Any], specs: Mapping[str, type[JobSpec]],
                  where: str = "job") -> JobSpec:
    """The spec of ``raw``'s ``"job"`` tag, every field decoded by its type."""
    if not isinstance(raw, Mapping) or "job" not in raw:
        raise DecodeError(f"{where}: a job lacks its tag 'job'")
    cls = specs.get(raw["job"])
    if cls is None or not dataclasses.is_dataclass(cls):
        raise DecodeError(f"{where}: unknown job {raw['job']!r}")
    return decode(cls, {k: v for k, v in raw.items() if k != "job"}, where)


@dataclass(frozen=True)
class RunFile:
    config: dict[str, Any]  # the resolved Config, as core.config.from_dict reads it
    backend: str
    device: str
    data_dir: str
    out: str
    jobs: list[JobSpec]
    fault: dict[str, Any] | None = None
    collective_timeout: int = 120

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = encode(dataclasses.replace(self, jobs=[]))
        doc["jobs"] = [job_to_dict(j) for j in self.jobs]
        return doc

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], specs: Mapping[str, type[JobSpec]]
                  ) -> RunFile:
        jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
        if not isinstance(jobs, list):
            raise DecodeError("jobs: a run file holds a list of jobs")
        found = [job_from_dict(j, specs, f"jobs[{i}]") for i, j in enumerate(jobs)]
        return decode(cls, {**doc, "jobs": found})

    @classmethod
    def read(cls, path: Path, specs: Mapping[str, type[JobSpec]]) -> RunFile:
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()), specs)
        except DecodeError as exc:
            raise DecodeError(f"{path.name}: {exc}") from None


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
        return [decode(cls, json.loads(line), f"{path.name}[{i}]")
                for i, line in enumerate(path.read_text().splitlines()) if line]
