"""One run at a time per run directory.

An exclusive ``flock`` on ``<out>/.course-lock``: the kernel drops it when the
holder dies, so a run killed with SIGKILL never leaves a stale lock. The file
keeps the holder's PID, only to name it in the refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".course-lock"


class RunDirInUse(OSError):
    """Another process holds the run directory's lock."""


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return "another process"
    return f"PID {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block; refuse at once if it is taken."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUse(
                f"--out {run_dir} is in use by {_holder(path)} (one run at a time "
                "per run directory; wait for it or pick another --out)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)  # releases the lock
