"""The audit's pieces that need no torchrun: step specs, checks, layouts, reports."""

import dataclasses
import importlib

import pytest
import torch

from course_lib import checks, steps
from course_lib.checks import CheckResult, world_size
from course_lib.checks.world_size import WORLD_SIZES
from course_lib.core import objectives
from course_lib.jobs import audit as audits
from course_lib.jobs.audit import AuditReport
from course_lib.rank import harness
from course_lib.rank.context import JobState, RankContext
from course_lib.steps import catalog

STEP_FILE = '''
from course_lib.steps import catalog as steps

def my_step(model, microbatches, world_size):
    """A learner's step."""
    catalog.global_token(model, microbatches, world_size)
'''


def test_builtin_catalog_is_complete_and_described():
    kinds = {}
    for name, info in steps.BUILTIN.items():
        assert info.name == name and callable(info.func)
        assert info.kind in ("correct", "bug")
        assert info.description and info.why, name
        kinds.setdefault(info.kind, []).append(name)
    assert set(kinds["correct"]) == {"global_token", "sum_hook", "post_scale",
                                     "pad_to_longest_rank"}
    assert "mean_of_means" in kinds["bug"]
    assert len(kinds["bug"]) - 1 >= 6, "at least six real mistakes besides the control"
    assert steps.BUILTIN["sum_hook"].setup is not None
    assert steps.BUILTIN["global_token"].setup is None


def test_step_specs_by_module_and_by_path(tmp_path, monkeypatch):
    assert steps.load("course_lib.steps.catalog:post_scale").func is catalog.post_scale
    (tmp_path / "mine.py").write_text(STEP_FILE)
    monkeypatch.chdir(tmp_path)
    info = steps.load("mine.py:my_step")
    assert (info.name, info.kind) == ("my_step", "custom")
    assert info.description == "A learner's step."
    (spec, _), = audits.resolve_steps(["mine.py:my_step"])
    assert spec == f"{tmp_path / 'mine.py'}:my_step", "workers get an absolute path"


@pytest.mark.parametrize("spec, needle", [
    ("nope", "is not a built-in step"),
    ("no/such/file.py:f", "no such file"),
    ("course_lib.steps.catalog:nope", "has no function 'nope'"),
    ("no_such_module_xyz:f", "cannot import"),
])
def test_bad_step_specs_are_one_line_errors(spec, needle):
    with pytest.raises(steps.StepSpecError, match=needle) as err:
        steps.load(spec)
    assert "\n" not in str(err.value)


