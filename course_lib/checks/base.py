"""What a check is, the result it returns, and the files a check run apart
leaves for its parent side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from course_lib.core import edition
from course_lib.core.typed import decode, read_json, shallow, write_json
from course_lib.rank.context import RankContext
from course_lib.run import diagnose
from course_lib.run.runfile import JobSpec

if TYPE_CHECKING:
    from course_lib.checks.auditor import Auditor


# The notes that checks/no_sync.py and checks/uneven.py write (the reports
# keep them in English), read in the learner's language by ``said``: chapter
# 05's tour and every audit table print them.
NOTES = (
    "not applicable: one rank or one microbatch",
    "ranks hold different gradients after the step: never synchronised",
    "ranks already agreed after microbatch {first} of {count}: DDP synchronised early "
    "(no_sync() must wrap forward and backward)",
    "synchronisation deferred to the last microbatch",
    "the step never finished: {failure}",
    "microbatches per rank: {counts}",
)


def said(note: str) -> str:
    """A check's note in the learner's language (``COURSE_EDITION``): a
    launch's failure that it quotes too (``diagnose.said``)."""
    return edition.reword(note, NOTES, diagnose.said)


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


A = TypeVar("A", bound="Artifact")
J = TypeVar("J", bound="JsonArtifact")


class Artifact:
    """A file that a check run apart leaves for its ``collect``, as a
    dataclass: ``save`` writes the dict of its fields (``torch.save``, so the
    chapters' ``torch.load(path)["grads"]`` still reads it), ``load`` reads it
    back through the one decoder, a missing or unknown key failing in one line."""

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(shallow(self), path)
        return path

    @classmethod
    def load(cls: type[A], path: Path) -> A:
        return decode(cls, torch.load(Path(path), weights_only=True), Path(path).name)


class JsonArtifact:
    """An artifact of plain values, as one JSON object."""

    def save(self, path: Path) -> Path:
        return write_json(self, path)

    @classmethod
    def load(cls: type[J], path: Path) -> J:
        return read_json(cls, path)


class CheckDefinitionError(TypeError):
    """A check defined without exactly one way to run: raised at import."""


@dataclass(frozen=True)
class Apart:
    """What a check that needs launches of its own runs, all in its module.

    ``spec`` and ``rank``: its job (the worker runs ``rank(ctx, spec)`` on
    every rank; ``course_lib.jobs.KINDS`` registers it). The parent side is
    exactly one of ``plan`` (cfg, specs, data_dir, step_timeout, objective)
    -> {world size: job}, the audit's own W riding in its first launch, or
    ``run`` (cfg, out, [(spec, name)], step_timeout, objective, **launch
    kw), which makes its launches itself, for steps that may fail theirs.
    Then ``collect(out, step, atol, rtol)`` reads one step's result."""

    spec: type[JobSpec]
    rank: Callable[[RankContext, Any], None]
    collect: Callable[[Path, str, float, float], CheckResult]
    plan: Callable[[Any, list[str], Path, float, str], dict[int, JobSpec]] | None = None
    run: Callable[..., None] | None = None

    def __post_init__(self) -> None:
        if (self.plan is None) == (self.run is None):
            raise CheckDefinitionError(
                f"{self.spec.__name__}: a check run apart needs exactly one of "
                "plan (jobs the audit launches) or run (launches of its own)")


@dataclass(frozen=True)
class Check:
    """A named check, with exactly one way to run: ``run`` runs inside the
    launch on every rank and returns the result on rank 0 (None
    elsewhere); ``apart`` runs in launches of its own. Defining a check
    with neither or both fails at import (``CheckDefinitionError``)."""

    name: str
    compares: str  # what it compares, in one line (README, quiz, --help)
    run: Callable[[Auditor], CheckResult | None] | None = None
    apart: Apart | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.apart is None):
            raise CheckDefinitionError(
                f"check {self.name!r}: give it exactly one way to run, run (inside "
                "the audit's launch) or apart (launches of its own)")

    @property
    def in_launch(self) -> bool:
        return self.run is not None

