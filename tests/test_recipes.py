"""The frameworks' recipes: the table, the pure predictions, the graded
questions, and one real torchrun run of `course-lib recipes` (gloo/CPU)."""

import json
import re

import pytest
import torch

from course_lib import steps
from course_lib.core import verdicts
from course_lib.core.verdicts import EmptyOutcome, Verdict
from course_lib.course import quiz
from course_lib.jobs import audit as audits
from course_lib.jobs import recipes as recipe_audit
from course_lib.jobs.recipes import RecipesReport
from course_lib.reports.store import report_path
from course_lib.steps import recipes, rl_recipes
from course_lib.steps.recipes import RECIPES
from tests.conftest import course_lib_cli

EXACT, BIASED, SCALED = Verdict.EXACT, Verdict.BIASED, Verdict.SCALED
RAISES, ZERO_STEP, NAN = EmptyOutcome.RAISES, EmptyOutcome.ZERO_STEP, EmptyOutcome.NAN

# The survey's facts, written out independently of the registry.
EXACT_RECIPES = {"course_rule", "fairseq", "hf_trainer_5_10_1",
                 "torchtitan_fsdp", "megatron_per_token",
                 "unsloth_count", "torchtune_distributed",
                 # RL: exact for the advantage-weighted token mean sum A l / N
                 "trl_grpo_dapo", "verl_token_mean", "openrlhf_window", "nemo_rl"}
SCALED_RECIPES = {"hf_trainer_avg_tokens", "accelerate_docs", "torchtitan_ddp",
                  # against the token mean: N / C, N / sequences, 2 N / N_gen
                  "trl_grpo_dr_grpo", "verl_seq_mean_token_sum", "trl_grpo_dapo_spg2"}
# Biased on skewed counts, but only uniformly scaled when the counts are
# equal: a missing 1/M (M), rank means counted before the shift (N / (N + R)).
# (dapo with steps_per_generation = 2 GA is exact there: both windows hold N.)
SCALED_WHEN_BALANCED = SCALED_RECIPES - {"trl_grpo_dapo_spg2"} | {
    "hf_trainer_4_46_mean_loss", "hf_trainer_local_tokens"}
# What each recipe that does not claim the token mean claims, per the survey.
CLAIMS = {"trl_grpo_bnpo": "microbatch_means", "trl_grpo_grpo": "sequence_means",
          "trl_grpo_dr_grpo": "constant", "verl_seq_mean_token_mean": "sequence_means",
          "verl_seq_mean_token_sum": "sequence_sums"}
# Exact for their own objective on both windows, not for the token mean (skewed).
EXACT_FOR_THEIR_CLAIM = set(CLAIMS)
RL_RECIPES = {"trl_grpo_dapo", "trl_grpo_dapo_spg2", "trl_grpo_bnpo", "trl_grpo_grpo",
              "trl_grpo_dr_grpo", "verl_token_mean", "verl_seq_mean_token_mean",
              "verl_seq_mean_token_sum", "verl_dp_actor_legacy", "openrlhf_window",
              "nemo_rl"}
PLAIN_RECIPES = [n for n in RECIPES if n not in RL_RECIPES]
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
    "axolotl": "zero step, NaN loss",
    "unsloth_count": "zero step, NaN loss",
    "llamafactory_v1": "zero step, NaN loss",
    "torchtune_distributed": "NaN gradients",  # scale_grads(W / 0) on zero gradients
    # TRL clamps every count to 1 (or divides by the constant): a finite zero.
    "trl_grpo_dapo": "zero step",
    "trl_grpo_dapo_spg2": "zero step",
    "trl_grpo_bnpo": "zero step",
    "trl_grpo_grpo": "zero step",
    "trl_grpo_dr_grpo": "zero step",
    "verl_token_mean": "zero step, NaN loss",
    "verl_seq_mean_token_mean": "zero step, NaN loss",
    "verl_seq_mean_token_sum": "zero step, NaN loss",
    "verl_dp_actor_legacy": "zero step",  # masked_mean's + 1e-8
    "openrlhf_window": "zero step, NaN loss",
    "nemo_rl": "zero step, NaN loss",
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
        assert r.claims == CLAIMS.get(name, "token_mean"), name
        assert r.claimed == rl_recipes.CLAIMS[r.claims]
        assert r.policy == (name in RL_RECIPES), name


