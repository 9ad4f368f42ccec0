"""scripts/gpu_check.py on a CPU host: its refusal, its plan, and its timeouts.

No stage of the real plan runs here (they need CUDA); the executor is tested
with tiny fake commands."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
QUICK = [sys.executable, "-S", "-c"]  # no site: a fake command starts fast


@pytest.fixture
def gc(monkeypatch):
    """The script as a module; the variable it sets on import is undone after."""
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def stage(gc, tmp_path, name, code, timeout=30.0, read=None, env=None):
    return gc.Stage(name=name, title=name, argv=(*QUICK, code), timeout=timeout,
                    read=read or (lambda s, run: gc.Verdict({"stdout": run.stdout})),
                    out=tmp_path / name, env=env or dict(gc.STAGE_ENV))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def marked(mark: str) -> list[int]:
    """PIDs of live processes whose environment carries ``mark``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("GPU_CHECK_TEST") == mark and alive(p.pid):
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


# (a) no CUDA: nothing runs, one line, exit 2 ---------------------------------

def test_without_cuda_it_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU this host has
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "gpu")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gpu-check: no CUDA device visible (torch ")
    assert lines[0].endswith("run it on a GPU host")
    assert r.stdout == ""
    assert not (tmp_path / "gpu").exists()


# (b) the plan ---------------------------------------------------------------

def test_plan_for_one_gpu(gc, tmp_path):
    stages = {s.name: s for s in gc.plan(1, tmp_path)}
    assert list(stages) == ["check_env", "reference", "parity_nccl_w1", "parity_nccl_w2",
                            "parity_gloo_cuda_w2", "audit_global_token_f64",
                            "chapter04_papermill"]
    env = stages["check_env"].argv
    assert env[env.index("--backend") + 1] == "nccl" and "--launch" in env
    assert env[env.index("--world-size") + 1] == "1"

    w1 = stages["parity_nccl_w1"]
    assert (w1.backend, w1.device, w1.world_size) == ("nccl", "cuda", 1)
    assert w1.argv[w1.argv.index("--world-size") + 1] == "1"

    w2 = stages["parity_nccl_w2"]  # NCCL refuses two ranks on one GPU
    assert w2.argv is None and w2.world_size == 2
    assert "NCCL refuses two ranks on one GPU" in w2.skip

    gloo = stages["parity_gloo_cuda_w2"].argv
    assert gloo[gloo.index("--backend") + 1] == "gloo"
    assert gloo[gloo.index("--device") + 1] == "cuda"
    assert gloo[gloo.index("--world-size") + 1] == "2"

    audit = stages["audit_global_token_f64"].argv
    assert audit[audit.index("--step") + 1] == "global_token"
    assert audit[audit.index("--dtype") + 1] == "float64"
    assert audit[audit.index("--device") + 1] == "cuda"

    nb = stages["chapter04_papermill"]
    assert "papermill" in nb.argv and "notebooks/04_ddp_parity.ipynb" in nb.argv
    params = {nb.argv[i + 1]: nb.argv[i + 2] for i, a in enumerate(nb.argv) if a == "-p"}
    assert params["backend"] == "nccl" and params["world_size"] == "1"
    assert str(nb.out) in nb.argv[nb.argv.index("notebooks/04_ddp_parity.ipynb") + 1]


def test_plan_for_two_gpus(gc, tmp_path):
    stages = {s.name: s for s in gc.plan(2, tmp_path)}
    assert "parity_nccl_w1" not in stages  # W = number of GPUs
    w2 = stages["parity_nccl_w2"]
    assert w2.skip is None
    assert w2.argv[w2.argv.index("--backend") + 1] == "nccl"
    assert w2.argv[w2.argv.index("--world-size") + 1] == "2"
    env = stages["check_env"].argv
    assert env[env.index("--world-size") + 1] == "2"
    nb = stages["chapter04_papermill"].argv
    assert nb[nb.index("world_size") + 1] == "2"
    # more GPUs: still at most 2 ranks
    assert [(s.name, s.world_size) for s in gc.plan(8, tmp_path)] == \
        [(s.name, s.world_size) for s in stages.values()]


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_every_stage_has_a_timeout_within_the_budget(gc, tmp_path, gpus):
    stages = gc.plan(gpus, tmp_path)
    assert all(s.timeout > 0 for s in stages)
    assert sum(s.timeout for s in stages) < 600
    for s in stages:
        assert s.env["COURSE_FORKSERVER"] == "0"
        if s.argv and "--timeout" in s.argv:  # course-lib's own job timeout fires first
            assert float(s.argv[s.argv.index("--timeout") + 1]) < s.timeout
    outs = [s.out for s in stages]
    assert len(set(outs)) == len(outs)  # each run its own --out ...
    assert all(o.is_relative_to(tmp_path) for o in outs)  # ... under runs/gpu
    for s in stages:
        if s.argv and "--out" in s.argv:
            assert s.argv[s.argv.index("--out") + 1] == str(s.out)


def test_main_with_a_fake_gpu_reports_not_run_and_exit_codes(gc, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.setattr(gc, "gpu_count", lambda: 1)
    monkeypatch.setattr(gc, "host_info", lambda: {"torch": "fake", "nvidia_smi": []})
    ran = []

    def fake_execute(s, logs):
        ran.append(s.name)
        status = gc.NOT_RUN if s.argv is None else gc.PASSED
        return gc.StageResult(s.name, s.title, status, s.skip or "ok", 0.0, {},
                              list(s.argv) if s.argv else None, s.timeout)

    monkeypatch.setattr(gc, "execute", fake_execute)
    out = tmp_path / "gpu"
    assert gc.main(["--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    by_name = {s["name"]: s for s in report["stages"]}
    assert ran == list(by_name)
    assert by_name["parity_nccl_w2"]["status"] == "not run"
    assert "NCCL refuses two ranks on one GPU" in by_name["parity_nccl_w2"]["reason"]
    assert report["passed"] and report["counts"] == {"passed": 6, "failed": 0, "not run": 1}
    assert (out / "summary.txt").read_text().strip() in capsys.readouterr().out

    def failing(s, logs):
        r = fake_execute(s, logs)
        if s.name == "reference":
            r.status = gc.FAILED
        return r

    monkeypatch.setattr(gc, "execute", failing)
    assert gc.main(["--out", str(out)]) == 1
    assert json.loads((out / "report.json").read_text())["passed"] is False


# (c) the executor -------------------------------------------------------------

def test_a_hanging_stage_is_killed_with_its_process_group(gc, tmp_path):
    mark = uuid.uuid4().hex
    pids = tmp_path / "pids"
    sleeper = [sys.executable, "-S", "-c", "import time; time.sleep(60)"]
    code = (  # a child in its process group, one in a session of its own (like
              # torchrun's workers), then hang
        "import subprocess, time\n"
        f"a = subprocess.Popen({sleeper!r})\n"
        f"b = subprocess.Popen({sleeper!r}, start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n"
        "time.sleep(60)\n")
    s = stage(gc, tmp_path, "hang", code, timeout=1.0,
              env={**gc.STAGE_ENV, "GPU_CHECK_TEST": mark})
    r = gc.execute(s, tmp_path / "logs")
    assert r.status == gc.FAILED
    assert "timed out after 1 s" in r.reason and "killed" in r.reason
    assert r.returncode is not None and r.returncode < 0  # died of a signal
    assert pids.is_file(), "the fake command did not get as far as its children"
    children = [int(p) for p in pids.read_text().split()]
    assert [p for p in children if alive(p)] == []
    assert marked(mark) == []


def test_a_stage_that_exits_non_zero_fails_with_its_last_line(gc, tmp_path):
    code = "import sys; print('course-lib: job failed: boom', file=sys.stderr); sys.exit(3)"
    r = gc.execute(stage(gc, tmp_path, "bad", code), tmp_path / "logs")
    assert r.status == gc.FAILED
    assert r.returncode == 3
    assert r.reason == "exit 3: course-lib: job failed: boom"
    assert "boom" in Path(r.log).read_text()


def test_a_stage_is_judged_by_its_reader(gc, tmp_path):
    code = "print('{\"backend\": \"nccl\", \"device\": \"cpu\", \"all_reduce\": \"ok\"}')"
    s = stage(gc, tmp_path, "env", code, read=gc.read_check_env)
    s = dataclasses.replace(s, backend="nccl", device="cuda")
    r = gc.execute(s, tmp_path / "logs")
    assert r.status == gc.FAILED and r.reason == "ran on device cpu, expected cuda"

    ok = stage(gc, tmp_path, "ok", "import os; print(os.environ['COURSE_FORKSERVER'])")
    r = gc.execute(ok, tmp_path / "logs")
    assert (r.status, r.reason, r.figures) == (gc.PASSED, "ok", {"stdout": "0\n"})


def test_a_stage_that_cannot_run_here_is_not_run(gc, tmp_path):
    s = gc.Stage(name="w2", title="w2", argv=None, timeout=10, read=gc.read_parity,
                 out=tmp_path / "w2", skip=gc.NCCL_ONE_GPU)
    r = gc.execute(s, tmp_path / "logs")
    assert (r.status, r.reason, r.returncode) == (gc.NOT_RUN, gc.NCCL_ONE_GPU, None)
    assert not (tmp_path / "w2").exists()


def test_parity_reader_reads_both_modes(gc, tmp_path):
    s = gc.plan(1, tmp_path)[2]
    (s.out / "reports").mkdir(parents=True)
    (s.out / "reports" / "parity.json").write_text(json.dumps({
        "world_size": 1, "backend": "nccl", "device": "cuda", "passed": True,
        "modes": {"global_token": {"max_abs_err": 1e-8, "allclose": True, "violations": 0},
                  "mean_of_means": {"max_abs_err": 2e-8, "allclose": True,
                                    "violations": 0}}}))
    v = s.read(s, gc.Outcome(0, "", ""))
    assert v.problem is None
    assert v.figures["global_token.max_abs_err"] == 1e-8
    assert v.figures["mean_of_means.max_abs_err"] == 2e-8
