"""Linux's prctl for the job's processes: die with the parent, name a worker."""

from __future__ import annotations

import ctypes
import signal
import sys

# Forked workers share the agent's command line; each names itself instead
# (Linux's 15-character process name, as ps and psutil show it).
WORKER_NAME = "course-rank"


def _libc_prctl():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl() if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies.

    The agent server (agent.py) runs it, and each agent it forks, and every
    worker: SIGKILL leaves a launcher no chance to clean up, and nothing may
    outlive it. libc is loaded beforehand: a forked child should call, not
    load."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def name_worker(rank: int) -> None:
    """Show this process as ``course-rank<R>`` (see ``launch.workers``)."""
    if _PRCTL is not None:
        _PRCTL(15, f"{WORKER_NAME}{rank}".encode())  # PR_SET_NAME
