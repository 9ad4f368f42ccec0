"""What a check is, and the result it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_lib.checks.auditor import Auditor


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
class Check:
    """A named check. ``run`` runs inside the launch on every rank and returns
    the result on rank 0 (None elsewhere); a check without ``run`` needs
    launches of its own, which its job plans (``course_lib.jobs``)."""

    name: str
    compares: str  # what it compares, in one line (README, quiz, --help)
    run: Callable[[Auditor], CheckResult | None] | None = None

    @property
    def in_launch(self) -> bool:
        return self.run is not None

