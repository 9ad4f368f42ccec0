"""The frameworks' recipes: the table, the pure predictions, the graded
questions, and one real torchrun run of `course-lib recipes` (gloo/CPU)."""

import json

import pytest
import torch

from course_lib import steps
from course_lib.course import lr_scale, quiz
from course_lib.jobs import audit as audits
from course_lib.jobs import recipes as recipe_audit
from course_lib.jobs.recipes import RecipesReport
from course_lib.reports.store import report_path
from course_lib.steps import recipes
from course_lib.steps.recipes import BIASED, EXACT, NAN, RAISES, RECIPES, SCALED, ZERO_STEP
from tests.conftest import course_lib_cli

# The survey's facts, written out independently of the registry.
EXACT_RECIPES = {"course_rule", "fairseq", "hf_trainer_5_10_1",
                 "torchtitan_fsdp", "megatron_per_token"}
SCALED_RECIPES = {"hf_trainer_avg_tokens", "accelerate_docs", "torchtitan_ddp"}
# Biased on skewed counts, but only uniformly scaled when the counts are
# equal: a missing 1/M (M), rank means counted before the shift (N / (N + R)).
SCALED_WHEN_BALANCED = SCALED_RECIPES | {"hf_trainer_4_46_mean_loss",
                                         "hf_trainer_local_tokens"}
# Checks whose verdicts the survey predicts per recipe, beside parity.
INVARIANCES = ["world_size_invariance", "no_sync"]
EMPTY_WINDOW = {
    "course_rule": "raises",  # EmptyWindowError on every rank
    "fairseq": "zero step",
    "hf_trainer_le_4_45": "zero step, NaN loss",
    "hf_trainer_4_46_0": "zero step, NaN loss",
    "hf_trainer_4_46_mean_loss": "zero step, NaN loss",
    "hf_trainer_local_tokens": "zero step, NaN loss",
    "hf_trainer_avg_tokens": "zero step, NaN loss",
    "hf_trainer_5_10_1": "zero step, NaN loss",
    "accelerate_accumulate": "zero step, NaN loss",
    "accelerate_docs": "zero step, NaN loss",
    "torchtitan_pre_2206": "zero step, NaN loss",
    "torchtitan_fsdp": "raises",  # stops on a non-finite loss
    "torchtitan_ddp": "zero step, NaN loss",
    "megatron_default": "zero step",
    "megatron_pre_clamp": "NaN gradients",
    "megatron_per_token": "zero step",
    "lightning": "zero step, NaN loss",
    "nanogpt": "zero step, NaN loss",
    "deepspeed": "zero step, NaN loss",
}


# --- the table ----------------------------------------------------------------------


def test_every_recipe_has_its_sources_and_a_prediction():
    assert set(RECIPES) == set(EMPTY_WINDOW)
    for name, r in RECIPES.items():
        for field in ("label", "framework", "versions", "citation", "backprop",
                      "reduction", "verdict"):
            assert getattr(r, field).strip(), (name, field)
        assert r.objective in recipes.OBJECTIVES, name
        assert r.empty[0] in (RAISES, ZERO_STEP, NAN), name
        assert r.predicted_empty == EMPTY_WINDOW[name], name
        assert (r.objective == "token_mean") == (name in EXACT_RECIPES), name
        assert r.func.__doc__, name


def test_every_row_says_what_the_real_code_measured():
    """Each recipe names the matrix rows that ran its real code, or why none
    did; every such row trained the recipe's objective; and every measured
    row belongs to exactly one recipe (4.46.2, whose ranks disagree, to none)."""
    from course_lib.jobs.frameworks import Matrix

    matrix = Matrix.committed()
    for name, r in RECIPES.items():
        found = recipe_audit.real_code(r, matrix)
        assert bool(r.real) != bool(r.unrun), name
        if r.real:
            assert found.rows and found.agrees, (name, found.text())
            assert found.text().startswith("run: ") and "as predicted" in found.text()
        else:
            assert found.text().startswith("not run (")
    for row in matrix.measured:
        owners = [n for n, r in RECIPES.items()
                  if any(recipe_audit.selects(sel, row) for sel in r.real)]
        where = f"{row.entry} {row.model} {row.flags}"
        if row.verdict == "ranks disagree":
            assert owners == [], where
        else:
            assert len(owners) == 1, (where, owners)


