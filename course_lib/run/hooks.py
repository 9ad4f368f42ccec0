"""The launch path's one door to the test machinery (``course_lib._testing``).

Nothing in the package imports ``_testing``: the functions below reach it
only when a test session switches it on, through the environment.

- ``COURSE_REPLAY=DIR`` (``make test``): a launch that both test lanes run
  with the same inputs happens once, and is replayed for the other;
- ``COURSE_FAULT=JSON`` (the fault tests): a worker crashes, hangs, fills
  the disk or prints noise at a given step (``_testing/faults.py``).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from course_lib.run.launch import LaunchResult
    from course_lib.run.progress import Progress
    from course_lib.run.runfile import RunFile

REPLAY_ENV = "COURSE_REPLAY"
FAULT_ENV = "COURSE_FAULT"


def _testing(module: str) -> Any:
    return importlib.import_module(f"course_lib._testing.{module}")


def fault_from_env() -> dict | None:
    """e.g. {"kind": "crash", "rank": 1, "step": 3} or {"delay": 0.05}."""
    raw = os.environ.get(FAULT_ENV)
    return json.loads(raw) if raw else None


def around_launch(run: RunFile, launch_now: Callable[[Progress | None], LaunchResult],
                  progress: Progress | None, shareable: bool) -> LaunchResult:
    """``launch_now(progress)``, or its replay inside a test session."""
    if not (shareable and os.environ.get(REPLAY_ENV)):
        return launch_now(progress)
    return _testing("replay").launch(run, launch_now, progress)


def before_update(fault: dict, rank: int, step: int) -> None:
    """In the workers, before each training update: the injected fault, if any."""
    if fault:
        _testing("faults").before_update(fault, rank, step)
