"""Real torchrun jobs on CPU with gloo: parity, resume, faults, refusals."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import course_lib
from course_lib.core import checkpoint, paths
from course_lib.core.normalize import MODES
from course_lib.course.api import EvaluationReport
from course_lib.jobs.bench import BenchJob, BenchReport
from course_lib.jobs.exercise import ExerciseReport
from course_lib.jobs.parity import ParityReport
from course_lib.jobs.resume import ResumeReport
from course_lib.jobs.smoke import SmokeJob
from course_lib.reports import logs
from course_lib.run import launch, processes
from course_lib.run.runfile import LaunchRecord
from tests.conftest import ROOT, course_lib_cli, is_job, with_train
from tests.machinery import replay

pytestmark = [pytest.mark.torchrun, pytest.mark.usefixtures("no_worker_left_behind")]


@pytest.fixture(scope="module")
def protocol_run(tmp_path_factory, cfg):
    """The whole protocol once, shared by the tests below; under `make test`
    its launches replay the chapters' (course_lib/replay.py)."""
    out = tmp_path_factory.mktemp("protocol")
    ex = course_lib.load_config(ROOT / "configs" / "exercise.yaml")
    table = course_lib.run_all(cfg, out, ex, timeout=600)
    return out, table


# --- parity -------------------------------------------------------------------


def test_parity_correct_mode_passes_and_mean_of_means_fails(protocol_run, cfg):
    out, _ = protocol_run
    p = ParityReport.load(out)
    assert (p.world_size, p.backend, p.device, p.dtype) == (2, "gloo", "cpu", "float32")
    assert p.compared_values == 112_480
    assert (p.atol, p.rtol) == (1e-6, 1e-4)
    assert p.correct.allclose and p.correct.violations == 0
    assert p.correct.max_abs_err <= 1e-6
    assert not p.control_mode.allclose and p.control_mode.max_abs_err > 1e-3
    assert p.control_mode.violations > 0
    assert p.local_tokens[0] < p.local_tokens[1], "short band on rank 0"
    assert sum(p.local_tokens) == p.global_tokens
    assert p.passed and p.nccl_reference_path is False and p.extra == {}


def test_no_sync_holds_grads_apart_until_the_last_microbatch(protocol_run):
    out, _ = protocol_run
    p = ParityReport.load(out)
    for mode in ("global_token", "mean_of_means"):
        assert p.no_sync[mode].ranks_agree_after_micro == [False, True]


@pytest.mark.parametrize("world", [1, 3, 4])
def test_parity_other_world_sizes(tmp_path, cfg, world):
    p = course_lib.parity(cfg, tmp_path, world_size=world, timeout=300)
    assert p.world_size == world and len(p.local_tokens) == world
    assert p.correct.allclose and p.correct.max_abs_err <= 1e-6
    if world == 1:
        assert p.control_mode.allclose
        assert p.control == "not applicable: with one rank the two modes coincide"
    else:
        assert not p.control_mode.allclose and p.control_mode.max_abs_err > 1e-3
    assert p.passed


def test_bench_job_times_each_share_between_the_windows(tmp_path, cfg):
    """window_efficiency.py's job: every round, a DDP window per mode, then
    each rank's share alone on rank 0 while rank 1 waits; the rounds pair up."""
    bench = BenchJob(windows=2, warmup=1, repeats=3, alone=True)
    launch.launch(cfg, tmp_path, [bench], data_dir=paths.data_dir(), timeout=120)
    r = BenchReport.load(tmp_path)
    assert r.windows_timed_per_mode == 3 and set(r.median_seconds) == set(MODES)
    assert len(r.global_token_seconds) == 3
    assert [len(shares) for shares in r.alone_seconds] == [3, 3]
    assert all(t > 0 for shares in r.alone_seconds for t in shares)


def test_locally_empty_rank_still_matches_the_reference(tmp_path, cfg):
    p = course_lib.parity(with_train(cfg, empty_ranks=(1,)), tmp_path, timeout=300)
    assert p.local_tokens[1] == 0 and p.global_tokens == p.local_tokens[0] > 0
    assert p.correct.allclose and p.correct.max_abs_err <= 1e-6
    # The naive mode divides 0 by 0 on rank 1: it cannot even produce numbers.
    assert not p.control_mode.allclose


