"""torchrun restarts (``--max-restarts N``): workers resume by themselves.

When a worker dies, torchrun stops the others and starts every worker again
with ``TORCHELASTIC_RESTART_COUNT`` raised by one. A restarted ``train`` job
then resumes from the newest valid checkpoint that THIS launch wrote in its
run directory (older trajectories' checkpoints never count), instead of
starting afresh. Rank 0 appends one line per restart to
``<run_dir>/logs/restarts.jsonl``; the launcher clears that file when a
launch starts and reports its lines afterwards.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.core import checkpoint
from course_lib.core.typed import DecodeError, decode, encode
from course_lib.reports import logs

LAUNCHED_AT = "COURSE_LAUNCHED_AT"  # set by the launcher: time.time() at start
RESTARTS_LOG = "restarts.jsonl"


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_point(run_dir: Path, stop: int, since: float, **fit: Any) -> Path | None:
    """The newest valid checkpoint in ``run_dir`` written since ``since``, at
    or before step ``stop``."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.iterdir() if 0 <= checkpoint.step_of(p) <= stop
             ] if root.is_dir() else []
    for path in sorted(found, key=checkpoint.step_of, reverse=True):
        try:
            if (path / checkpoint.TRAINER).stat().st_mtime < since:
                continue
            checkpoint.verify(path, **fit)
            return path
        except (OSError, checkpoint.CheckpointError):
            continue
    return None


def log_path(run_dir: Path) -> Path:
    return Path(run_dir) / "logs" / RESTARTS_LOG


@dataclass(frozen=True)
class Restart:
    """One line of ``restarts.jsonl``: torchrun's restart number ``restart``
    of the ``run``, which resumed from this step (0: from scratch)."""

    run_dir: str
    restart: int
    run: str
    resumed_from_step: int
    time: float


def record_restart(run_dir: Path, restart: int, run: str, resumed_from_step: int) -> None:
    """Rank 0 of a restarted launch: one line of ``restarts.jsonl``."""
    line = Restart(str(run_dir), restart, run, resumed_from_step, time.time())
    doc = {k: v for k, v in encode(line).items() if k != "run_dir"}  # the file says
    path = log_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(doc) + "\n")


def read_restarts(run_dirs: list[Path]) -> list[Restart]:
    """Every restart logged in ``run_dirs``, oldest first; unreadable lines skipped."""
    found = []
    for run_dir in run_dirs:
        for rec in logs.lines(log_path(run_dir)):
            try:
                found.append(decode(Restart, {**rec, "run_dir": str(run_dir)}))
            except DecodeError:
                continue
    return sorted(found, key=lambda r: (r.time, r.restart))


def clear(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        log_path(run_dir).unlink(missing_ok=True)
