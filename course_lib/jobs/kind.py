"""A job kind: its spec (what the launcher asks) and its rank function (what
every worker does). Each module of ``course_lib.jobs`` defines one or more
``KIND``s; the package collects them into the registry the worker uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.core import paths
from course_lib.core.config import Config
from course_lib.rank.context import RankContext
from course_lib.run import launch as run_launch
from course_lib.run.launch import LaunchResult
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class JobKind:
    spec: type[JobSpec]
    run: Callable[[RankContext, Any], None]  # (ctx, spec), on every rank
    # (ctx, spec) -> the spec to run, before the job's first log line
    prepare: Callable[[RankContext, Any], Any] | None = None

    @property
    def tag(self) -> str:
        return self.spec.TAG


class ReportElsewhere(Exception):
    """The job succeeded, but global rank 0 (which writes reports) ran on
    another node, with its own ``--out``."""


def launch(cfg: Config, out: Path, todo: list[JobSpec], **kw: Any) -> LaunchResult:
    """The parent side of every job: one torchrun launch of ``todo``."""
    data_dir = kw.pop("data_dir", None) or paths.data_dir()
    return run_launch.launch(cfg, out, todo, data_dir=data_dir, **kw)