def test_every_row_says_what_the_real_code_measured():
    """Each recipe names the matrix rows that ran its real code, or why none
    did; every such row trained the recipe's objective; and every measured
    row belongs to exactly one recipe (4.46.2, whose ranks disagree, to none)."""
    from course_lib.frameworks import evidence
    from course_lib.frameworks.evidence import Matrix

    matrix = Matrix.committed()
    runs = evidence.LossRuns.committed()
    for name, r in RECIPES.items():
        found = evidence.real_code(r, matrix)
        assert bool(r.real or r.loss_runs) != bool(r.unrun), name
        if r.loss_runs:
            assert not r.real, name
            text = evidence.loss_code_text(r, runs)
            assert text.startswith("run (loss function, trl "), (name, text)
            assert "loss and gradient allclose" in text, (name, text)
        elif r.real:
            assert found.rows and found.agrees, (name, found.text())
            assert found.text().startswith("run: ") and "as predicted" in found.text()
        else:
            assert found.text().startswith("not run (")
    for row in matrix.measured:
        owners = [n for n, r in RECIPES.items()
                  if any(evidence.selects(sel, row) for sel in r.real)]
        where = f"{row.entry} {row.model} {row.flags}"
        if row.verdict == "ranks disagree":
            assert owners == [], where
        else:
            assert len(owners) == 1, (where, owners)


# The recipes table left the README for the site's recipes page, written from
# RECIPES, the committed report and the matrix on each build: its last column
# is checked by tests/test_site.py::test_the_recipes_table_says_what_the_real_code_measured.


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
    tol = verdicts.TOLERANCE.exact["float64"]
    assert verdicts.classify(ref.clone(), ref, tol).verdict == EXACT
    scaled = verdicts.classify(ref * 0.75, ref, tol)
    assert scaled.verdict == SCALED and scaled.factor == pytest.approx(0.75, rel=1e-12)
    assert scaled.relative_error == pytest.approx(0.25)
    biased = verdicts.classify(ref + 0.1 * torch.randn(1000, dtype=torch.float64), ref, tol)
    assert biased.verdict == BIASED and biased.factor is None
    bad = ref.clone()
    bad[3] = float("nan")
    assert verdicts.classify(bad, ref, tol).verdict == Verdict.NON_FINITE
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
    assert str(quiz.check("framework_audit.1", 1016 / 1008)) == "correct"
    verdict = quiz.check("framework_audit.1", 1.0)
    assert not verdict.correct and str(verdict).startswith("not yet: ")
    assert "correct" not in str(verdict) and f"{1016 / 1008:.3g}" not in str(verdict)
    right = "b) L - 2 counted; L - 2 targets; t learns token t + 2"
    assert quiz.check("framework_audit.2", right).correct
    wrong = quiz.check("framework_audit.2",  # an option, the wrong one
                       "a) L - 1 counted; L - 1 targets; t learns token t + 1")
    assert not wrong.correct and right not in str(wrong)


