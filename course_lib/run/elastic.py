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

import os
from dataclasses import dataclass
from pathlib import Path

from course_lib.core import checkpoint
from course_lib.reports import logs

LAUNCHED_AT = "COURSE_LAUNCHED_AT"  # set by the launcher: time.time() at start
RESTARTS_LOG = "restarts.jsonl"


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_point(run_dir: Path, stop: int, since: float, **fit) -> Path | None:
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


def read_restarts(run_dirs: list[Path]) -> list[Restart]:
    """Every restart logged in ``run_dirs``, oldest first; unreadable lines skipped."""
    found = []
    for run_dir in run_dirs:
        for rec in logs.lines(log_path(run_dir)):
            try:
                found.append(Restart(str(run_dir), int(rec["restart"]), str(rec.get("run", "")),
                                     int(rec["resumed_from_step"]), float(rec["time"])))
            except (KeyError, TypeError, ValueError):
                continue
    return sorted(found, key=lambda r: (r.time, r.restart))


def clear(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        log_path(run_dir).unlink(missing_ok=True)