def test_a_step_file_that_fails_to_import_is_bad_input(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("def step(model, mb, w):\n    return (\n")
    with pytest.raises(steps.StepSpecError, match="failed to import: SyntaxError"):
        steps.load(f"{f}:step")


def test_parse_checks():
    assert audits.parse_checks(None) == list(checks.NAMES)
    assert audits.parse_checks("no_sync, parity,parity") == ["no_sync", "parity"]
    with pytest.raises(audits.AuditInputError, match="unknown check 'speed'"):
        audits.parse_checks("parity,speed")
    with pytest.raises(audits.AuditInputError):
        audits.with_dtype(None, "float16")


LAYOUT = [[[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 10, 11, 12], [13, 14, 15, 16]]]


def _ids(layout):
    return sorted(i for rank in layout for mb in rank for i in mb)


def test_accumulation_layouts_keep_each_ranks_sequences():
    layouts = harness.accumulation_layouts(LAYOUT)
    assert list(layouts) == ["1x8", "2x4", "4x2", "8x1"]
    for name, layout in layouts.items():
        a, b = map(int, name.split("x"))
        for rank, original in zip(layout, LAYOUT):
            assert len(rank) == a and all(len(mb) == b for mb in rank)
            assert sorted(i for mb in rank for i in mb) == sorted(
                i for mb in original for i in mb)


def test_permuted_layouts_move_sequences_between_ranks(corpus):
    layouts = harness.permuted_layouts(LAYOUT, corpus, seed=1)
    assert layouts["as planned"] == LAYOUT
    for name, layout in layouts.items():
        assert _ids(layout) == _ids(LAYOUT), name
        assert [len(r) for r in layout] == [2, 2] and all(len(mb) == 4 for r in layout
                                                           for mb in r)
    assert layouts["dealt by length"][0] != LAYOUT[0]


def test_world_size_layout_is_one_set_whatever_w(cfg, corpus):
    ids = world_size.sequences(cfg, corpus)
    assert ids == world_size.sequences(cfg, corpus), "seeded, not drawn anew"
    lengths = [len(corpus.sequences[i]) for i in ids]
    assert lengths == sorted(lengths)
    for w in WORLD_SIZES:
        layout = harness.world_size_layout(ids, w, 8)
        assert len(layout) == w and _ids(layout) == sorted(ids)
        assert all(len(mb) == 8 for rank in layout for mb in rank)


def test_a_token_budget_makes_the_ranks_uneven(cfg, corpus):
    from course_lib.checks.uneven import MAX_TOKENS
    from course_lib.core.data import parity_window

    window = parity_window(cfg, corpus, 2)
    layout = harness.uneven_layout(window, corpus, MAX_TOKENS)
    for rank, original in zip(layout, window, strict=True):  # each rank keeps its own
        assert [i for mb in rank for i in mb] == [i for mb in original for i in mb]
        for mb in rank:
            longest = max(len(corpus.sequences[i]) for i in mb)
            assert len(mb) == 1 or len(mb) * longest <= MAX_TOKENS
    counts = [len(rank) for rank in layout]
    assert counts[0] < counts[1], counts  # long sequences make more microbatches
    sizes = {len(mb) for rank in layout for mb in rank}
    assert len(sizes) > 1  # and microbatches of different sizes
    # One sequence over the budget still gets a microbatch of its own.
    assert harness.token_budget(window[1][0][:2], corpus, 1) == [[window[1][0][0]],
                                                                [window[1][0][1]]]


def test_float64_tolerance_is_the_exactness_bound(cfg):
    assert harness.tolerance(cfg) == (1e-6, 1e-4)
    assert harness.tolerance(audits.with_dtype(cfg, "float64")) == (1e-12, 0.0)
    # Named: the same tolerances as the config at that dtype.
    assert harness.tolerance(cfg, "float64") == (1e-12, 0.0)
    assert harness.tolerance(audits.with_dtype(cfg, "float64"), "float32") == (1e-6, 1e-4)


def test_audit_report_round_trips(tmp_path):
    check = CheckResult(passed=False, max_abs_err=0.5, atol=1e-6, rtol=1e-4,
                                errors={"update 1": 0.5}, note="x")
    report = AuditReport(
        step="s", kind="bug", description="d", world_size=2, backend="gloo",
        device="cpu", dtype="float32", nccl_reference_path=False, torch="2.x",
        compared_values=3,
        checks={"parity": check, "no_sync": dataclasses.replace(
            check, passed=True, max_abs_err=None, agree_after_micro=[False, True])},
        passed=False)
    report.save(tmp_path, "audit-s")
    assert AuditReport.load(tmp_path, "audit-s") == report
    with pytest.raises(ValueError, match="AuditReport lacks key 'passed'"):
        AuditReport.from_dict({k: v for k, v in dataclasses.asdict(report).items()
                               if k != "passed"})


def _rank_context(cfg, corpus, out) -> RankContext:
    """Rank 0 of a launch, in this process: enough for the references (no collective)."""
    return RankContext(cfg, 0, cfg.train.world_size, "gloo", torch.device("cpu"), corpus,
                       JobState(out=out))


def test_each_objective_gets_its_own_parity_reference(cfg, corpus, tmp_path):
    # One launch may audit several objectives: one context, the token mean
    # first, then the sequence mean, whose reference a fresh context computes.
    shared = _rank_context(cfg, corpus, tmp_path)
    token = harness.parity_reference(shared.auditing("token")).grad
    sequence = harness.parity_reference(shared.auditing("sequence")).grad
    alone = harness.parity_reference(_rank_context(cfg, corpus, tmp_path).auditing(
        objectives.parse("sequence"))).grad
    assert not torch.allclose(token, alone)  # the objectives differ on this window
    assert torch.equal(sequence, alone)


PLANTED = '''
from course_lib.checks.base import Check

CHECK = Check("planted", "a check with no way to run")
'''


def test_a_check_without_exactly_one_way_to_run_fails_at_import(tmp_path, monkeypatch):
    (tmp_path / "planted_check.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(checks.CheckDefinitionError, match="exactly one way to run"):
        importlib.import_module("planted_check")
    both = checks.CHECKS["uneven_microbatches"].apart
    with pytest.raises(checks.CheckDefinitionError, match="exactly one way to run"):
        checks.Check("both", "in the launch and apart", run=lambda a: None, apart=both)
    with pytest.raises(checks.CheckDefinitionError, match="exactly one of"):
        checks.Apart(both.spec, both.rank, both.collect)  # neither plan nor run
    with pytest.raises(checks.CheckDefinitionError, match="share the name"):
        checks.registry(checks.CHECKS["parity"], checks.CHECKS["parity"])


def test_every_check_run_apart_has_its_job_registered():
    from course_lib.jobs import KINDS

    apart = [c for c in checks.CHECKS.values() if c.apart is not None]
    assert {c.name for c in apart} == {"world_size_invariance", "uneven_microbatches"}
    for c in apart:
        assert c.apart is not None and KINDS[c.apart.spec.TAG].run is c.apart.rank


def test_an_audit_is_described_in_the_learners_language(monkeypatch):
    """describe_audit's frame and verdicts go through the catalog (a French
    chapter prints them); the check names and the report's notes stay as
    the report has them. The CLI prints English whatever the edition."""
    from course_lib.core import edition

    check = CheckResult(passed=False, max_abs_err=0.0469, atol=1e-6, rtol=1e-4, note="x")
    report = AuditReport(
        step="s", kind="bug", description="d", world_size=2, backend="gloo", device="cpu",
        dtype="float32", nccl_reference_path=False, torch="2.x", compared_values=3,
        checks={"parity": check, "no_sync": dataclasses.replace(
            check, passed=True, max_abs_err=None, note="ranks agree")}, passed=False)
    english = audits.describe(report)
    assert english.splitlines()[1] == "  parity                   FAIL  max |err| 0.0469 " \
                                      "(atol 1e-06, rtol 0.0001)"
    monkeypatch.setenv(edition.ENV, "fr")
    french = audits.describe(report).splitlines()
    assert french[0] == "Audit de s (bug)\N{NO-BREAK SPACE}: 2 rangs, gloo sur CPU, float32"
    assert french[1] == "  parity                   ÉCHEC     max |err| 0,0469 " \
                        "(atol 1e-06, rtol 0,0001)"
    assert french[2] == "  no_sync                  RÉUSSITE  ranks agree"
    assert french[-1].split() == ["verdict", "ÉCHEC"]