def test_the_gpt2_prediction_is_graded_against_the_live_runs_scale(tmp_path, monkeypatch):
    """Chapter 08 asks for c before the live run and grades it against the
    scale that run measured (N / (N + R) on its window, from 4.48 on)."""
    from course_lib.core import paths
    from course_lib.frameworks.evidence import FrameworkRow, RankResult, WindowCounts
    from course_lib.jobs.frameworks import FrameworksReport

    monkeypatch.setattr(paths, "default_out", lambda name: tmp_path / name)
    missing = quiz.check("framework_audit.predict_gpt2", 87 / 91)
    assert not missing.correct and "run the chapter's job first" in str(missing)
    row = FrameworkRow(framework="hf", version="5.25.0", model="gpt2",
                       flags={"average_tokens_across_devices": True},
                       verdict=Verdict.SCALED, counts=WindowCounts(87, [31, 56], 4),
                       ranks=[RankResult(0, 0.044, 0.956044), RankResult(1, 0.044, 0.956044)])
    FrameworksReport(world_size=2, backend="gloo", device="cpu", dtype="float32",
                     nccl_reference_path=False, torch="2.x", window={},
                     rows=[row]).save(tmp_path / "course")
    assert quiz.check("framework_audit.predict_gpt2", 87 / 91).correct
    assert not quiz.check("framework_audit.predict_gpt2", 1.0).correct


def test_the_prediction_is_the_set_of_exact_representative_recipes():
    # Chapter 08 asks about eight fine-tuning recipes; chapter 09 has the RL ones.
    q = quiz.QUESTIONS["framework_audit.predict"]
    assert tuple(q.choices()) == recipes.REPRESENTATIVE
    assert "course_rule" not in q.choices()
    assert not any(RECIPES[n].policy for n in q.choices())
    exact = {n for n in recipes.REPRESENTATIVE if n in EXACT_RECIPES}
    assert set(q.expected()) == exact == {"fairseq", "torchtitan_fsdp", "megatron_per_token"}
    assert quiz.check("framework_audit.predict", sorted(exact)).correct
    picked = sorted(exact | {"torchtitan_ddp"})
    assert not quiz.check("framework_audit.predict", picked).correct


# --- one real run ---------------------------------------------------------------------------


# Chapter 08's tables as the English edition printed them before the catalog
# carried them (the describe functions' own f-strings, written out again).
def _verdicts_before(report, names):
    tol = verdicts.TOLERANCE.of(report.dtype)

    def said(r):
        return f"scaled x{r.factor:.4g}" if r.verdict == SCALED else str(r.verdict)

    def error(x):
        return "n/a" if x is None else f"<{tol:.0e}" if x <= tol else f"{x:.3g}"

    lines = [f"{'recipe':<20} {'balanced':<15} {'skewed':<15} {'skewed error':>12}  "
             "empty window"]
    for name in names:
        row = report.recipes[name]
        empty = recipes.describe_empty(row.empty_window.outcome, row.empty_window.loss_finite)
        lines.append(f"{name:<20} {said(row.regimes['balanced']):<15} "
                     f"{said(row.regimes['skewed']):<15} "
                     f"{error(row.relative_error['skewed']):>12}  {empty}")
    lines.append(f"every prediction holds: {report.every_prediction_holds}")
    return "\n".join(lines)


def _weights_before(info, weights):
    cells = [(r, m, n) for r, rank in enumerate(info.microbatch_tokens)
             for m, n in enumerate(rank)]
    width = max(len(w.formula) for w in weights.values()) + 2
    head = "".join(f"{f'r{r},m{m}':>9}" for r, m, _ in cells)
    counts = "".join(f"{f'n={n}':>9}" for _, _, n in cells)
    lines = [f"{'':<20} {'':<{width}}a token's weight x N, by microbatch",
             f"{'recipe':<20} {'a token weighs':<{width}}{head.lstrip()}",
             f"{'':<20} {'':<{width}}{counts.lstrip()}"]
    for name, w in weights.items():
        values = "".join(f"{x:>9.3f}" for rank in w.times_n for x in rank)
        lines.append(f"{name:<20} {w.formula:<{width}}{values.lstrip()}")
    return "\n".join(lines)