def test_the_readme_table_says_what_the_real_code_measured():
    """README's recipes table: one row per recipe, whose last column says
    what the matrix says (run, or not run)."""
    from tests.conftest import ROOT

    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| ") and "`)" in line]
    for name, r in RECIPES.items():
        if name == "course_rule":
            continue
        mine = [line for line in rows if f"(`{name}`)" in line]
        assert len(mine) == 1, name
        last = mine[0].rstrip(" |").rsplit("|", 1)[-1].strip()
        if r.real:
            assert last.split(":")[0] in ("confirmed", "added from the runs") or \
                last.startswith("corrected by the runs"), (name, last)
        else:
            assert last.startswith("not run"), (name, last)


def test_recipes_load_by_name_and_leave_the_bug_catalog_alone():
    info = steps.load("megatron_per_token")
    assert (info.name, info.kind) == ("megatron_per_token", "recipe")
    assert info.setup is not None, "a SUM reduction needs its comm hook"
    assert steps.load("torchtitan_ddp").setup is None
    assert {s.kind for s in steps.BUILTIN.values()} == {"correct", "bug"}
    assert not set(steps.BUILTIN) & set(RECIPES)


# --- predictions and measurements: pure functions ----------------------------------------


def shape(counts, rows=0):
    return recipes.WindowShape(counts, rows)


def test_predictions_follow_the_counts():
    even, skewed = shape([[8, 8], [8, 8]], 4), shape([[3, 5], [8, 8]], 4)
    p = recipes.predict
    assert p("token_mean", skewed) == recipes.Prediction(EXACT)
    assert p("microbatch_means", even).verdict == EXACT
    assert p("microbatch_means", skewed).verdict == BIASED
    # Per-rank means only need equal rank totals.
    assert p("rank_means", shape([[3, 5], [4, 4]])).verdict == EXACT
    assert p("rank_means", skewed).verdict == BIASED
    assert p("world_scaled", skewed) == recipes.Prediction(SCALED, 0.5)
    assert p("world_scaled", shape([[3, 5]])).verdict == EXACT
    assert p("shift_scaled", skewed) == recipes.Prediction(SCALED, 24 / 28)
    assert p("shift_scaled", shape([[3, 5], [8, 8]], 0)).verdict == EXACT
    # Rank means counted before the shift: equal N_r + R_r is the shift's scale.
    assert p("rank_means_pre_shift", recipes.WindowShape([[3, 5], [4, 3]], 1, (0, 1))
             ) == recipes.Prediction(SCALED, 15 / 16)
    assert p("rank_means_pre_shift", recipes.WindowShape([[3, 5], [4, 4]], 2, (0, 2))
             ).verdict == BIASED
    # Microbatch means without 1/M: M times the token mean on equal n only.
    assert p("microbatch_sums", even) == recipes.Prediction(SCALED, 2.0)
    assert p("microbatch_sums", skewed).verdict == BIASED


def test_classify_tells_exact_scaled_biased_and_nan():
    torch.manual_seed(0)
    ref = torch.randn(1000, dtype=torch.float64)
    tol = recipes.EXACT_TOL["float64"]
    assert recipes.classify(ref.clone(), ref, tol).verdict == EXACT
    scaled = recipes.classify(ref * 0.75, ref, tol)
    assert scaled.verdict == SCALED and scaled.factor == pytest.approx(0.75, rel=1e-12)
    assert scaled.relative_error == pytest.approx(0.25)
    biased = recipes.classify(ref + 0.1 * torch.randn(1000, dtype=torch.float64), ref, tol)
    assert biased.verdict == BIASED and biased.factor is None
    bad = ref.clone()
    bad[3] = float("nan")
    assert recipes.classify(bad, ref, tol).verdict == recipes.NON_FINITE
    assert recipes.matches(scaled, recipes.Prediction(SCALED, 0.75))
    assert not recipes.matches(scaled, recipes.Prediction(SCALED, 0.7))


def test_empty_outcomes_and_the_pytorch_facts_behind_them():
    zero, nan = torch.zeros(4), torch.tensor([0.0, float("nan")])
    assert recipes.empty_outcome(True, [nan]) == RAISES
    assert recipes.empty_outcome(False, [zero, zero]) == ZERO_STEP
    assert recipes.empty_outcome(False, [zero, nan]) == NAN
    logits = torch.randn(2, 3, 5, requires_grad=True)
    ignored = torch.full((2, 3), -100)
    for loss_of, value_nan, grad_nan in [
        (lambda: recipes.mean_ce(logits, ignored), True, False),
        (lambda: recipes.sum_ce(logits, ignored) / 0, True, False),
        (lambda: recipes.masked_sum(logits, ignored) / 0, True, True),
    ]:
        logits.grad = None
        loss = loss_of()
        loss.backward()
        assert bool(loss.isnan()) == value_nan
        assert bool(logits.grad.isnan().any()) == grad_nan
        if not grad_nan:
            assert not logits.grad.any(), "ignored targets give exactly zero gradients"


def test_predictions_on_the_parity_window_without_a_launch(cfg, corpus):
    found = recipe_audit.predicted_on_parity_window(cfg, corpus)
    assert found["torchtitan_ddp"] == recipes.Prediction(SCALED, 0.5)
    assert found["lightning"].verdict == BIASED
    assert 0.98 < found["hf_trainer_avg_tokens"].factor < 1


# --- graded questions ---------------------------------------------------------------------


def test_exercises_grade_without_giving_the_answer_away():
    assert str(quiz.check("production_recipes.1", 511 / 512)) == "correct"
    assert str(quiz.check("production_recipes.2", 0.4)) == "correct"
    assert str(quiz.check("production_recipes.3", "megatron_pre_clamp")) == "correct"
    assert str(quiz.check("production_recipes.5", "world_size_invariance")) == "correct"
    for n, wrong in [(1, 1.0), (2, 0.05), (3, "fairseq"), (4, 0.5), (5, "trajectory")]:
        qid = f"production_recipes.{n}"
        verdict = quiz.check(qid, wrong)
        assert not verdict.correct and str(verdict).startswith("not yet: "), qid
        answer = quiz.QUESTIONS[qid].expected()
        assert "correct" not in str(verdict)
        if isinstance(answer, str):
            assert answer not in str(verdict), qid
        else:
            assert f"{answer:.3g}" not in str(verdict), qid


def test_the_prediction_is_the_set_of_exact_recipes():
    q = quiz.QUESTIONS["production_recipes.predict"]
    assert "course_rule" not in q.choices()
    assert set(q.expected()) == EXACT_RECIPES - {"course_rule"}
    assert quiz.check("production_recipes.predict",
                      sorted(EXACT_RECIPES - {"course_rule"})).correct
    picked = sorted(EXACT_RECIPES - {"course_rule"} | {"torchtitan_ddp"})
    assert not quiz.check("production_recipes.predict", picked).correct


def test_a_uniform_scale_moves_sgd_and_barely_adam(cfg, corpus):
    runs = lr_scale.simulate(cfg, corpus, (1.0, 0.5), updates=2)
    drift = {(r.optimizer, r.factor): r.drift for r in runs}
    assert drift[("sgd", 1.0)] == drift[("adam", 1.0)] == 0.0
    assert drift[("sgd", 0.5)] > 0.1
    assert drift[("adam", 0.5)] < 1e-2
    assert "Adam" in lr_scale.describe(runs)


# --- one real run ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`course-lib recipes --checks parity`: chapter 10's launch (one, at W = 2),
    which `make test` runs once for both (course_lib/replay.py)."""
    out = tmp_path_factory.mktemp("recipes")
    return out, course_lib_cli("recipes", "--checks", "parity", "--out", out)


@pytest.fixture(scope="module")
def invariances(tmp_path_factory, cfg):
    """The other predicted checks on every recipe: an audit launch at W = 2,
    then one each at W = 1 and W = 4 for world_size_invariance."""
    out = tmp_path_factory.mktemp("recipe-invariances")
    return audits.audit(cfg, out, list(RECIPES), INVARIANCES, timeout=600)




@pytest.mark.torchrun
def test_the_command_exits_0_and_writes_the_report(run):
    out, proc = run
    assert proc.returncode == 0, proc.stderr
    report = RecipesReport.load(out)
    assert report.every_prediction_holds
    assert list(report.recipes) == list(RECIPES)
    assert report.checks == ["parity"]
    for name in RECIPES:
        assert name in proc.stdout
    data = json.loads(report_path(out, "recipes").read_text())
    for row in data["recipes"].values():
        assert {"framework", "versions", "citation", "checks", "verdict",
                "relative_error", "empty_window"} <= set(row)
    assert RecipesReport.load(out) == RecipesReport.from_dict(data)


@pytest.mark.torchrun
def test_exact_recipes_pass_parity_and_the_others_fail_on_skewed_counts(run, invariances):
    report = RecipesReport.load(run[0])
    assert set(invariances) == set(report.recipes)
    for name, row in report.recipes.items():
        assert row.checks["parity"] == (name in EXACT_RECIPES), name
        checks = invariances[name].checks
        assert list(checks) == INVARIANCES, name
        assert checks["no_sync"].passed, name
        # A per-rank mean, a 1/W and a missing 1/M change with W; a mean
        # of microbatch means over the same microbatches does not.
        assert checks["world_size_invariance"].passed == (
            name not in {"hf_trainer_4_46_0", "hf_trainer_4_46_mean_loss",
                         "hf_trainer_local_tokens", "torchtitan_ddp"}), name
        skewed = row.regimes["skewed"]
        assert (skewed.verdict == EXACT) == (name in EXACT_RECIPES), name
        # Equal counts hide every bias; only a uniform scale still shows.
        balanced = row.regimes["balanced"].verdict
        assert balanced == (SCALED if name in SCALED_WHEN_BALANCED else EXACT), name


@pytest.mark.torchrun
def test_uniform_scales_match_their_predicted_factor(run):
    report = RecipesReport.load(run[0])
    for regime, info in report.regimes.items():
        n, r = info.global_tokens, info.first_label_rows
        expected = {"torchtitan_ddp": 1 / report.world_size,
                    "hf_trainer_avg_tokens": n / (n + r), "accelerate_docs": n / (n + r)}
        for name, factor in expected.items():
            result = report.recipes[name].regimes[regime]
            assert result.verdict == SCALED, (name, regime)
            assert result.factor == pytest.approx(factor, rel=1e-6), (name, regime)
            assert result.residual < 1e-5, "collinear with the reference"
    balanced = report.regimes["balanced"]
    assert len({n for rank in balanced.microbatch_tokens for n in rank}) == 1


@pytest.mark.torchrun
def test_each_verdict_and_empty_window_is_as_predicted(run):
    report = RecipesReport.load(run[0])
    for name, row in report.recipes.items():
        assert row.matches, name
        for regime, result in row.regimes.items():
            assert result.verdict == result.predicted_verdict, (name, regime)
        assert recipe_audit.empty_text(row) == EMPTY_WINDOW[name], name
