"""The error record of a worker that fails before its log context exists.

It goes where the launcher's diagnosis looks for errors,
``<out>/logs/setup-rank<R>.jsonl``, so the LaunchError's first line carries
the worker's own message (a missing corpus, a bad device, ...).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path


def record_setup_error(out: Path, exc: BaseException) -> None:
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return
    rec = {"event": "error", "job": "setup", "rank": int(rank), "time": time.time(),
           "step": None, "message": f"{type(exc).__name__}: {exc}".splitlines()[0],
           "traceback": "".join(traceback.format_exception(exc))}
    try:
        path = Path(out) / "logs" / f"setup-rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError:
        pass  # stderr still has the traceback
