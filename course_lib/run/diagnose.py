"""Why a launch failed: the rank at fault, its last step and its log's tail.

The first line of a ``LaunchError`` names the failed rank and its last step,
read from the ranks' JSON-lines logs (``reports.logs``) and, when no rank
left an error of its own, from torchrun's "Root Cause" report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil

from course_lib.core.edition import DEFAULT, current, reword, tr
from course_lib.reports import logs as rank_logs
from course_lib.run.runfile import JobSpec


class LaunchError(RuntimeError):
    """A torchrun job failed, timed out or was interrupted.

    The first line of the message names the failed rank and its last step.
    ``step`` is the training update; ``audited`` the step function under
    audit when the rank failed (its name), if any.
    """

    def __init__(self, message: str, *, rank: int | None = None,
                 step: int | None = None, job: str | None = None,
                 audited: str | None = None, log_tail: str = "",
                 interrupted: bool = False):
        super().__init__(message)
        self.rank, self.step, self.job, self.audited = rank, step, job, audited
        self.log_tail, self.interrupted = log_tail, interrupted

    @property
    def said(self) -> str:
        """The message with its first line in the learner's language
        (``COURSE_EDITION``, ``said``); the message itself stays English:
        the CLI, the checks' notes and the capstone's grade read it."""
        first, *rest = str(self).split("\n", 1)
        return "\n".join([said(first), *rest])


# The first line of a LaunchError, as ``diagnose`` writes it: who failed,
# in which job (the audited step and check), at which step, and either the
# rank's error and the launch's reason, or the reason and each rank's step.
_FIRST_LINE = re.compile(
    r"(?P<who>ranks? [\d, ]+|the job) failed(?: in (?P<job>.+?))?"
    r"(?: \(seen by (?P<seen>ranks? [\d, ]+)\))?(?: at step (?P<step>\d+))?: "
    r"(?:(?P<error>\w+: .*) \[(?P<why>[^\[\]]*)\]|(?P<reason>.*?)"
    r"(?: \((?P<steps>rank \d+ at step \w+(?:, rank \d+ at step \w+)*)\))?)", re.DOTALL)
_JOB = re.compile(r"(?P<job>\S+) \((?:step (?P<step>[^,)]+))?(?:, )?"
                  r"(?:check (?P<check>[^)]+))?\)")
# Why a launch failed (launch.py, diagnose), one inside another.
REASONS = (
    "killed by {signal}; {why}",
    "{why}; rank {rank}'s process was stopped (SIGSTOP), the others waited for it",
    "{why} (a C++ abort: often collectives that differ between ranks)",
    "torchrun exited with code {code}",
    "timed out after {seconds} s",
    "interrupted by the user",
)
# The jobs' tags that the catalog words for the learner (a failure "in uneven").
JOB_NAMES = ("uneven",)
# What rank/harness.py's StepDesyncError says (the run layer may not import it).
DESYNC = ("rank {ranks} did not finish the step within {seconds} s: a hang, or a "
          "collective that the other ranks skipped")


def said(line: str) -> str:
    """A LaunchError's first line (or a check's note that quotes one), as
    English records keep it, in the learner's language: the frame through
    ``tr``, the rank's error through its exception's messages. The line as
    it is in English, or when diagnose did not write it."""
    found = _FIRST_LINE.fullmatch(line)
    if found is None or current() == DEFAULT:
        return line
    return _frame(found)


def _failed(who: str) -> str:
    """``rank 1 failed``, ``ranks 0, 1 failed`` or ``the job failed`` (the
    verb agrees with its subject in French)."""
    if who == "the job":
        return tr("the job failed")
    many, _, ranks = who.partition(" ")
    return (tr("ranks {ranks} failed") if many == "ranks" else
            tr("rank {ranks} failed")).format(ranks=ranks)


def _frame(found: re.Match[str]) -> str:
    text = _failed(found["who"])
    if found["job"]:
        text += tr(" in {job}").format(job=_job(found["job"]))
    if found["seen"]:
        many, _, ranks = found["seen"].partition(" ")
        text += (tr(" (seen by ranks {ranks})") if many == "ranks" else
                 tr(" (seen by rank {ranks})")).format(ranks=ranks)
    if found["step"]:
        text += tr(" at step {step}").format(step=found["step"])
    if found["error"]:
        return joined(text, _error(found["error"])) + f" [{_reason(found['why'])}]"
    text = joined(text, _reason(found["reason"]))
    if found["steps"]:
        steps = [tr("rank {rank} at step {step}").format(rank=r, step=s) for r, s in
                 re.findall(r"rank (\d+) at step (\w+)", found["steps"])]
        text += f" ({', '.join(steps)})"
    return text


def _job(text: str) -> str:
    """The failed job, with the audited step and check in the edition's words."""
    found = _JOB.fullmatch(text)
    if found is None:
        return text
    inner = [tr("step {step}").format(step=found["step"]) if found["step"] else "",
             tr("check {check}").format(check=found["check"]) if found["check"] else ""]
    return f"{reword(found['job'], JOB_NAMES)} ({', '.join(p for p in inner if p)})"


def _reason(text: str) -> str:
    return reword(text, REASONS, _reason)


def _error(text: str) -> str:
    """A rank's error, ``Type: message``, its message in the edition's words."""
    kind, _, message = text.partition(": ")
    if kind == "EmptyWindowError":  # torch's modules, imported when a rank raised them
        from course_lib.core.normalize import EmptyWindowError
        message = EmptyWindowError(message).said
    elif kind == "CheckpointError":
        from course_lib.core.checkpoint import CheckpointError
        message = CheckpointError(message).said
    elif kind == "StepDesyncError":
        message = reword(message, (DESYNC,))
    return joined(kind, message)