def test_the_recipe_tables_speak_the_edition(monkeypatch):
    """Chapters 08 and 09's recipe tables (the committed report): English byte
    for byte; in French the frame, the windows, the verdicts and what the
    empty window does, numbers with French marks, columns aligned; the
    recipes' names, formulas and claims as the code has them."""
    from course_lib.core import edition
    from course_lib.course import recipes_page

    report = recipes_page.committed()
    shown = [n for n in recipes.REPRESENTATIVE if n in report.recipes]
    skewed = report.regimes["skewed"]
    weights = recipe_audit.token_weights(skewed, shown)
    monkeypatch.delenv(edition.ENV, raising=False)
    assert recipe_audit.describe_verdicts(report, shown) == _verdicts_before(report, shown)
    assert recipe_audit.describe_weights(skewed, weights) == _weights_before(skewed, weights)
    assert recipe_audit.describe_recipes(shown).splitlines()[0].split() == [
        "recipe", "per-microbatch", "backprop", "reduction", "claims"]
    assert recipe_audit.describe_real(names=shown).startswith("Real code, from ")
    english = {n: recipe_audit.verdicts(report.recipes[n], False) for n in report.recipes}

    monkeypatch.setenv(edition.ENV, "fr")
    table = recipe_audit.describe_verdicts(report, shown).splitlines()
    assert table[0].split() == ["recette", "équilibré", "déséquilibré", "erreur", "déséq.",
                                "fenêtre", "vide"]
    assert table[-1] == f"chaque prédiction se vérifie\u00a0: {report.every_prediction_holds}"
    for line, name in zip(table[1:-1], shown, strict=True):
        row = report.recipes[name]
        assert line.startswith(name)
        assert recipe_audit.empty_text(row) in line and line.endswith(
            edition.catalog("fr")[recipes.describe_empty(row.empty_window.outcome,
                                                         row.empty_window.loss_finite)])
        assert not re.search(r"\d\.\d|\b(exact|biased|scaled|zero step|raises)\b",
                             line.removeprefix(name).replace("exact ", "")), line
    widths = {line.index(recipe_audit.empty_text(report.recipes[n]))
              for line, n in zip(table[1:-1], shown, strict=True) if len(n) < 20}
    assert widths == {table[0].index("fenêtre vide")}
    pairs = {n: recipe_audit.verdicts(report.recipes[n], False) for n in report.recipes}
    for name, pair in pairs.items():  # chapter 09 prints these pairs
        assert pair.count(" | ") == english[name].count(" | ") == 1
        assert ("scaled x" in english[name]) == ("échelle ×" in pair), pair
        assert ("biased" in english[name]) == ("biaisé" in pair), pair
        assert not re.search(r"×\d+\.\d", pair), "a French decimal comma"
    french = recipe_audit.describe_weights(skewed, weights).splitlines()
    assert french[0].strip() == "poids d'un token × N, par microbatch"
    assert french[1].split()[:4] == ["recette", "un", "token", "pèse"]
    assert all(re.fullmatch(r"\d,\d{3}", x) for line in french[3:] for x in line.split()[-4:])
    assert [line.split()[0] for line in french[3:]] == list(weights)
    head = recipe_audit.describe_recipes(shown).splitlines()[0]
    assert head.split() == ["recette", "rétropropagation", "par", "microbatch", "réduction",
                            "annonce"]
    real = recipe_audit.describe_real(names=shown).splitlines()
    assert real[0].startswith("Le vrai code, d'après ") and real[0].endswith("\u00a0:")
    assert all(re.match(r"  \S+ +(non )?exécuté", line) for line in real[1:]), real


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`course-lib recipes --checks parity`: chapter 08's launch (one, at W = 2),
    which `make test` runs once for both (tests/machinery/replay.py)."""
    out = tmp_path_factory.mktemp("recipes")
    return out, course_lib_cli("recipes", "--checks", "parity", "--out", out)


@pytest.fixture(scope="module")
def invariances(tmp_path_factory, cfg):
    """The other predicted checks on every recipe: an audit launch at W = 2,
    then one each at W = 1 and W = 4 for world_size_invariance."""
    out = tmp_path_factory.mktemp("recipe-invariances")
    return audits.audit(cfg, out, PLAIN_RECIPES, INVARIANCES, timeout=600)




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
    assert set(invariances) == set(PLAIN_RECIPES)
    for name, row in report.recipes.items():
        if name in RL_RECIPES:  # the audit's checks compare with the plain token mean
            assert row.checks == {} and row.policy, name
        else:
            assert row.checks["parity"] == (name in EXACT_RECIPES), name
            checks = invariances[name].checks
            assert list(checks) == INVARIANCES, name
            assert checks["no_sync"].passed, name
            # A per-rank mean, a 1/W and a missing 1/M change with W; a mean
            # of microbatch means over the same microbatches does not.
            assert checks["world_size_invariance"].passed == (
                name not in {"hf_trainer_4_46_0", "hf_trainer_4_46_mean_loss",
                             "hf_trainer_local_tokens", "torchtitan_ddp", "axolotl"}), name
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
        first_half = sum(rank[0] for rank in info.microbatch_tokens)  # GA = 1 of M = 2
        expected = {"torchtitan_ddp": 1 / report.world_size,
                    "hf_trainer_avg_tokens": n / (n + r), "accelerate_docs": n / (n + r),
                    # every row holds a token: N / C with C = rows x 128; N / rows
                    "trl_grpo_dr_grpo": n / (info.rows * rl_recipes.MAX_COMPLETION_LENGTH),
                    "verl_seq_mean_token_sum": n / info.rows}
        if regime == "skewed":  # the first window over the average of the two
            expected["trl_grpo_dapo_spg2"] = first_half / (n / 2)
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


@pytest.mark.torchrun
def test_each_recipe_is_measured_against_its_claim_too(run):
    """Both verdicts, measured and predicted: exact for its own objective,
    biased (or scaled) for the token mean, is the shape of several rows."""
    out, proc = run
    report = RecipesReport.load(out)
    for name, row in report.recipes.items():
        assert row.claims == CLAIMS.get(name, "token_mean"), name
        for regime, result in row.regimes.items():
            claim = result.claim
            assert claim is not None, (name, regime)
            assert claim.verdict == claim.predicted_verdict and claim.matches, (name, regime)
            if row.claims == "token_mean":  # one objective, one verdict
                assert (claim.verdict, claim.relative_error) == (
                    result.verdict, result.relative_error), (name, regime)
            if name in EXACT_FOR_THEIR_CLAIM:
                assert claim.verdict == EXACT, (name, regime)
        if name in EXACT_FOR_THEIR_CLAIM:
            assert row.regimes["skewed"].verdict != EXACT, name
            assert row.claim_verdict == EXACT, name
    assert "its claim" in proc.stdout and "sequence_means" in proc.stdout


# --- the RL recipes on one process, and TRL's own loss -------------------------------------


@pytest.fixture(scope="module")
def window(cfg, corpus):
    """The parity window, every rank's microbatches, on one process (W = 1)."""
    from course_lib.core.data import collate, parity_window

    layout = parity_window(cfg, corpus, cfg.train.world_size)
    return [[collate(corpus, ids) for rank in layout for ids in rank]]


