"""Where a launch's seconds went, from the launcher's and rank 0's own logs.

A launch splits into four phases:

  agent     torchrun starts, until the first worker process exists
  startup   the worker imports torch, joins the process group, loads the corpus
  jobs      the work itself: windows, checks, checkpoints, reports
  teardown  the last job's end until torchrun has exited and been reaped
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from course_lib.reports import logs
from course_lib.run.runfile import LaunchRecord


@dataclass(frozen=True)
class LaunchPhases:
    jobs: list[str]
    world_size: int
    total: float
    agent: float
    startup: float
    work: float
    teardown: float


def _rank0_events(out: Path) -> list[logs.Event]:
    """Rank 0's log records from every run directory under ``out``, by time."""
    dirs = [p.parent for p in Path(out).rglob("logs") if p.is_dir()]
    return [rec for _, rec in logs.read(dirs, since=0.0).get(0, [])]


def launch_phases(out: Path) -> list[LaunchPhases]:
    """One entry per launch recorded under ``out`` (oldest first)."""
    events = _rank0_events(out)
    phases = []
    for rec in LaunchRecord.read_all(out):
        if rec.replayed:
            continue
        end = rec.started + rec.seconds
        mine = [e for e in events if rec.started <= e.time <= end + 1.0]
        ready = next((e for e in mine if isinstance(e, logs.Ready)), None)
        starts = [e.time for e in mine if isinstance(e, logs.Start)]
        dones = [e.time for e in mine if isinstance(e, logs.Done)]
        if ready is None or not starts or not dones:
            continue  # a failed launch: no phases to show
        created = max(ready.process_started, rec.started)
        phases.append(LaunchPhases(
            jobs=rec.jobs, world_size=rec.world_size, total=rec.seconds,
            agent=created - rec.started, startup=ready.time - created,
            work=dones[-1] - starts[0], teardown=max(0.0, end - dones[-1])))
    return phases
