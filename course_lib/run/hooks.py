"""The launch path's two doors to test machinery that lives outside the package.

Nothing in the package knows the test machinery (``tests/machinery/``): each
door imports the module an environment variable names, and a session that
names none (every learner's) launches and trains as written.

- ``COURSE_LAUNCH_HOOK=MODULE`` (the launcher's side): ``MODULE.launch(run,
  launch_now, progress)`` runs every shareable launch; the test sessions name
  ``tests.machinery.replay``, which with ``COURSE_REPLAY=DIR`` runs a launch
  that both test lanes make with the same inputs once and replays it for the
  other;
- ``COURSE_WORKER_HOOK=MODULE`` (the workers' side): before each training
  update of a launch that carries a fault (``COURSE_FAULT=JSON`` or
  ``launch(fault=...)``), ``MODULE.before_update(fault, rank, step)`` crashes,
  slows, fills the disk or prints noise (``tests.machinery.faults``).
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

LAUNCH_HOOK_ENV = "COURSE_LAUNCH_HOOK"
WORKER_HOOK_ENV = "COURSE_WORKER_HOOK"
FAULT_ENV = "COURSE_FAULT"


def _named(env: str) -> Any | None:
    name = os.environ.get(env, "").strip()
    return importlib.import_module(name) if name else None


def fault_from_env() -> dict | None:
    """e.g. {"kind": "crash", "rank": 1, "step": 3} or {"delay": 0.05}."""
    raw = os.environ.get(FAULT_ENV)
    return json.loads(raw) if raw else None


def around_launch(run: RunFile, launch_now: Callable[[Progress | None], LaunchResult],
                  progress: Progress | None, shareable: bool) -> LaunchResult:
    """``launch_now(progress)``, or what the launch hook makes of it."""
    hook = _named(LAUNCH_HOOK_ENV) if shareable else None
    if hook is None:
        return launch_now(progress)
    return hook.launch(run, launch_now, progress)


def before_update(fault: dict, rank: int, step: int) -> None:
    """In the workers, before each training update: the launch's fault, if any."""
    if not fault:
        return
    hook = _named(WORKER_HOOK_ENV)
    if hook is None:  # a fault nobody can inject would pass silently
        raise RuntimeError(f"this launch carries a fault but {WORKER_HOOK_ENV} names "
                           "no module to inject it (tests.machinery.faults)")
    hook.before_update(fault, rank, step)