def test_globally_empty_window_stops_every_rank_with_the_same_error(tmp_path, cfg):
    started = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        course_lib.train(with_train(cfg, empty_ranks=(0, 1)), tmp_path, stop_at=5,
                       timeout=120)
    assert time.monotonic() - started < 60, "must fail fast, not by timeout"
    first = str(err.value).splitlines()[0]
    assert first.startswith("ranks 0, 1 failed in train at step 1")
    assert "no supervised token in the global window" in first
    found = logs.records(tmp_path)
    messages = {r: [x.message for x in recs if isinstance(x, logs.Error)]
                for r, recs in found.items()}
    assert messages[0] == messages[1] and len(messages[0]) == 1


# --- resume, ablations, evaluation, exercise ----------------------------------


def test_resume_is_bitwise_identical(protocol_run, cfg):
    out, table = protocol_run
    r = ResumeReport.load(out)
    assert r.step == 100 and r.identical and r.max_abs_param_diff == 0.0
    assert r.compared_values == 112_480
    assert "resume at step 100" in table and "IDENTICAL" in table


def test_every_ablation_changes_the_trajectory(protocol_run):
    out, _ = protocol_run
    r = ResumeReport.load(out)
    assert set(r.ablations) == {"model_only", "no_optimizer_state",
                                "sampler_from_seed", "no_rng_state"}
    # the yardstick the ablations' drift is measured against is the continuous run
    assert r.reference_max_abs_param_diff == 0.0
    for name, a in r.ablations.items():
        assert a.matters and a.max_abs_param_diff > 1e-4, name
    seed = r.ablations["sampler_from_seed"]
    assert seed.first_window_after_resume == 0
    assert seed.window_expected_after_resume == 50


def test_train_logs_describe_one_trajectory(protocol_run, cfg):
    out, _ = protocol_run
    found = logs.records(out)
    assert set(found) == {0, 1}
    for records in found.values():
        steps = [x.step for x in records if isinstance(x, logs.Step)]
        assert steps == list(range(1, 101))
        for x in records:
            if x.event == "step":  # every step line decodes as a Step: its counts and sum
                assert isinstance(x, logs.Step) and not x.extra
                assert x.global_tokens >= x.local_tokens >= 0
    curve = logs.loss_curve(out)
    continuous = logs.loss_curve(course_lib.continuous_dir(out))
    assert curve == continuous, "the resumed loss curve is the continuous one"


def test_each_step_logs_the_windows_token_mean_on_every_rank(protocol_run):
    """The log line's loss is sum_r S_r / N, the same on every rank: the
    value the per-rank sums give, never a rank's own S_r / N_r."""
    out, _ = protocol_run
    curve = dict(logs.loss_curve(out))
    found = logs.records(out)
    for records in found.values():
        for x in records:
            if isinstance(x, logs.Step):
                assert x.loss == pytest.approx(curve[x.step], rel=1e-12, abs=0)
    by_step = [{x.step: x for x in recs if isinstance(x, logs.Step)}
               for recs in found.values()]
    own = [abs(r[1].local_loss_sum / r[1].local_tokens - r[1].loss) for r in by_step]
    assert by_step[0][1].loss == by_step[1][1].loss and min(own) > 1e-3


def test_evaluation_sits_between_floor_and_untrained(protocol_run):
    out, _ = protocol_run
    e = EvaluationReport.load(out)
    assert e.test_sequences == 256
    assert e.test_tokens == sum(n - 1 for n in course_lib.corpus(
        course_lib.load_config()).lengths("test"))
    assert e.entropy_floor < e.loss_per_token < e.untrained.loss_per_token
    assert e.loss_per_token < e.untrained.loss_per_token - 1.0
    assert e.token_accuracy > e.untrained.token_accuracy


def test_the_trained_model_on_two_ranks_equals_one_process(protocol_run, cfg, tmp_path):
    """W = 2 divides the 256 test sequences: no repeat, yet the mean of the
    rank means still differs from the token mean."""
    out, _ = protocol_run
    single = EvaluationReport.load(out)
    e = course_lib.evaluate_run(cfg, tmp_path, checkpoint.step_dir(out, cfg.train.updates),
                                world_size=2, timeout=300)
    d = e.distributed
    assert (e.world_size, d.repeats, e.step) == (2, 0, cfg.train.updates)
    got = [d.token_weighted.loss_per_token, d.token_weighted.token_accuracy]
    want = [single.loss_per_token, single.token_accuracy]
    assert d.matches_single_process
    assert torch.allclose(torch.tensor(got, dtype=torch.float64),
                          torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0.0)
    assert d.duplicates_kept == d.token_weighted
    assert abs(d.mean_of_rank_means.loss_per_token - single.loss_per_token) > 1e-6
    assert e.checkpoint == str(checkpoint.step_dir(out, cfg.train.updates).resolve())


