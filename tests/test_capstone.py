"""The capstone's grader (``course-lib capstone check``): the shipped script
fails it, the worked solution passes, each bug planted in the script, put
back alone into the solution, fails the property that names it, and a file
that cannot be graded gets one line and exit 2.

Every file graded here shares two launches (``capstone.grade``: one per
world size); a function that raises costs one launch each."""

import os
import signal
import subprocess
import sys

import pytest

from course_lib.jobs import capstone
from course_lib.jobs.capstone import CapstoneReport
from course_lib.run.placement import free_port
from tests.conftest import ROOT, course_lib_cli

SHIPPED = ROOT / "examples" / "capstone" / "train.py"
SOLUTION = ROOT / "docs" / "solutions" / "capstone_train.py"

STEP = tuple(capstone.STEP_CHECKS)
EVALUATE = ("evaluate_w2", "evaluate_w3")
# Each bug of the shipped script, put back alone into the solution: its
# (old, new) text, the property that must catch it, and the properties it
# may fail at all (those of the function it lives in).
BUGS = {
    "mean_of_means": (("labels) * world_size / n\n", "labels) / local\n"), "parity", STEP),
    "padding_counted": (("[supervised_mask(labels).sum() for _, labels in microbatches]",
                         "[torch.tensor(labels.numel()) for _, labels in microbatches]"),
                        "parity", STEP),
    "extra_accumulation_division": (("            loss.backward()\n",
                                     "            (loss / len(microbatches)).backward()\n"),
                                    "parity", STEP),
    "sampler_forgotten": (('    sampler.load_state_dict(state["sampler"])\n', ""),
                          "resume", ("resume",)),
    "rank_0_rng_everywhere": (('torch.load(path / f"rank-{dist.get_rank()}.pt"',
                               'torch.load(path / "rank-0.pt"'), "resume", ("resume",)),
    "mean_of_rank_means": (("""    dist.all_reduce(totals)
    loss, tokens, correct = totals.tolist()
    return {"loss_per_token": loss / tokens, "token_accuracy": correct / tokens}""",
                            """    loss, tokens, correct = totals.tolist()
    means = torch.tensor([loss / tokens, correct / tokens], dtype=torch.float64)
    dist.all_reduce(means)
    return {"loss_per_token": float(means[0]) / world,
            "token_accuracy": float(means[1]) / world}"""), "evaluate_w2", EVALUATE),
    # W = 2 divides the 256 test sequences: DistributedSampler pads nothing there.
    "padded_duplicates": (('list(corpus.splits["test"])[rank::world]',
                           '[corpus.splits["test"][i] for i in torch.utils.data.Distributed'
                           'Sampler(range(len(corpus.splits["test"])), shuffle=False)]'),
                          "evaluate_w3", ("evaluate_w3",)),
}


def with_bug(tmp_path, name):
    (old, new), _, _ = BUGS[name]
    source = SOLUTION.read_text()
    assert source.count(old) == 1, f"{name}: the solution no longer holds {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory, cfg):
    """Every file graded here, in the grader's two launches: name -> (its
    run directory, its report)."""
    tmp = tmp_path_factory.mktemp("capstone")
    files = {"shipped": SHIPPED, "solution": SOLUTION,
             **{name: with_bug(tmp, name) for name in BUGS}}
    found = capstone.grade(cfg, tmp / "launch", {tmp / n: f for n, f in files.items()},
                           timeout=600)
    return {n: (tmp / n, found[(tmp / n).resolve()]) for n in files}


pytestmark = pytest.mark.usefixtures("no_worker_left_behind")


@pytest.mark.torchrun
def test_the_worked_solution_passes(graded):
    run_dir, report = graded["solution"]
    assert report.passed and report.failed == [], report.failed
    assert list(report.properties) == list(capstone.PROPERTIES)
    assert "world_size_invariance" in report.properties
    # Its save renames a whole staging folder into place (chapter 06).
    assert (run_dir / "capstone" / "step-0002" / "state.pt").is_file()
    assert not (run_dir / "capstone" / "step-0002.tmp").exists()
    assert report.properties["resume"].max_abs_err == 0.0
    for w in EVALUATE:  # float64 round-off, on every rank
        assert report.properties[w].max_abs_err <= 1e-12 * 3


@pytest.mark.torchrun
def test_the_shipped_script_fails_in_every_part(graded):
    _, report = graded["shipped"]
    assert not report.passed
    assert {"parity", "resume", "evaluate_w2", "evaluate_w3"} <= set(report.failed)
    text = capstone.describe(report)
    assert "parity                   FAIL  the gradient differs from the " \
           "single-process reference" in text
    assert "resume                   FAIL  stop, save, load" in text and text.endswith("FAIL")


