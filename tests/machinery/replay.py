"""Run each distinct launch once per test session; replay it everywhere else.

The test sessions' launch hook: the repository's conftest.py names this
module in ``COURSE_LAUNCH_HOOK``, which ``course_lib.run.hooks`` imports.

``make test`` runs the chapters (nbval) and the tests side by side, and some
launches are the same in both: chapter 05 and ``test_audit`` run the bug
catalog, chapters 04 and 06 and ``test_torchrun``'s ``run_all`` the
protocol. With ``COURSE_REPLAY=DIR`` set, a launch first looks in DIR for a
launch with the same inputs:

  the run file, with --out written as "<out>"; the files the jobs read from
  earlier launches (resume checkpoints, a learner's step file); the course's
  own sources; the torch version

On a hit it copies the files that launch wrote into this --out; on a miss it
runs, then stores what it wrote. A launch that fails in a worker (the
uneven-microbatches check's deadlocks fail on purpose) is stored with its
error, and its replay raises the same LaunchError; one that timed out, was
interrupted or failed in the launcher is never stored. A lock per key makes
a second caller wait for the first instead of running the same job beside
it. Launches with a fault, several nodes or restarts are never shared, and
nothing is ever stored outside the DIR a session names (``make test`` makes
a fresh one).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import course_lib
from course_lib.run import progress as progress_mod
from course_lib.run import runlock
from course_lib.run.diagnose import LaunchError
from course_lib.run.launch import LaunchResult, resolve
from course_lib.run.progress import Progress, Recorder
from course_lib.run.runfile import LaunchRecord, RunFile, tag

ENV = "COURSE_REPLAY"
# Written by every launch, replayed or not; never part of what is shared.
SKIPPED = {"launch.json", "logs/torchrun.log", "logs/launches.jsonl", runlock.LOCK_FILE}


def enabled() -> Path | None:
    where = os.environ.get(ENV)
    return Path(where) if where else None


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _sources() -> str:
    package = Path(course_lib.__file__).parent
    return _digest_files(sorted(package.rglob("*.py"))) + torch.__version__


def _inputs(doc: dict) -> list[Path]:
    """Files the jobs read that earlier launches or the learner wrote."""
    found = []
    for job in doc["jobs"]:
        # checkpoints to resume or evaluate; a learner's capstone script
        for key in ("resume", "resume_from", "continuous", "resumed", "checkpoint", "file"):
            if job.get(key):
                found.append(Path(job[key]))
        for spec in job.get("steps", []):
            path = spec.rsplit(":", 1)[0]
            if path.endswith(".py"):
                found.append(Path(path))
    return [p for p in found if p.exists()]


def key(run: RunFile) -> str:
    doc = run.to_dict()
    inputs = _digest_files(_inputs(doc))
    text = json.dumps(doc, sort_keys=True).replace(run.out, "<out>")
    return hashlib.sha256((text + inputs + _sources()).encode()).hexdigest()[:24]


def _written(out: Path, since: float) -> list[Path]:
    return sorted(p.relative_to(out) for p in out.rglob("*")
                  if p.is_file() and p.stat().st_mtime >= since
                  and str(p.relative_to(out)) not in SKIPPED)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _copy(src: Path, dst: Path, files: list[Path]) -> None:
    for rel in files:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)  # a fresh mtime, as if written now


def _stored_failure(err: LaunchError) -> dict | None:
    """A worker's own failure, as the same inputs fail every time; None for
    one that timing or the launcher decided (never shared)."""
    if err.interrupted or err.rank is None or "timed out after" in str(err):
        return None
    # every field the error is built with, so a replayed one reads the same
    # (a field added to LaunchError later, like ``audited``, comes along)
    fields = [n for n in inspect.signature(LaunchError).parameters if n != "message"]
    return {"message": str(err), **{n: getattr(err, n) for n in fields}}


class ReplayedFailure(Exception):
    """A stored launch that failed: its files are in place, ``error`` is its
    LaunchError."""

    def __init__(self, error: LaunchError):
        super().__init__(str(error))
        self.error = error


def run_or_replay(store: Path, run: RunFile, launch: Callable[[Progress], object],
                  sink: Progress, before_replay: Callable[[], None]) -> object | None:
    """``launch(progress)`` once per key; None when this call replayed a
    stored launch (its files and its progress updates); ReplayedFailure when
    that launch failed."""
    k = key(run)
    entry, out = store / k, Path(run.out)
    with _locked(store / f"{k}.lock"):
        if (entry / "files.json").exists():
            before_replay()
            files = [Path(p) for p in json.loads((entry / "files.json").read_text())]
            _copy(entry / "tree", out, files)
            for update in json.loads((entry / "progress.json").read_text()):
                sink.update(*update)
            sink.close()
            if (entry / "error.json").exists():
                fields = json.loads((entry / "error.json").read_text())
                raise ReplayedFailure(LaunchError(fields.pop("message"), **fields))
            return None
        started = time.time() - 1.0  # mtimes come from a coarser clock
        recorder = Recorder(sink)
        failure = None
        try:
            result = launch(recorder)
        except LaunchError as err:
            failure = _stored_failure(err)
            if failure is None:
                raise
            error, result = err, None
        files = _written(out, started)
        tmp = store / f"{k}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _copy(out, tmp / "tree", files)
        (tmp / "progress.json").write_text(json.dumps(recorder.updates))
        if failure is not None:
            (tmp / "error.json").write_text(json.dumps(failure))
        (tmp / "files.json").write_text(json.dumps([str(p) for p in files]))
        tmp.rename(entry)
        if failure is not None:
            raise error
        return result


def _forget_fresh_runs(run: RunFile) -> None:
    """What a fresh train job's rank 0 does first: drop the run directory's
    old checkpoints, which a replayed launch would otherwise leave beside its own."""
    for job in run.jobs:
        if job.TAG == "train" and not getattr(job, "resume", None):
            shutil.rmtree(Path(job.writes_to() or run.out) / "checkpoints",
                          ignore_errors=True)


def launch(run: RunFile, launch_now: Callable[[Progress | None], LaunchResult],
           progress: Progress | None) -> LaunchResult:
    """The launch hook (``run.hooks.around_launch``): run once per key in
    this session's store, or copy what an identical launch wrote; without a
    store (a test that launches for real), just run."""
    store = enabled()
    if store is None:
        return launch_now(progress)
    out = Path(run.out)
    started, wall = time.monotonic(), time.time()
    failed = None
    try:
        result = run_or_replay(store, run, launch_now, progress or progress_mod.make(),
                               lambda: _forget_fresh_runs(run))
    except ReplayedFailure as replayed:
        result, failed = None, replayed.error
    if result is not None:
        return result  # type: ignore[return-value]
    seconds = time.monotonic() - started
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / "torchrun.log").write_text(
        f"replayed: an identical launch already ran in this session ({ENV})\n"
        + (f"{failed.log_tail}\n" if failed is not None else ""))
    world_size = run.config["train"]["world_size"]
    LaunchRecord(wall, seconds, world_size, [tag(j) for j in run.jobs],
                 0 if failed is None else -1, path="replayed").append_to(out)
    if failed is not None:
        raise failed
    return LaunchResult(0, seconds, resolve(run.backend, world_size, run.device))