def test_exercise_scenarios(protocol_run):
    out, _ = protocol_run
    x = ExerciseReport.load(out)
    by_name = {sc.name: sc for sc in x.scenarios}
    bal, skew = by_name["balanced"], by_name["skewed"]
    assert bal.tokens == [12, 12] and skew.tokens == [12, 36]
    assert (bal.mean_of_means, bal.global_mean) == (2.0, 2.0)
    assert (skew.mean_of_means, skew.global_mean) == (2.0, 2.5)
    for sc in (bal, skew):
        assert sc.gradients.global_token.allclose
    assert bal.gradients.mean_of_means.allclose, "equal counts: no bias"
    assert not skew.gradients.mean_of_means.allclose
    # the error as a share of the gradient (chapter 04 sets it beside the loss's)
    assert max(bal.gradients.relative_err.values()) < 1e-6
    assert skew.gradients.relative_err["global_token"] < 1e-6
    assert skew.gradients.relative_err["mean_of_means"] > 0.1


# --- faults -------------------------------------------------------------------


def test_crashed_rank_is_named_with_its_step(tmp_path, cfg):
    with pytest.raises(launch.LaunchError) as err:
        course_lib.train(cfg, tmp_path, stop_at=10, timeout=120,
                       fault={"kind": "crash", "rank": 1, "step": 3})
    e = err.value
    assert (e.rank, e.step, e.job) == (1, 3, "train")
    first = str(e).splitlines()[0]
    assert first.startswith("rank 1 failed in train at step 3")
    assert "injected fault" in first
    assert '"step": 2' in e.log_tail, "the tail shows the rank's last good step"


def test_timeout_kills_the_whole_job(tmp_path, cfg):
    started = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        course_lib.train(cfg, tmp_path, stop_at=10, timeout=6, fault={"delay": 60})
    assert time.monotonic() - started < 40
    assert "timed out after 6 s" in str(err.value).splitlines()[0]
    assert err.value.rank in (0, 1)


