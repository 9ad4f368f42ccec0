"""Fault campaign on real torchrun jobs: noise, a learner's own config, set-up
errors, a stopped rank, a killed CLI, two runs into one --out, a full disk."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import course_lib
from course_lib import cli
from course_lib.core import checkpoint, data, paths
from course_lib.jobs.parity import ParityReport
from course_lib.reports import logs
from course_lib.run import launch, processes, runlock
from tests.conftest import ROOT, all_gone, course_lib_cli, nothing_survives

pytestmark = pytest.mark.torchrun


@pytest.fixture(autouse=True)
def no_process_left_behind(tmp_path_factory):
    yield from nothing_survives(tmp_path_factory, grace=10)


@pytest.fixture()
def small_ckpt_config(tmp_path):
    """minimum.yaml with a checkpoint every 5 steps (same trajectory)."""
    path = tmp_path / "every5.yaml"
    path.write_text((ROOT / "configs" / "minimum.yaml").read_text()
                    .replace("checkpoint_every: 25", "checkpoint_every: 5"))
    return path


def _cli(popen, *args, env=None, **kw):
    return popen([sys.executable, "-m", "course_lib", *map(str, args)],
                 env={**os.environ, "COURSE_PROGRESS": "none", **(env or {})}, cwd=ROOT,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _last_step(run_dir, rank=0):
    path = Path(run_dir) / "logs" / f"train-rank{rank}.jsonl"
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                steps.append(json.loads(line).get("step") or 0)
            except ValueError:
                pass
    return max(steps, default=0)


def _wait_for_step(proc, run_dir, step, limit=120):
    deadline = time.monotonic() + limit
    while _last_step(run_dir) < step:
        assert time.monotonic() < deadline, f"step {step} never came"
        assert proc.poll() is None, f"the job ended early: {proc.communicate()}"
        time.sleep(0.05)


def _held_at(step, tmp_path, **where) -> str:
    """COURSE_FAULT: hold (every rank, or ``rank=R``) at ``step`` until the test
    ends the job: the event it waits on is a file nobody writes."""
    never = tmp_path.parent / f"{tmp_path.name}-never"
    return json.dumps({"kind": "hold", "step": step, "until": str(never), **where})


def _workers_of(proc) -> dict[int, psutil.Process]:
    return processes.workers(proc.pid)


# --- what workers print never breaks the launcher ---------------------------------


def test_worker_noise_leaves_the_result_intact(tmp_path, cfg):
    seen = []

    class Sink(launch.progress_mod.Progress):
        def update(self, job, done, total, label=""):
            seen.append((job, done, total))

    run_dir = course_lib.train(cfg, tmp_path, stop_at=3, timeout=300, progress=Sink(),
                             fault={"kind": "noise", "step": 2})
    assert checkpoint.verify(checkpoint.step_dir(run_dir, 3))["step"] == 3
    assert [s for s in seen if s[0] == "train stop"][-1] == ("train stop", 3, 3)
    log = (tmp_path / "logs" / "torchrun.log").read_text()
    assert "garbage" in log and "the last words, with no newline" in log
    assert max(map(len, log.splitlines())) < 10_000, "a 1.5 MB line is cut for the tail"


# --- a learner's own config ---------------------------------------------------------


def test_reseeded_config_runs_parity_without_prepare(tmp_path):
    # A seed of this test's own: two sessions in one checkout (a fault loop on
    # both fork paths) share runs/data, and one deleting the other's corpus
    # while its workers started was a race (DataLockError on every rank).
    seed = 10_000 + os.getpid()
    mine = tmp_path / "mine.yaml"
    mine.write_text((ROOT / "configs" / "minimum.yaml").read_text()
                    .replace("seed: 1234", f"seed: {seed}"))
    cfg = course_lib.load_config(mine)
    made = data.corpus_paths(cfg, paths.generated_data_dir())
    for p in made:
        p.unlink(missing_ok=True)  # a pid reused since an earlier session
    try:
        done = course_lib_cli("parity", "--config", mine, "--world-size", 3,
                              "--out", tmp_path / "w3")
        assert done.returncode == 0, done.stderr
        assert ParityReport.load(tmp_path / "w3").world_size == 3
        p4 = course_lib.parity(cfg, tmp_path / "w4", world_size=4, timeout=300)
        assert p4.passed and len(p4.local_tokens) == 4
        assert all(p.is_file() for p in made)
        assert not any(p.exists() for p in data.corpus_paths(cfg, paths.data_dir()))
        # A corpus of any seed (not only this one's), never a data file of a
        # change in progress (a new committed report).
        untracked = subprocess.run(["git", "status", "--porcelain", "--", "data/corpus-*"],
                                   cwd=ROOT, capture_output=True, text=True).stdout
        assert untracked == "", "no generated corpus lands in data/"
    finally:
        for p in made:
            p.unlink(missing_ok=True)


def test_a_set_up_failure_is_the_first_line_of_the_error(tmp_path, cfg):
    # timedelta cannot hold this: the workers' set-up fails before any context.
    with pytest.raises(launch.LaunchError) as err:
        course_lib.parity(cfg, tmp_path, timeout=300, collective_timeout=10**15)
    # Whichever rank fails first is named (torchrun may stop the other one
    # before it writes its own record).
    first = str(err.value).splitlines()[0]
    assert re.match(r"ranks? [01](, 1)? failed in setup: OverflowError", first), first
    assert err.value.job == "setup"


# --- every worker says who it is, on both launch paths --------------------------------


@pytest.mark.parametrize("forkserver", ["1", "0"], ids=["forkserver", "plain"])
def test_pgrep_finds_each_rank_by_its_title(tmp_path, popen, forkserver):
    # Every rank holds at step 2 until the interrupt: a job that could finish
    # first (50 steps of 0.1 s did, twice, on a loaded machine) exits 0.
    proc = _cli(popen, "train", "--stop-at", 50, "--out", tmp_path, "--timeout", 60,
                env={"COURSE_FAULT": _held_at(2, tmp_path),
                     "COURSE_FORKSERVER": forkserver})
    _wait_for_step(proc, tmp_path, 1)
    job = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    for rank in (0, 1):
        found = subprocess.run(["pgrep", "-f", f"rank {rank}/2 train {tmp_path}"],
                               capture_output=True, text=True).stdout.split()
        assert len(found) == 1 and int(found[0]) in job, (rank, found)
        assert _workers_of(proc)[rank].pid == int(found[0])
    torchrun = (tmp_path / "logs" / "launches.jsonl")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert all_gone(list(job))
    record = json.loads(torchrun.read_text().splitlines()[-1])
    assert record["path"] == ("forkserver" if forkserver == "1" else "plain")
    shown = (tmp_path / "logs" / "torchrun.log").read_text().splitlines()[0]
    assert shown.startswith("$ torchrun --nnodes=1 --nproc-per-node=2 ")
    assert " -m course_lib.jobs.worker --run-file " in shown


# --- a stopped rank, a killed CLI ------------------------------------------------------


def test_a_stopped_rank_is_named_and_nothing_survives(tmp_path, popen):
    # Counted from the agent's start, so it must cover the start-up too: on the
    # plain path fresh interpreters import torch, and 6 s sometimes ended the
    # job before its first step (2 of 6 plain runs).
    timeout = 30
    started = time.monotonic()
    # Rank 1 holds at step 2, and is stopped there: rank 0 waits for it in
    # step 2's all-reduce, however late the signal comes.
    proc = _cli(popen, "train", "--stop-at", 50, "--out", tmp_path, "--timeout", timeout,
                env={"COURSE_FAULT": _held_at(2, tmp_path, rank=1)})
    _wait_for_step(proc, tmp_path, 1)
    stopped = _workers_of(proc)[1]
    stopped.send_signal(signal.SIGSTOP)
    _, stderr = proc.communicate(timeout=timeout + 60)
    assert proc.returncode == 1, stderr
    assert time.monotonic() - started < timeout + 30
    first = stderr.splitlines()[0]
    assert first.startswith("course-lib: job failed: rank 1 failed at step"), first
    assert f"timed out after {timeout} s" in first and "stopped (SIGSTOP)" in first
    assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE


def test_killing_the_cli_takes_torchrun_and_workers_with_it(tmp_path, popen):
    proc = _cli(popen, "train", "--continuous", "--out", tmp_path,
                env={"COURSE_FAULT": _held_at(2, tmp_path)})
    _wait_for_step(proc, course_lib.continuous_dir(tmp_path), 1)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    server = 1 if launch.uses_forkserver("gloo") else 0  # the plain path has none
    assert len(tree) >= 3 + server, "(the fork server,) torchrun's agent and two workers"
    proc.kill()
    proc.wait(timeout=10)
    assert all_gone(tree, within=10)
    with runlock.hold(tmp_path):  # the dead run's lock went with it
        pass


# --- one run per run directory -----------------------------------------------------


def test_a_second_run_into_the_same_out_is_refused(tmp_path, tmp_path_factory, popen):
    # The first run waits at step 2 until the test lets it go: it is still
    # running when the second one asks, however slow the machine.
    go = tmp_path_factory.mktemp("event") / "go"
    first = _cli(popen, "train", "--stop-at", 12, "--out", tmp_path,
                 env={"COURSE_FAULT": json.dumps({"kind": "hold", "step": 2,
                                                  "until": str(go)})})
    _wait_for_step(first, tmp_path, 1)
    second = course_lib_cli("train", "--stop-at", 3, "--out", tmp_path)
    assert first.poll() is None, "the first run must still be running"
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is in use by PID {first.pid}" in lines[0], second.stderr
    go.touch()
    out, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert json.loads(out)["restarts"] == []
    assert checkpoint.latest_valid(tmp_path) == checkpoint.step_dir(tmp_path, 12)
    steps = [r.step for r in logs.steps(tmp_path)[0]]
    assert steps == list(range(1, 13))


# --- a full disk ------------------------------------------------------------------------


def test_disk_full_is_a_clear_error_and_no_partial_checkpoint_counts(
        tmp_path, small_ckpt_config, capsys):
    cfg = course_lib.load_config(small_ckpt_config)
    with pytest.raises(launch.LaunchError) as err:
        course_lib.train(cfg, tmp_path, stop_at=8, timeout=300,
                       fault={"kind": "enospc", "rank": 0, "step": 6})
    first = str(err.value).splitlines()[0]
    assert first.startswith("rank 0 failed in train at step 8: OSError: [Errno 28] "
                            "No space left on device"), first
    assert checkpoint.latest_valid(tmp_path) == checkpoint.step_dir(tmp_path, 5)
    capsys.readouterr()
    assert cli.main(["check-checkpoints", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ok   checkpoints/step-0005",
        "skip checkpoints/step-0008.tmp (an interrupted write, never loaded)"]
