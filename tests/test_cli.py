"""CLI contract: exit 0 / 1 / 2, one-line errors on bad input."""

import json
import re
import subprocess
import sys

import pytest

from course_lib import cli
from tests.conftest import ROOT, course_lib_cli


def _run(*args):
    """The entry point itself: a fresh interpreter, torch's import included."""
    return subprocess.run([sys.executable, "-m", "course_lib", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def _one_line(proc, needle):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_check_loss_prints_2_versus_2_5():
    proc = _run("check-loss")
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    assert (out["mean_of_means"], out["global_mean"]) == (2.0, 2.5)
    assert out["local_tokens"] == [12, 36]


@pytest.mark.parametrize("args,needle", [
    (["parity", "--world-size", "0"], "--world-size"),
    (["train", "--stop-at", "-1"], "--stop-at"),
    (["nonsense"], "invalid choice"),
    (["parity", "--backend", "mpi"], "--backend"),
    (["clean", "--scope", "everything"], "--scope"),
    (["evaluate", "--config", "configs/nope.yaml"], "no such file"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    _one_line(course_lib_cli(*args), needle)


def test_the_command_itself_refuses_in_one_line():
    """Nothing torch or the course prints at start-up joins the error line."""
    _one_line(_run("parity", "--world-size", "0"), "--world-size")


def test_nccl_on_a_cpu_machine_is_refused_in_one_line():
    from course_lib.run import launch

    if launch.gpu_count() >= 2:
        pytest.skip("this host has GPUs")
    why = re.compile(r"needs 2 GPUs|has no NCCL")
    proc = course_lib_cli("parity", "--backend", "nccl")
    assert proc.returncode == 2
    assert why.search(proc.stderr) and len(proc.stderr.strip().splitlines()) == 1
    env = course_lib_cli("check-env", "--backend", "nccl")
    assert env.returncode == 1 and why.search(env.stdout)


def test_check_env_says_which_path_runs():
    proc = course_lib_cli("check-env")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["world_size"] == 2 and info["backend"] in ("gloo", "nccl")
    assert "NCCL reference path" in info["plan"]


def test_world_size_is_resolved_once_at_the_boundary(tmp_path, cfg):
    # --world-size lands in the config the commands pass down; without it, the config's.
    assert cfg.with_world_size(None) is cfg
    four = json.loads(course_lib_cli("check-env", "--world-size", "4").stdout)
    assert four["world_size"] == 4
    proc = course_lib_cli("prepare", "--world-size", "4", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan"]["world_size"] == 4


def test_clean_dry_run_lists_generated_paths_only(tmp_path, monkeypatch):
    for rel in ("runs/x/reports", "notebooks/.ipynb_checkpoints", "pkg/__pycache__",
                "data", "configs", "notebooks"):
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "__pycache__").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text("{}")
    found = {str(p.relative_to(tmp_path)) for p in cli.generated_paths(tmp_path)}
    assert found == {"runs", "notebooks/.ipynb_checkpoints", "pkg/__pycache__"}
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    assert cli.main(["clean", "--scope", "generated", "--dry-run"]) == 0
    assert (tmp_path / "runs").exists(), "--dry-run deletes nothing"
    assert cli.main(["clean", "--scope", "generated"]) == 0
    assert not (tmp_path / "runs").exists()
    assert (tmp_path / "notebooks" / "01_x.ipynb").exists()
    assert (tmp_path / "data").exists() and (tmp_path / "configs").exists()


def test_prepare_verifies_the_committed_lock(tmp_path):
    proc = course_lib_cli("prepare", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "verified" and len(out["sha256"]) == 64
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan) == 100 and len(plan[0]) == 2 and len(plan[0][0]) == 2