def test_interrupt_kills_the_job_and_exits_130(tmp_path, popen):
    env = {**os.environ, "COURSE_FAULT": json.dumps({"delay": 0.5}),
           "COURSE_PROGRESS": "text"}
    proc = popen([sys.executable, "-m", "course_lib", "train", "--continuous",
                  "--out", str(tmp_path)], env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    log = tmp_path / "continuous" / "logs" / "train-rank0.jsonl"
    deadline = time.monotonic() + 60
    while not (log.exists() and '"event": "step"' in log.read_text()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted by the user" in stderr


def test_sigkilled_job_resumes_from_its_latest_checkpoint(tmp_path, cfg, protocol_run, popen):
    """SIGKILL the job's process group between checkpoints, resume from the
    latest valid checkpoint, and land exactly on the continuous run."""
    env = {**os.environ, "COURSE_FAULT": json.dumps({"delay": 0.08})}
    proc = popen([sys.executable, "-m", "course_lib", "train", "--continuous",
                  "--out", str(tmp_path)], env=env,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = course_lib.continuous_dir(tmp_path)
    deadline = time.monotonic() + 120
    while checkpoint.latest_valid(run_dir) is None or _last_step(run_dir) < 37:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    # The agent and its workers, which share its process group; not the
    # agent server, which shares the CLI's.
    job = [p for p in processes.descendants(proc.pid)
           if is_job(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" "))]
    assert job
    os.killpg(os.getpgid(job[0]), signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    latest = checkpoint.latest_valid(run_dir)
    assert latest.name in ("step-0025", "step-0050")
    done = course_lib_cli("train", "--resume", latest, "--out", run_dir)
    assert done.returncode == 0, done.stderr
    got = checkpoint.load_params(checkpoint.step_dir(run_dir, 100))
    want = checkpoint.load_params(checkpoint.step_dir(
        course_lib.continuous_dir(protocol_run[0]), 100))
    assert checkpoint.compare_params(got, want)["identical"]


def test_elastic_restarts_survive_killed_workers_bit_identically(tmp_path, protocol_run,
                                                                 popen):
    """SIGKILL one worker (not the job) at random steps, three times; torchrun
    restarts the workers, they resume from the newest valid checkpoint, and
    the run ends exactly where the uninterrupted one does."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    config = tmp_path / "every5.yaml"
    config.write_text((ROOT / "configs" / "minimum.yaml").read_text()
                      .replace("checkpoint_every: 25", "checkpoint_every: 5"))
    env = {**os.environ, "COURSE_FAULT": json.dumps({"delay": 0.03}),
           "COURSE_PROGRESS": "none"}
    proc = popen([sys.executable, "-m", "course_lib", "train", "--continuous",
                  "--config", config, "--max-restarts", "3", "--out", tmp_path],
                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = course_lib.continuous_dir(tmp_path)
    kills = []
    for low, high in ((3, 28), (36, 62), (70, 94)):
        target = rng.randint(low, high)
        deadline = time.monotonic() + 180
        while _last_step(run_dir) < target:
            assert time.monotonic() < deadline, f"seed {seed}: step {target} never came"
            assert proc.poll() is None, f"seed {seed}: {proc.communicate()}"
            time.sleep(0.02)
        rank = rng.randint(0, 1)
        victim = processes.workers(proc.pid).get(rank)
        assert victim is not None, f"seed {seed}: rank {rank}'s worker not found"
        victim.send_signal(signal.SIGKILL)
        kills.append((rank, _last_step(run_dir)))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"seed {seed}, kills {kills}: {err}"
    restarts = json.loads(out)["restarts"]
    assert [r["restart"] for r in restarts] == [1, 2, 3], (seed, kills, restarts)
    for r, (_, seen) in zip(restarts, kills):
        # The newest checkpoint before the kill: step `seen` may be logged
        # while its own checkpoint is still being written.
        resumed = r["resumed_from_step"]
        assert resumed % 5 == 0 and seen - 5 <= resumed <= seen + 5, (seed, kills, restarts)
    steps = [x.step for x in logs.steps(run_dir)[0]]
    assert steps == list(range(1, 101)), "the log describes one trajectory"
    got = checkpoint.load_params(checkpoint.step_dir(run_dir, 100))
    want = checkpoint.load_params(checkpoint.step_dir(
        course_lib.continuous_dir(protocol_run[0]), 100))
    assert checkpoint.compare_params(got, want)["identical"], (seed, kills)


def _last_step(run_dir):
    path = run_dir / "logs" / "train-rank0.jsonl"
    steps = [json.loads(line).get("step") or 0 for line in path.read_text().splitlines()
             if line.strip().endswith("}")] if path.exists() else []
    return max(steps, default=0)


# --- refusals: exit 2, one line, nothing lost ----------------------------------


def _one_line_refusal(proc, needle):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_resume_refuses_what_does_not_fit(protocol_run, tmp_path):
    out, _ = protocol_run
    stop = checkpoint.step_dir(out, 50)
    before = sorted(p.name for p in (out / "checkpoints").iterdir())

    other = tmp_path / "other.yaml"
    other.write_text((ROOT / "configs" / "minimum.yaml").read_text()
                     .replace("lr: 0.5", "lr: 0.25"))
    _one_line_refusal(
        course_lib_cli("train", "--resume", stop, "--config", other, "--out", out),
        "train.lr: 0.5 in the checkpoint, 0.25 now")
    _one_line_refusal(
        course_lib_cli("train", "--resume", stop, "--world-size", 3, "--out", out),
        "world size 2, this run has 3")

    edited = tmp_path / "edited" / "step-0050"
    shutil.copytree(stop, edited)
    trainer = json.loads((edited / "trainer.json").read_text())
    trainer["data_lock"] = "f" * 64
    (edited / "trainer.json").write_text(json.dumps(trainer))
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["files"]["trainer.json"] = checkpoint._sha256(edited / "trainer.json")
    (edited / "manifest.json").write_text(json.dumps(manifest))
    _one_line_refusal(course_lib_cli("train", "--resume", edited, "--out", tmp_path / "x"),
                      "data lock ffffffffffff differs")

    truncated = tmp_path / "trunc" / "checkpoints" / "step-0050"
    shutil.copytree(stop, truncated)
    model = truncated / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    _one_line_refusal(course_lib_cli("train", "--resume", truncated, "--out", tmp_path / "y"),
                      "model.pt: sha256 mismatch")
    check = course_lib_cli("check-checkpoints", "--out", tmp_path / "trunc")
    assert check.returncode == 1 and "BAD  checkpoints/step-0050" in check.stdout
    assert "model.pt" in check.stderr

    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before
    good = course_lib_cli("check-checkpoints", "--out", out)
    assert good.returncode == 0 and good.stdout.count("ok   ") == 8, good.stdout


def test_compare_prints_the_diff(protocol_run):
    out, _ = protocol_run
    proc = course_lib_cli("compare", checkpoint.step_dir(out, 100),
                checkpoint.step_dir(course_lib.continuous_dir(out), 100))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["max_abs_param_diff"] == 0.0 and result["compared_values"] == 112_480
    far = json.loads(course_lib_cli("compare", checkpoint.step_dir(out, 25),
                          checkpoint.step_dir(out, 100)).stdout)
    assert far["max_abs_param_diff"] > 0


def test_check_env_launch_runs_one_all_reduce(tmp_path):
    proc = course_lib_cli("check-env", "--launch", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["all_reduce"] == "ok"
    env = json.loads((tmp_path / "reports" / "environment.json").read_text())
    assert env["all_reduce"] == 3 and env["world_size"] == 2


def test_an_identical_launch_runs_once_per_replay_store(tmp_path, cfg, monkeypatch):
    """replay.py: the second identical launch copies the first one's files;
    a launch with a fault always runs."""
    store = tmp_path / "store"
    monkeypatch.setenv(replay.ENV, str(store))
    seen = {"a": [], "b": []}

    class Sink(launch.progress_mod.Progress):
        def __init__(self, name):
            self.name = name

        def update(self, job, done, total, label=""):
            seen[self.name].append((job, done, total))

    first = course_lib.parity(cfg, tmp_path / "a", progress=Sink("a"))
    again = course_lib.parity(cfg, tmp_path / "b", progress=Sink("b"))
    assert again == first
    assert seen["a"] and seen["b"] == seen["a"], "the replay shows the same progress"
    records = [LaunchRecord.read_all(tmp_path / d)[-1] for d in "ab"]
    assert [r.replayed for r in records] == [False, True]
    assert "replayed" in (tmp_path / "b" / "logs" / "torchrun.log").read_text()
    assert len([p for p in store.iterdir() if p.is_dir()]) == 1
    launch.launch(cfg, tmp_path / "c", [SmokeJob()], data_dir=paths.data_dir(),
                  fault={"delay": 0.0})
    assert not LaunchRecord.read_all(tmp_path / "c")[-1].replayed
    assert len([p for p in store.iterdir() if p.is_dir()]) == 1


def test_a_launch_that_fails_in_a_worker_replays_its_error(tmp_path, cfg, monkeypatch):
    """replay.py: a worker's failure (here the set-up's) is stored with its
    files, and the identical launch raises the same LaunchError."""
    monkeypatch.setenv(replay.ENV, str(tmp_path / "store"))
    errors = []
    for d in "ab":
        with pytest.raises(launch.LaunchError) as err:
            course_lib.parity(cfg, tmp_path / d, timeout=300, collective_timeout=10**15)
        errors.append(err.value)
    assert str(errors[1]) == str(errors[0]) and "OverflowError" in str(errors[0])
    assert (errors[1].rank, errors[1].step, errors[1].job) == (
        errors[0].rank, errors[0].step, errors[0].job)
    records = [LaunchRecord.read_all(tmp_path / d)[-1] for d in "ab"]
    assert [(r.replayed, r.returncode != 0) for r in records] == [(False, True),
                                                                  (True, True)]


def test_a_rendezvous_port_taken_meanwhile_is_retried(tmp_path, cfg, monkeypatch):
    """free_port() releases the port before torchrun binds it: when another
    process takes it in between, the launch picks another port."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = launch.free_port
        monkeypatch.setattr(launch, "free_port", lambda: next(ports, None) or real())
        result = launch.launch(cfg, tmp_path, [SmokeJob()], data_dir=paths.data_dir())
    assert result.returncode == 0
    assert len(LaunchRecord.read_all(tmp_path)) == 2, "one refused, one retried"
