"""The audit under real torchrun jobs (gloo/CPU): every check's power, float64
exactness, a learner's own step file, and steps that crash, hang or desync."""

import json

import pytest

from course_lib import checks, steps
from course_lib.jobs import audit as audits
from course_lib.jobs.audit import AuditReport, BugsReport
from course_lib.reports.store import report_path
from course_lib.run import launch
from tests.conftest import ROOT, course_lib_cli

pytestmark = [pytest.mark.torchrun, pytest.mark.usefixtures("no_worker_left_behind")]

CORRECT = ("global_token", "sum_hook", "post_scale", "pad_to_longest_rank")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, cfg):
    """Every built-in step through every check: three launches (W = 2, 1, 4)."""
    out = tmp_path_factory.mktemp("bugs")
    return out, audits.bugs(cfg, out, timeout=600)


def test_every_bug_is_caught_and_no_correct_design_is_flagged(catalog):
    out, report = catalog
    assert set(report.steps) == set(steps.BUILTIN)
    assert report.every_bug_caught and report.no_false_alarm
    for name, row in report.steps.items():
        assert set(row.checks) == set(checks.NAMES), name
        if row.kind == "correct":
            assert row.caught_by == [], name
        else:
            assert row.caught_by, f"{name} slipped through every check"
    assert BugsReport.load(out) == report


@pytest.mark.parametrize("check", checks.NAMES)
def test_each_check_has_power(catalog, check):
    """Each check passes every correct design and fails at least one bug."""
    _, report = catalog
    for name in CORRECT:
        assert report.steps[name].checks[check], f"{check} flags {name}"
    assert any(not row.checks[check] for row in report.steps.values()
               if row.kind == "bug"), f"{check} never fails"


def test_the_non_obvious_rows(catalog):
    _, report = catalog
    rows = report.steps
    # Averaging is linear: only the communication is wasted, and only the
    # no_sync probe sees it.
    # on uneven microbatches, though, the rank with more of them syncs alone.
    assert rows["no_sync_backward_only"].caught_by == ["uneven_microbatches", "no_sync"]
    # Join shadows those syncs with zeros: no hang, but a wrong gradient.
    join = rows["join_every_microbatch"]
    assert join.caught_by == ["uneven_microbatches", "no_sync"]
    assert join.max_abs_err["uneven_microbatches"] > 1e-3
    # Right on the first window, wrong later: only the trajectory sees it.
    assert rows["count_never_reset"].caught_by == ["trajectory"]
    # A uniform scale keeps every invariance.
    for name in ("length_before_shift", "forgot_world_size"):
        assert rows[name].checks["permutation_invariance"], name
    assert not rows["forgot_world_size"].checks["world_size_invariance"]
    # The mean of means is a per-rank mean over the window: layout-proof.
    assert rows["mean_of_means"].checks["accumulation_invariance"]
    assert not rows["mean_of_means"].checks["permutation_invariance"]


def test_a_deadlock_on_uneven_microbatches_is_named_and_the_audit_goes_on(catalog):
    out, _ = catalog
    hung = AuditReport.load(out, AuditReport.file_name("no_sync_backward_only"))
    uneven = hung.checks["uneven_microbatches"]
    assert not uneven.passed and uneven.max_abs_err is None
    # The rank with more microbatches waits in a sync that never comes.
    assert "rank 1 did not finish the step within 10 s" in uneven.note, uneven.note
    # The steps after it ran in a launch of their own, and were measured.
    after = AuditReport.load(out, AuditReport.file_name("join_every_microbatch"))
    assert after.checks["uneven_microbatches"].note == "microbatches per rank: 3, 6"
    padded = AuditReport.load(out, AuditReport.file_name("pad_to_longest_rank"))
    assert padded.checks["uneven_microbatches"].passed


def test_audit_reports_hold_the_contract(catalog):
    out, _ = catalog
    data = json.loads(report_path(out, "audit-global_token").read_text())
    assert {"step", "world_size", "backend", "device", "dtype", "checks",
            "passed"} <= set(data)
    assert (data["world_size"], data["backend"], data["dtype"]) == (2, "gloo", "float32")
    assert data["passed"] and list(data["checks"]) == list(checks.NAMES)
    for result in data["checks"].values():
        assert {"passed", "max_abs_err"} <= set(result)
    traj = data["checks"]["trajectory"]
    assert list(traj["errors"]) == [f"update {i}" for i in range(1, 6)]
    assert traj["max_abs_err"] == max(traj["errors"].values()) <= 1e-6
    assert set(data["checks"]["world_size_invariance"]["errors"]) == {"W=1", "W=2", "W=4"}
    assert data["checks"]["no_sync"]["agree_after_micro"] == [False, True]


def test_float64_proves_the_designs_exact(tmp_path, cfg):
    found = audits.audit(cfg, tmp_path, [*CORRECT, "mean_of_means"], ["parity"],
                        dtype="float64", timeout=300)
    for name in CORRECT:
        p = found[name].checks["parity"]
        assert found[name].dtype == "float64"
        assert p.passed and p.max_abs_err <= 1e-12, (name, p.max_abs_err)
    assert not found["mean_of_means"].checks["parity"].passed


