"""The per-rank JSON-lines logs, ``<out>/logs/<job>-rank<R>.jsonl``: one reader.

Every rank appends one record per event (``start``, ``step``, ``error``, ...)
with its ``time`` (``RankContext.log``); the launcher's diagnosis, the timing
of a launch, the loss curves and the tests all read them through ``read``,
each record as its event's type (``EVENTS``), decoded by ``core.typed``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_lib.core.typed import DecodeError, decode

Record = dict[str, Any]  # one line, as JSON


@dataclass(frozen=True)
class Event:
    """The keys of every record; an event no type names keeps its own in ``extra``."""

    event: str
    job: str  # the job's tag; an error's names the audited step and check too
    rank: int
    time: float  # wall clock, time.time()
    where: str | None = None  # the job, audited step and check (JobState.describe)
    audited: str | None = None  # the audited step function
    extra: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, kw_only=True)
class Ready(Event):
    process_started: float  # the worker process's creation time


@dataclass(frozen=True, kw_only=True)
class Start(Event):
    spec: dict[str, Any]  # the job's spec, as the run file holds it


@dataclass(frozen=True, kw_only=True)
class Done(Event):
    pass


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    message: str  # "ExceptionType: text"
    step: int | None = None  # the training update, if any
    stuck: list[int] | None = None  # the ranks that never finished a step
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One training update, before its optimizer step (``jobs.train.train_steps``)."""

    run: str
    step: int
    window: int
    local_tokens: int  # N_r
    global_tokens: int  # N
    local_loss_sum: float  # S_r
    loss: float  # sum_r S_r / N, the same on every rank


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Event):
    run: str
    step: int


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    run: str
    step: int
    path: str


@dataclass(frozen=True, kw_only=True)
class CheckStarted(Event):
    check: str


@dataclass(frozen=True, kw_only=True)
class AuditStep(Event):
    step: str  # the step function's name


@dataclass(frozen=True, kw_only=True)
class ModeDone(Event):
    mode: str
    local_tokens: list[int]
    agree_after_micro: list[bool]


@dataclass(frozen=True, kw_only=True)
class Evaluated(Event):
    sequences: int
    repeats: int
    local_loss_sum: float
    local_tokens: int


@dataclass(frozen=True, kw_only=True)
class Smoke(Event):
    device: str
    all_reduce: int


@dataclass(frozen=True, kw_only=True)
class FrameworkStarted(Event):
    framework: str
    model: str
    flags: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class FrameworkFailed(Event):
    message: str


@dataclass(frozen=True, kw_only=True)
class LoggingStarted(Event):
    model: str


@dataclass(frozen=True, kw_only=True)
class TrainerCaseStarted(Event):
    case: str  # a TRL trainer and its loss type (jobs/trl_grpo.py)


# The event's name in a record -> its type: every event a rank logs
# (RankContext.log) has one (tests/test_typed.py).
EVENTS: dict[str, type[Event]] = {
    "ready": Ready, "start": Start, "done": Done, "error": Error, "step": Step,
    "checkpoint": Checkpoint, "resumed": Resumed, "check": CheckStarted,
    "audit_step": AuditStep, "mode_done": ModeDone, "evaluate": Evaluated,
    "smoke": Smoke, "framework": FrameworkStarted, "framework_failed": FrameworkFailed,
    "frameworks_logging": LoggingStarted, "trl_trainer": TrainerCaseStarted,
}


def parse(record: Mapping[str, Any], where: str = "") -> Event:
    """One record as its event's type; a record that does not fit it is a
    DecodeError naming ``where`` and the key."""
    cls = EVENTS.get(str(record.get("event")), Event)
    return decode(cls, record, where)


def rank_of(path: Path) -> int | None:
    """``train-rank1.jsonl`` -> 1."""
    try:
        return int(Path(path).stem.rsplit("rank", 1)[1])
    except (IndexError, ValueError):
        return None


def lines(path: Path) -> list[Record]:
    """Every record of one JSON-lines file; a line cut short (a writer killed
    mid-line) or not an object is skipped, and a missing file has none."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            found.append(rec)
    return found


def events(path: Path) -> list[Event]:
    """Every event of one log file, as its type. A line cut short or not an
    event (no ``event``, ``rank`` or numeric ``time``) is skipped; a
    ``step`` without its loss is a DecodeError."""
    found = []
    for i, rec in enumerate(lines(path)):
        if not _is_event(rec):
            continue
        found.append(parse(rec, f"{Path(path).name}:{i + 1}"))
    return found


def _is_event(rec: Record) -> bool:
    time = rec.get("time")
    return (isinstance(rec.get("event"), str) and isinstance(rec.get("job"), str)
            and isinstance(rec.get("rank"), int)
            and isinstance(time, (int, float)) and not isinstance(time, bool))


def read(dirs: Path | Iterable[Path], job: str = "*", since: float | None = None
         ) -> dict[int, list[tuple[Path, Event]]]:
    """{rank: [(log file, event), ...]} in time order, for one job or all.

    ``since``: only events written at or after this wall-clock time. A line
    cut short (a worker killed mid-write) or not an event is skipped.
    """
    dirs = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    by_rank: dict[int, list[tuple[Path, Event]]] = {}
    for d in dirs:
        for path in sorted((d / "logs").glob(f"{job}-rank*.jsonl")):
            rank = rank_of(path)
            if rank is None:
                continue
            for ev in events(path):
                if since is None or ev.time >= since:
                    by_rank.setdefault(rank, []).append((path, ev))
    for evs in by_rank.values():
        evs.sort(key=lambda pe: pe[1].time)
    return by_rank


def records(run_dir: Path, job: str = "train") -> dict[int, list[Event]]:
    """{rank: [event, ...]} of one job's logs in ``run_dir``."""
    return {rank: [ev for _, ev in evs] for rank, evs in read(run_dir, job).items()}


def steps(run_dir: Path, job: str = "train") -> dict[int, list[Step]]:
    """{rank: [step event, ...]}: each rank's training updates, in time order."""
    return {rank: [ev for ev in evs if isinstance(ev, Step)]
            for rank, evs in records(run_dir, job).items()}


def loss_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, window loss per token) from the per-rank train logs."""
    per_step: dict[int, list[Step]] = {}
    for evs in steps(run_dir).values():
        for ev in evs:
            per_step.setdefault(ev.step, []).append(ev)
    return [
        (step, sum(r.local_loss_sum for r in evs) / evs[0].global_tokens)
        for step, evs in sorted(per_step.items())
    ]


__all__ = ["EVENTS", "DecodeError", "Event", "Record", "Step", "events", "lines",
           "loss_curve", "parse", "rank_of", "read", "records", "steps"]
