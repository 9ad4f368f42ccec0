"""Where a launch's seconds went, from the launcher's and rank 0's own logs.

A launch splits into four phases:

  agent     torchrun starts, until the first worker process exists
  startup   the worker imports torch, joins the process group, loads the corpus
  jobs      the work itself: windows, checks, checkpoints, reports
  teardown  the last job's end until torchrun has exited and been reaped
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .jobs import LaunchRecord


@dataclass(frozen=True)
class LaunchPhases:
    jobs: list[str]
    world_size: int
    total: float
    agent: float
    startup: float
    work: float
    teardown: float


def _rank0_events(out: Path) -> list[dict]:
    events = []
    for path in Path(out).rglob("logs/*-rank0.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("time"), (int, float)):
                events.append(rec)
    return sorted(events, key=lambda r: r["time"])


def launch_phases(out: Path) -> list[LaunchPhases]:
    """One entry per launch recorded under ``out`` (oldest first)."""
    events = _rank0_events(out)
    phases = []
    for rec in LaunchRecord.read_all(out):
        if rec.replayed:
            continue
        end = rec.started + rec.seconds
        mine = [e for e in events if rec.started <= e["time"] <= end + 1.0]
        ready = next((e for e in mine if e["event"] == "ready"), None)
        starts = [e["time"] for e in mine if e["event"] == "start"]
        dones = [e["time"] for e in mine if e["event"] == "done"]
        if ready is None or not starts or not dones:
            continue  # a failed launch: no phases to show
        created = max(ready["process_started"], rec.started)
        phases.append(LaunchPhases(
            jobs=rec.jobs, world_size=rec.world_size, total=rec.seconds,
            agent=created - rec.started, startup=ready["time"] - created,
            work=dones[-1] - starts[0], teardown=max(0.0, end - dones[-1])))
    return phases