@pytest.mark.torchrun
@pytest.mark.parametrize("name", list(BUGS))
def test_each_planted_bug_alone_is_caught_by_its_property(graded, name):
    _, caught_by, may_fail = BUGS[name]
    _, report = graded[name]
    assert caught_by in report.failed, (name, report.failed)
    assert set(report.failed) <= set(may_fail), (name, report.failed)
    if name == "padded_duplicates":  # why the grader evaluates at W = 3 too
        assert report.failed == ["evaluate_w3"]


@pytest.mark.torchrun
def test_the_reports_are_written_where_asked(graded):
    run_dir, report = graded["shipped"]
    assert CapstoneReport.load(run_dir) == report
    assert (run_dir / "reports" / "audit-step.json").is_file()  # the audit's own report


@pytest.mark.torchrun
def test_the_cli_prints_each_property_and_exits_1_on_a_failure(graded, monkeypatch,
                                                               tmp_path):
    monkeypatch.setenv("COURSE_EDITION", "fr")  # a French kernel's: the CLI stays English
    for name, code in (("shipped", 1), ("solution", 0)):
        monkeypatch.setattr(capstone, "check", lambda *a, _r=graded[name][1], **k: _r)
        proc = course_lib_cli("capstone", "check", SHIPPED, "--out", tmp_path)
        assert proc.returncode == code, proc.stderr
        lines = proc.stdout.splitlines()
        assert [ln.split()[0] for ln in lines[1:-2]] == list(capstone.PROPERTIES)
        assert lines[0].startswith("Capstone check of ")
        assert lines[-2].split()[-1] == ("FAIL" if code else "PASS")
        if code:
            assert "fails parity," in proc.stderr and "resume" in proc.stderr


BROKEN = {
    "syntax": ("def step(model, microbatches, world_size):",
               "def step(model, microbatches, world_size)", "SyntaxError"),
    "missing": ("def evaluate(model, corpus, device):",
                "def score(model, corpus, device):", "has no function 'evaluate'"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_file_that_cannot_be_graded_gets_one_line_before_any_launch(tmp_path, name):
    old, new, needle = BROKEN[name]
    path = tmp_path / f"{name}.py"
    path.write_text(SOLUTION.read_text().replace(old, new, 1))
    proc = course_lib_cli("capstone", "check", path, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr
    assert proc.stderr.startswith("course-lib: error: ")
    assert not (tmp_path / "out").exists(), "nothing was launched"


@pytest.mark.parametrize("args, needle", [
    (["grade", SOLUTION], "invalid choice"),
    (["check", ROOT / "no_such_file.py"], "no such file"),
    (["check", SOLUTION, "--world-size", "4"], "picks its world sizes"),
    (["check", SOLUTION, "--backend", "nccl"], "runs gloo on the CPU"),
    (["check", SOLUTION, "--nnodes", "2", "--rdzv-endpoint", "h:1"], "runs on one node"),
])
def test_bad_arguments_get_one_line(tmp_path, args, needle):
    proc = course_lib_cli("capstone", *args, "--out", tmp_path / "out")
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


RAISES = {
    # In the audit's launch, by the audit's own job.
    "step": ("    local = torch.stack(", "    raise ValueError('no step today')\n"
             "    local = torch.stack("),
    # In the capstone's own job.
    "save": ("    path = Path(path)\n    rank = ", "    raise OSError('disk full')\n"
             "    path = Path(path)\n    rank = "),
}


@pytest.mark.torchrun
@pytest.mark.parametrize("name", list(RAISES))
def test_a_function_that_raises_in_the_job_is_named_in_one_line(tmp_path, name):
    old, new = RAISES[name]
    source = SOLUTION.read_text()
    assert source.count(old) == 1
    path = tmp_path / f"raises_in_{name}.py"
    path.write_text(source.replace(old, new))
    proc = course_lib_cli("capstone", "check", path, "--out", tmp_path / "out",
                          "--timeout", "300")
    assert proc.returncode == 2, proc.stderr
    # The error is one line, the last; text progress (make test) may come before it.
    *_, line = proc.stderr.strip().splitlines()
    assert proc.stderr.count("course-lib:") == 1, proc.stderr
    assert line.startswith(f"course-lib: error: raises_in_{name}.py: {name}() raised "), line


@pytest.mark.torchrun
def test_the_shipped_script_runs_as_its_docstring_says(tmp_path):
    """Its own main, under torchrun: it trains, checkpoints and evaluates."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
           "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(SHIPPED), "--updates", "2", "--save-every", "1", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            text=True, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # timed out: the agent and its workers go together
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err[-3000:]}"
    assert "update 2/2: checkpoint" in out and "nats per token" in out, out
    assert (tmp_path / "step-0001" / "state.pt").is_file()
    assert (tmp_path / "step-0002" / "state.pt").is_file()
