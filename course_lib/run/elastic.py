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
from pathlib import Path

from course_lib.core import checkpoint

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


def read_restarts(run_dirs: list[Path]) -> list[dict]:
    """Every restart logged in ``run_dirs``, oldest first; unreadable lines skipped."""
    found = []
    for run_dir in run_dirs:
        try:
            lines = log_path(run_dir).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                found.append({"run_dir": str(run_dir), **rec})
    return sorted(found, key=lambda r: (r.get("time", 0), r.get("restart", 0)))


def clear(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        log_path(run_dir).unlink(missing_ok=True)