def joined(before: str, after: str) -> str:
    """``before: after``, the colon as the edition sets it (French: after a
    no-break space, never at the start of a line)."""
    return tr("{before}: {after}").format(before=before, after=after)


def run_dirs(out: Path, jobs: list[JobSpec]) -> list[Path]:
    """The launch's --out and every other directory its jobs write to."""
    dirs = [out] + [Path(d) for d in (j.writes_to() for j in jobs) if d]
    return list(dict.fromkeys(dirs))


def _last_step(recs: list[tuple[Path, rank_logs.Event]]) -> int | None:
    steps = [r.step for _, r in recs if isinstance(r, rank_logs.Step)]
    return steps[-1] if steps else None


def _tail_of(path: Path, n: int = 6) -> str:
    lines = path.read_text(errors="replace").splitlines()[-n:]
    shown = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            shown.append(line)
            continue
        rec.pop("traceback", None)
        shown.append(json.dumps(rec))
    return "\n".join(shown)


def _root_cause_rank(output: list[str]) -> int | None:
    text = "\n".join(output)
    if "Root Cause" not in text:
        return None
    for line in text.split("Root Cause", 1)[1].splitlines():
        if line.strip().startswith("rank"):
            try:
                return int(line.split(":", 1)[1].split()[0])
            except (ValueError, IndexError):
                return None
    return None


PEER_LOST = ("Connection reset by peer", "Connection closed by peer")

# An error event: (its time, its rank, its log file, the event).
_Failure = tuple[float, int, Path, rank_logs.Error]


def _culprit(rec: rank_logs.Error, errors: list[_Failure], output: list[str]
             ) -> int | None:
    """The rank at fault when the first error only reports another rank's fate.

    A rank may name the ranks that never finished a step (``stuck``). A rank
    that lost its gloo peer points at the rank torchrun saw die first, when
    that one left no error of its own (a C++ abort on mismatched collectives).
    """
    if rec.stuck:
        return rec.stuck[0]
    if any(p in rec.message for p in PEER_LOST):
        root = _root_cause_rank(output)
        if root is not None and root not in {r for _, r, _, _ in errors}:
            return root
    return None


def diagnose(out: Path, jobs: list[JobSpec], since: float, kind: str, why: str,
             output: list[str], states: dict[int, str] | None = None) -> LaunchError:
    """Name the failed rank, its last step and the tail of its log.

    ``states``: the workers' process states when the job timed out; a
    stopped worker is the one that hung the others.
    """
    logs = rank_logs.read(run_dirs(out, jobs), since=since)
    errors = [(rec.time, rank, path, rec) for rank, recs in logs.items()
              for path, rec in recs if isinstance(rec, rank_logs.Error)]
    progress_line = ", ".join(
        f"rank {r} at step {_last_step(recs)}" for r, recs in sorted(logs.items())
    )
    if errors:
        _, first, path, rec = min(errors, key=lambda e: e[0])
        same = sorted({r for _, r, _, e in errors if e.message == rec.message})
        who = (f"ranks {', '.join(map(str, same))}" if len(same) > 1
               else f"rank {first}")
        step = rec.step if rec.step is not None else _last_step(logs.get(first, []))
        tb = rec.traceback.strip().splitlines()[-4:]
        tail = _tail_of(path) + ("\n" + "\n".join(tb) if tb else "")
        what, culprit = f"failed in {rec.job}", _culprit(rec, errors, output)
        if culprit is not None:
            who, what, first = f"rank {culprit}", what + f" (seen by {who})", culprit
        at = f" at step {step}" if step is not None else ""
        msg = f"{who} {what}{at}: {rec.message} [{why}]"
        return LaunchError(msg + "\n" + tail, rank=first, step=step, job=rec.job,
                           audited=rec.audited, log_tail=tail,
                           interrupted=kind == "interrupt")
    rank = _root_cause_rank(output)
    stopped = sorted(r for r, st in (states or {}).items() if st == psutil.STATUS_STOPPED)
    if stopped:
        rank = stopped[0]
        why += f"; rank {rank}'s process was stopped (SIGSTOP), the others waited for it"
    if rank is None and logs:
        # Nobody reported an error (timeout, interrupt): name the laggard,
        # the rank whose last step came first.
        rank = min(logs, key=lambda r: (_last_step(logs[r]) or 0, logs[r][-1][1].time))
    step = _last_step(logs.get(rank, [])) if rank is not None else None
    records = logs.get(rank, []) if rank is not None else []
    paths = [p for p, _ in records]
    tail = "\n".join(filter(None, [_tail_of(paths[-1]) if paths else "",
                                   "--- torchrun output ---", *output[-15:]]))
    who = f"rank {rank}" if rank is not None else "the job"
    where = records[-1][1].where if records else None
    signal_name = _root_cause_signal(output) if kind == "error" else None
    if signal_name:
        why = f"killed by {signal_name}; {why}"
        if signal_name == "SIGABRT":
            why += " (a C++ abort: often collectives that differ between ranks)"
    msg = f"{who} failed" + (f" in {where}" if where else "")
    msg += (f" at step {step}" if step is not None else "") + f": {why}"
    if progress_line:
        msg += f" ({progress_line})"
    audited = records[-1][1].audited if records else None
    return LaunchError(msg + "\n" + tail, rank=rank, step=step, audited=audited,
                       log_tail=tail, interrupted=kind == "interrupt")


def _root_cause_signal(output: list[str]) -> str | None:
    text = "\n".join(output)
    if "Root Cause" not in text:
        return None
    match = re.search(r"\((SIG[A-Z]+)\)", text.split("Root Cause", 1)[1])
    return match.group(1) if match else None
