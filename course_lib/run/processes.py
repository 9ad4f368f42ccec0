"""The job's processes: find each worker, name it, and stop the whole tree.

Stopping a job means signalling every descendant's process group, not just
torchrun's: a worker may live in a group or session of its own. Every
worker shows who it is in ``ps``, ``top`` and ``pgrep -f``: its title is
``course-lib worker rank R/W <job> <out>`` on both launch paths, and its
15-character name ``course-rank<R>``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Protocol

import psutil
import setproctitle

from course_lib.run.forkserver.prctl import WORKER_NAME, die_with_parent, name_worker

__all__ = ["die_with_parent", "kill_tree", "rank_states", "title_worker", "workers",
           "worker_states"]


class Job(Protocol):
    """What ``kill_tree`` needs of a job's top process: a Popen, or a forked agent."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def title(rank: int, world_size: int, job: str, out: str) -> str:
    return f"course-lib worker rank {rank}/{world_size} {job} {out}"


def title_worker(rank: int, world_size: int, job: str, out: str) -> None:
    """Show this worker as its rank, job and run directory. The name comes
    second: setproctitle sets it too, to the title's first 15 characters."""
    setproctitle.setproctitle(title(rank, world_size, job, out))
    name_worker(rank)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _groups(pids: list[int]) -> set[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    return groups


def kill_tree(proc: Job, grace: float = 3.0) -> None:
    """SIGTERM every process group in the job's tree, then SIGKILL survivors.

    SIGCONT follows SIGTERM: a stopped (SIGSTOP) process acts on SIGTERM only
    once it runs again.
    """
    pids = [proc.pid, *descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = list(dict.fromkeys(pids + descendants(proc.pid)))
        for group in _groups(pids):
            for s in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
                try:
                    os.killpg(group, s)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if not any(_alive(p) for p in pids):
                break
            time.sleep(0.05)
    proc.wait()


def worker_states(pid: int) -> dict[int, tuple[psutil.Process, str]]:
    """{rank: (process, status)} of the live workers below ``pid``."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for child in children:
        try:
            name, status = child.name(), child.status()
            if name.startswith(WORKER_NAME) and status != psutil.STATUS_ZOMBIE:
                found[int(name[len(WORKER_NAME):])] = (child, status)
        except (psutil.Error, ValueError):
            continue
    return found


def workers(pid: int) -> dict[int, psutil.Process]:
    """{rank: process} of the live workers below ``pid``."""
    return {rank: proc for rank, (proc, _) in worker_states(pid).items()}


def rank_states(proc: Job) -> dict[int, str]:
    """{rank: process status} of the job's live workers ("stopped", ...)."""
    return {rank: status for rank, (_, status) in worker_states(proc.pid).items()}