_REFERENCES: dict[tuple, torch.Tensor] = {}


def _measure(cfg, recipe, window):
    """Both verdicts of one recipe, run on one process (no comm hook)."""
    from course_lib.core.model import build_model
    from course_lib.core.reference import flat_grad

    def fresh():
        torch.manual_seed(0)
        return build_model(cfg).eval()

    model = fresh()
    recipe.func(model, window[0], 1)
    grad = flat_grad(model).double()
    shape = recipes.window_shape(window)
    found = []
    for claim, predicted in zip((("token_mean", recipe.claims)),
                                recipes.predictions(recipe, shape)):
        # A reference is a function of the claim, the policy and the generation
        # alone (the same fresh model, the same window): 64 of them are 7.
        key = (id(window), claim, recipe.policy, recipe.generation)
        if key not in _REFERENCES:
            _REFERENCES[key] = rl_recipes.claim_reference(
                fresh(), window, claim, recipe.policy, recipe.generation).double()
        ref = _REFERENCES[key].clone()
        found.append(recipes.matches(verdicts.classify(grad, ref, 1e-5), predicted))
    return found


def test_every_recipe_on_one_process_is_as_predicted_for_both_objectives(cfg, window):
    """W = 1 (the SUM-reduction rows need their comm hook: torchrun covers them)."""
    for name, recipe in RECIPES.items():
        if recipe.step.setup is None:
            assert _measure(cfg, recipe, window) == [True, True], name


