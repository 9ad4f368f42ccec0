"""Every benchmark runs on main: each once, in its quick mode, in one
subprocess. Only the exit status and the figure line are asserted, never a
time (the numbers of a quick run measure nothing)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

# benchmark -> the line that carries its figure (the number's digits only).
FIGURE = {
    "window_efficiency": r"^efficiency \d+\.\d{3}$",
    "normalization_overhead": r"^overhead ratio global_token / mean_of_means: \d+\.\d{3} ",
    "scaling": r"^ 2 +\d+\.\d +\d+\.\d +\S+ +\S+ +\d+\.\d{3}$",  # the W = 2 row
    "crash_loop": r"^1/1 passed in \d+ s$",
    "frameworks_overhead": r"^  median ratio \d+\.\d\d, max \d+\.\d\d \(target <= 2\)$",
    "frameworks_matrix": r"^matrix: [1-9]\d* rows, read back \(frameworks-matrix\.json left",
    "trl_grpo_loss": r"^trl-[\d.]+/dapo/spg=ga +loss [+-]\d\.\d+e[+-]\d+ vs ",
    "frameworks_logging": r"^[1-9]\d* recipes measured, frameworks-logging\.json left as it is",
    "mixed_precision": r"^mean of means error / rule error, autocast_bf16: \d+\.\d$",
    "trl_grpo_trainer": r"^[1-9]\d* case\(s\) in \d+ s, trl-grpo-trainer\.json left as it is",
}
# A benchmark whose quick mode would still be its whole subject, and why.
NOT_QUICK = {
    "course_time": "it times `make course`: papermill runs the chapters in a Jupyter "
                   "kernel and it clears runs/course, the chapters' shared run directory",
}

pytestmark = pytest.mark.torchrun


def test_every_benchmark_has_a_quick_run_or_a_reason():
    found = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert found == set(FIGURE) | set(NOT_QUICK), "a benchmark without a quick run here"
    assert not set(FIGURE) & set(NOT_QUICK)


@pytest.fixture(scope="module")
def runs():
    # One interpreter runs them in turn, each as `python SCRIPT --quick` would
    # (tests/machinery/quick_runs.py): most of a quick run in an interpreter
    # of its own was importing torch and starting an agent server.
    proc = subprocess.run([sys.executable, "-m", "tests.machinery.quick_runs", *FIGURE],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: subprocess.CompletedProcess([str(BENCHMARKS / f"{name}.py"), "--quick"],
                                              run["returncode"], run["stdout"], run["stderr"])
            for name, run in json.loads(proc.stdout).items()}


@pytest.mark.parametrize("name", list(FIGURE))
def test_the_benchmark_runs_and_prints_its_figure(runs, name):
    proc = runs[name]
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert re.search(FIGURE[name], proc.stdout, re.MULTILINE), f"{name}:\n{proc.stdout}"
