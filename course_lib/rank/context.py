"""What one rank knows inside a torchrun job, and where it is in its jobs.

``RankContext`` is fixed for the launch: the config, this rank, the world,
the device and the corpus; a job that audits an objective runs on a copy
that carries it (``auditing``), and the harness and the steps read it
there. ``JobState`` is the one mutable part: which job, step function,
check and update the rank is in. The launcher's diagnosis
reads it back from the rank's log when something fails.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from course_lib.core import objectives
from course_lib.core.config import Config
from course_lib.core.data import Corpus, parity_window
from course_lib.reports.store import RunHeader
from course_lib.run import progress


@dataclass
class JobState:
    """Where a rank is: its job, the training update it is in, the step
    function and check under audit, and how long it waits for the others
    after running the step function. Its log lines call the update "step"."""

    out: Path
    job: str = "setup"
    update: int | None = None
    audited: str | None = None  # the step function's name
    check: str | None = None
    step_timeout: float = 60.0
    fences: int = 0

    def describe(self) -> str:
        """The job, plus the audited step and check when there is one."""
        parts = [f"step {self.audited}" if self.audited else "",
                 f"check {self.check}" if self.check else ""]
        inner = ", ".join(p for p in parts if p)
        return f"{self.job} ({inner})" if inner else self.job


class RankLog:
    """One JSON-lines file per job and rank, kept open for the launch."""

    def __init__(self) -> None:
        self._files: dict[Path, IO[str]] = {}

    def write(self, path: Path, record: dict[str, Any]) -> None:
        f = self._files.get(path)
        if f is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._files[path] = open(path, "a")  # noqa: SIM115 (kept open)
        f.write(json.dumps(record) + "\n")
        f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


@dataclass(frozen=True)
class RankContext:
    cfg: Config
    rank: int
    world_size: int
    backend: str
    device: torch.device
    corpus: Corpus
    state: JobState
    fault: dict = field(default_factory=dict)
    logs: RankLog = field(default_factory=RankLog)
    # What the job's references and the steps written for an objective use.
    objective: objectives.Objective = objectives.OBJECTIVES[objectives.DEFAULT]
    # Per context, never copied by dataclasses.replace: a context with
    # another config must not see this one's window.
    _cache: dict = field(init=False, default_factory=dict, repr=False, compare=False)

    @property
    def out(self) -> Path:
        return self.state.out

    def describe(self) -> str:
        return self.state.describe()

    def auditing(self, objective: objectives.Objective | str) -> RankContext:
        """This context for a job that audits ``objective`` (or its spec,
        as a job's spec carries it: parsed here, once per job). The copy
        shares the cache: the window is the same, and references are keyed
        by their objective."""
        found = objectives.parse(objective) if isinstance(objective, str) else objective
        copy = dataclasses.replace(self, objective=found)
        object.__setattr__(copy, "_cache", self._cache)
        return copy

    def parity_layout(self) -> list:
        """The plan's window at ``parity.step``, for this launch's world size."""
        if "parity_layout" not in self._cache:
            self._cache["parity_layout"] = parity_window(self.cfg, self.corpus,
                                                         self.world_size)
        return self._cache["parity_layout"]

    def cached(self, key: Hashable, make):
        """``make()`` once per context and key: rank 0's reference of the
        parity window, keyed by the objective it is the reference of."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def log_path(self, job: str | None = None) -> Path:
        return self.out / "logs" / f"{job or self.state.job}-rank{self.rank}.jsonl"

    def log(self, event: str, **fields: Any) -> None:
        s = self.state
        where = {"where": s.describe()} if s.audited or s.check else {}
        if s.audited:  # the launcher's LaunchError.audited, when this rank fails
            where["audited"] = s.audited
        self.logs.write(self.log_path(), {"event": event, "job": s.job, "rank": self.rank,
                                          "time": time.time(), **where, **fields})

    def progress(self, task: str, done: int, total: int) -> None:
        if self.rank == 0:
            progress.emit(task, done, total)

    def header(self) -> RunHeader:
        return RunHeader(
            world_size=self.world_size, backend=self.backend, device=self.device.type,
            dtype=self.cfg.train.dtype,
            nccl_reference_path=self.backend == "nccl" and self.world_size >= 2,
            torch=torch.__version__)