def test_a_wrong_recipe_fails_its_check(cfg, window):
    """Each row's formula swapped for a neighbour's: the measurement exposes it."""
    import dataclasses

    for name, wrong in [("trl_grpo_dr_grpo", rl_recipes.trl_grpo_bnpo),
                        ("trl_grpo_grpo", rl_recipes.verl_seq_mean_token_sum),
                        ("trl_grpo_dapo_spg2", rl_recipes.trl_grpo_dapo),
                        ("verl_token_mean", rl_recipes.verl_dp_actor_legacy)]:
        swapped = dataclasses.replace(RECIPES[name], func=wrong)
        assert False in _measure(cfg, swapped, window), name


def test_advantages_follow_the_sequence_wherever_it_lands(corpus):
    """One value per completion, signed, chosen by its content: the same in
    another row, another microbatch, another padded width."""
    from course_lib.core.data import collate

    ids = [0, 5, 9, 17]
    alone = [rl_recipes.completion_advantages(collate(corpus, [i])[1]) for i in ids]
    together = rl_recipes.completion_advantages(collate(corpus, ids[::-1])[1])
    assert torch.equal(torch.cat(alone), together.flip(0))
    per_token = rl_recipes.advantages(collate(corpus, ids)[1])
    labels = collate(corpus, ids)[1]
    assert torch.equal(per_token == 0, labels == -100), "0 exactly where ignored"
    values = {float(a) for a in rl_recipes.completion_advantages(
        collate(corpus, list(range(64)))[1])}
    assert values <= set(rl_recipes.ADVANTAGE_VALUES) and min(values) < 0 < max(values)


def test_the_policy_references_are_the_claimed_objectives(window):
    """Each claimed objective, by hand, on per-token losses of 1: the weights
    of A l in the window's loss."""
    from course_lib.core.objectives import token_weights

    labels = [lb for _, lb in window[0]]
    rows = sum(int(lb.shape[0]) for lb in labels)
    n = sum(int((lb != -100).sum()) for lb in labels)
    adv = [rl_recipes.advantages(lb) for lb in labels]
    for claim, expected in [
        ("token_mean", [a / n for a in adv]),
        ("sequence_sums", [a / rows for a in adv]),
        ("constant", [a / (rows * rl_recipes.MAX_COMPLETION_LENGTH) for a in adv]),
        ("sequence_means", [a / (lb != -100).sum(-1, keepdim=True).clamp(min=1) / rows
                            for a, lb in zip(adv, labels)]),
    ]:
        objective = rl_recipes.claim_objective(claim, True, rows)
        for got, want in zip(token_weights(objective, labels), expected):
            assert torch.allclose(got, want.double(), rtol=1e-12, atol=0), claim
    assert rl_recipes.claim_objective("microbatch_means", True, rows) is None


def test_row_predictions_follow_the_counts():
    """The rows' weights, by hand, on a 2-rank window of 2 microbatches."""
    shape = recipes.WindowShape(
        [[3, 5], [8, 8]], 4, (2, 2), (((1, 2), (2, 3)), ((4, 4), (5, 3))), ((1, 1), (1, 1)))
    p = recipes.predict_rows
    n, first, second = 24, 3 + 8, 5 + 8
    assert p("generation_tokens", "token_mean", shape, 2) == recipes.Prediction(
        SCALED, first / (n / 2))
    assert p("trl_constant", "constant", shape) == recipes.Prediction(EXACT)
    assert p("trl_constant", "token_mean", shape) == recipes.Prediction(
        SCALED, n / (8 * rl_recipes.MAX_COMPLETION_LENGTH))
    assert p("sequence_sums", "token_mean", shape) == recipes.Prediction(SCALED, n / 8)
    assert p("trl_sequence_means", "sequence_means", shape).verdict == EXACT
    assert p("trl_sequence_means", "token_mean", shape).verdict == BIASED
    assert p("microbatch_means", "microbatch_means", shape).verdict == EXACT
    assert p("llamafactory_v1", "token_mean", shape).verdict == BIASED
    assert second != first
    # Where the first table's counts decide too, both ways agree.
    for objective in ("token_mean", "microbatch_means", "rank_means"):
        assert p(objective, "token_mean", shape) == recipes.predict(objective, shape)