LEARNER_STEPS = '''
"""Steps a learner might write."""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F


def my_step(model, microbatches, world_size):
    """Count first, then W * S / N under no_sync."""
    n = sum((labels != -100).sum() for _, labels in microbatches)
    dist.all_reduce(n)
    for i, (inputs, labels) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                   ignore_index=-100, reduction="sum")
            (loss * world_size / n).backward()


def local_mean(model, microbatches, world_size):
    """The mean of my own tokens."""
    n = sum((labels != -100).sum() for _, labels in microbatches)
    for i, (inputs, labels) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                   ignore_index=-100, reduction="sum")
            (loss / n).backward()


def crashes_on_rank_1(model, microbatches, world_size):
    if dist.get_rank() == 1:
        raise ValueError("a bug on rank 1 only")
    my_step(model, microbatches, world_size)


def hangs_on_rank_1(model, microbatches, world_size):
    my_step(model, microbatches, world_size)
    if dist.get_rank() == 1:
        import time
        time.sleep(3600)


def extra_collective_on_rank_0(model, microbatches, world_size):
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(3))
    my_step(model, microbatches, world_size)
'''


@pytest.fixture
def step_file(tmp_path):
    path = tmp_path / "learner_steps.py"
    path.write_text(LEARNER_STEPS)
    return path


def test_a_learners_step_file_is_audited_by_path(step_file, tmp_path):
    good = course_lib_cli("audit", "--step", f"{step_file.name}:my_step", "--checks",
                          "parity,no_sync", "--out", tmp_path / "run", cwd=step_file.parent)
    assert good.returncode == 0, good.stderr
    assert "Audit of my_step (custom)" in good.stdout
    report = AuditReport.load(tmp_path / "run", "audit-my_step")
    assert report.passed and list(report.checks) == ["parity", "no_sync"]
    bad = course_lib_cli("audit", "--step", f"{step_file}:local_mean", "--checks", "parity",
                         "--out", tmp_path / "run")
    assert bad.returncode == 1
    assert "local_mean fails parity" in bad.stderr
    assert not AuditReport.load(tmp_path / "run", "audit-local_mean").passed


def test_bad_audit_input_is_refused_before_any_launch(tmp_path):
    for args, needle in [(["--step", "nope"], "not a built-in step"),
                         (["--step", "global_token", "--checks", "speed"], "unknown check"),
                         (["--step", "global_token", "--dtype", "float16"], "invalid choice")]:
        proc = course_lib_cli("audit", *args, "--out", tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr
    assert not (tmp_path / "logs").exists(), "nothing was launched"


@pytest.mark.parametrize("name, culprit, needle", [
    ("crashes_on_rank_1", 1, "ValueError: a bug on rank 1 only"),
    ("hangs_on_rank_1", 1, "rank 1 did not finish the step within 2 s"),
    # Rank 0 aborts inside gloo: whether rank 1 logs its lost connection
    # before torchrun stops it is a race; either way rank 0 is named.
    ("extra_collective_on_rank_0", 0, ""),
])
def test_a_misbehaving_step_names_its_rank(step_file, tmp_path, cfg, name, culprit,
                                           needle):
    with pytest.raises(launch.LaunchError) as err:
        audits.audit(cfg, tmp_path, [f"{step_file}:{name}"], ["parity"],
                    step_timeout=2, timeout=120)
    first = str(err.value).splitlines()[0]
    assert first.startswith(f"rank {culprit} failed in audit (step {name}"), first
    assert needle in first
    assert err.value.rank == culprit


def _chapter_05_skeleton(tmp_path):
    """my_step_fixed.py as chapter 05 writes it, TODOs and all."""
    nb = json.loads((ROOT / "notebooks" / "05_bug_lab.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                  and "".join(c["source"]).startswith("%%writefile {lab}/my_step_fixed.py"))
    path = tmp_path / "skeleton.py"  # its own name: the audit keys steps by name
    path.write_text(source.split("\n", 1)[1].replace("def my_step(", "def skeleton("))
    return path


def test_chapter_05s_worked_step_passes_where_its_skeleton_fails(tmp_path, cfg):
    """The instructors' completion of chapter 05's skeleton passes the three
    checks the chapter runs; the skeleton as the learner finds it fails parity."""
    solution = ROOT / "docs" / "solutions" / "bug_lab_my_step.py"
    skeleton = _chapter_05_skeleton(tmp_path)
    found = audits.audit(cfg, tmp_path / "run", [f"{solution}:my_step", f"{skeleton}:skeleton"],
                         ["parity", "accumulation_invariance", "no_sync"])
    solved, unsolved = found["my_step"], found["skeleton"]
    assert all(r.passed for r in solved.checks.values()), solved
    assert not unsolved.checks["parity"].passed