def test_the_installed_trl_loss_is_the_recipes_and_a_wrong_one_is_not():
    """TRL 1.16.0's real _compute_loss (this .venv's), one process, float64:
    loss and gradient allclose for every loss type; dropping #6024's factor
    (GA / steps_per_generation) is caught where steps_per_generation != GA."""
    pytest.importorskip("trl")
    from course_lib.frameworks import trl_grpo

    cases = {"dapo/spg=ga": ("dapo", 2, 2), "dapo/spg=2ga": ("dapo", 1, 2),
             "bnpo": ("bnpo", 2, 2), "grpo": ("grpo", 2, 2), "dr_grpo": ("dr_grpo", 2, 2)}
    rows = trl_grpo.compare_all(cases)
    assert [r.status for r in rows] == ["run"] * len(cases)
    assert all(r.loss_allclose and r.grad_allclose for r in rows), rows

    def before_6024(loss_type, terms, mask, ga, **kw):
        return rl_recipes.trl_grpo_loss(loss_type, terms, mask, ga,
                                        **{**kw, "generation_steps": ga})

    wrong = {r.key.split("/", 1)[1]: r for r in trl_grpo.compare_all(cases, before_6024)}
    assert not wrong["dapo/spg=2ga"].loss_allclose
    assert not wrong["dapo/spg=2ga"].grad_allclose
    assert wrong["dapo/spg=ga"].grad_allclose, "the same where spg = GA"


def test_the_committed_loss_runs_load_and_back_every_trl_row():
    runs = recipe_audit.LossRuns.committed()
    assert runs is not None and runs.command.startswith("python benchmarks/")
    keys = runs.by_key()
    for name, r in RECIPES.items():
        for key in r.loss_runs:
            assert keys[key].agrees, (name, key)
    for run in runs.runs:
        assert (run.status == "run") == (run.loss_trl is not None), run.key
        assert run.status == "run" or run.reason, run.key


@pytest.mark.torchrun
def test_an_old_report_without_the_claims_still_loads(run):
    """Reports written before the claims lack their fields: they load."""
    data = json.loads(report_path(run[0], "recipes").read_text())
    for row in data["recipes"].values():
        for key in ("claims", "claimed", "claim_verdict", "claim_factor", "policy"):
            row.pop(key)
        for result in row["regimes"].values():
            result.pop("claim")
    for info in data["regimes"].values():
        info.pop("rows")
    old = RecipesReport.from_dict(data)
    row = old.recipes["fairseq"]
    assert row.claims == "token_mean" and row.regimes["skewed"].claim is None


@pytest.mark.torchrun
def test_a_claim_not_as_predicted_is_named(run):
    """The exit rule reads both verdicts: a claim off its prediction is named."""
    import dataclasses

    report = RecipesReport.load(run[0])
    assert recipe_audit.mismatches(report) == []
    row = report.recipes["trl_grpo_grpo"]
    skewed = row.regimes["skewed"]
    off = dataclasses.replace(skewed, claim=dataclasses.replace(skewed.claim, matches=False))
    row = dataclasses.replace(row, regimes={**row.regimes, "skewed": off}, matches=False)
    broken = dataclasses.replace(report, recipes={**report.recipes, "trl_grpo_grpo": row})
    assert recipe_audit.mismatches(broken) == ["trl_grpo_grpo (its claim)"]
