"""What the real frameworks log, under torchrun on gloo, against the float64
token mean: one launch (llama) shared by the module; the committed data
agrees with it."""

import pytest

from course_lib.frameworks.models import UnknownModel
from course_lib.jobs import frameworks_logging as fl

pytestmark = pytest.mark.torchrun
ROUND_OFF = 1e-6  # float32 over ~100 tokens, against float64: measured near 5e-8
APART = 100 * fl.TOLERANCE  # a formula that is not the token mean misses it by far more


@pytest.fixture(scope="module")
def report(cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("frameworks-logging")
    return fl.frameworks_logging(cfg, out, fl.QUICK_MODELS, world_size=2, backend="gloo",
                                 device="cpu")


def test_every_row_is_judged_unambiguously_and_every_rank_logged_it(report):
    assert report.world_size == 2 and {r.model for r in report.rows} == set(fl.QUICK_MODELS)
    assert len(report.rows) == len(fl.ROWS) * len(fl.QUICK_MODELS)
    for r in report.rows:
        assert r.verdict in fl.VERDICTS and r.verdict != fl.OTHER, (r.mode, r.candidates)
        # no value lies within tolerance of two formulas
        assert r.separation > 2 * fl.TOLERANCE, (r.mode, r.separation)
        assert len(r.per_rank) == 2 and r.ranks_agree, (r.mode, r.per_rank)
        assert abs(r.value - r.candidates[r.verdict]) <= ROUND_OFF * abs(r.value)


def test_hf_train_loss_is_the_token_mean_only_with_averaging(report):
    on = report.row("hf", "train loss", "average_tokens_across_devices=True")
    off = report.row("hf", "train loss", "average_tokens_across_devices=False")
    assert on.relative_error < ROUND_OFF and on.verdict == fl.TOKEN_MEAN
    assert off.verdict == fl.RANK_MEANS and off.relative_error > APART
    assert abs(off.value - off.candidates[fl.RANK_MEANS]) < ROUND_OFF * off.value


def test_hf_eval_loss_is_not_the_token_mean_in_either_mode(report):
    for average in (True, False):
        r = report.row("hf", "eval_loss", f"average_tokens_across_devices={average}")
        assert r.relative_error > APART and r.verdict != fl.TOKEN_MEAN, r.verdict
    # with averaging, each step is its own token mean; without, each batch is
    assert report.row("hf", "eval_loss", "average_tokens_across_devices=True").verdict \
        == fl.STEP_MEANS
    assert report.row("hf", "eval_loss", "average_tokens_across_devices=False").verdict \
        == fl.SAMPLE_WEIGHTED


def test_accelerate_scalars_fold_the_padded_duplicates_in(report):
    window = report.window
    assert window["eval_rows"] % (2 * window["eval_batch_size"]), "even_batches must pad"
    scalar = report.row("accelerate", "eval loss", "gather_for_metrics(loss)")
    assert scalar.verdict == fl.BATCH_MEANS and scalar.relative_error > APART
    rows = report.row("accelerate", "eval loss", "gather_for_metrics(per-sample [sum, count])")
    assert rows.verdict == fl.TOKEN_MEAN and rows.relative_error < ROUND_OFF


def test_lightning_sync_dist_is_a_mean_of_ranks_and_floors_the_token_count(report):
    step = report.row("lightning", "train loss, first step", "on_step=True, sync_dist=True")
    assert step.verdict == fl.RANK_MEANS and step.relative_error > APART
    tokens = report.row("lightning", "train loss, epoch",
                        "on_epoch=True, sync_dist=True, batch_size=<tokens>")
    n = report.counts[tokens.model]["N"]
    assert n % 2 == 1, "an odd N shows gloo's integer mean of the batch sizes"
    assert tokens.verdict == fl.FLOORED
    assert abs(tokens.value / tokens.token_mean - (n / 2) / (n // 2)) < ROUND_OFF


def test_each_framework_has_a_recipe_that_is_the_token_mean(report):
    recipes = report.recipes
    assert {r.framework for r in recipes} == set(fl.PACKAGES)
    for r in recipes:
        assert r.verdict == fl.TOKEN_MEAN and r.relative_error < ROUND_OFF, (r.mode, r.value)
    # the code shown is the code that ran
    hf_eval = report.row("hf", "eval_token_mean",
                         "preprocess_logits_for_metrics + compute_metrics")
    assert "def token_sums" in hf_eval.recipe and "def token_mean" in hf_eval.recipe


def test_the_committed_data_loads_and_agrees_with_a_fresh_run(report):
    data = fl.LoggingData.committed()
    assert set(fl.MODELS) <= {r.model for r in data.run.rows}
    committed = {(r.framework, r.logged, r.mode, r.model): r.verdict for r in data.run.rows}
    for r in report.rows:
        assert committed[(r.framework, r.logged, r.mode, r.model)] == r.verdict, r.mode


def test_the_formulas_on_hand_numbers():
    # torchtitan's example: S = (2, 90), N = (1, 9), one sample per rank
    got = fl.eval_candidates([2.0, 90.0], [1.0, 9.0], [[[0], [1]]])
    assert got[fl.TOKEN_MEAN] == pytest.approx(9.2) and got[fl.RANK_MEANS] == pytest.approx(6.0)
    assert fl.judge(9.2, got) == fl.TOKEN_MEAN and fl.judge(7.0, got) == fl.OTHER


def test_an_unknown_model_is_refused_before_any_launch(cfg, tmp_path):
    with pytest.raises(UnknownModel):
        fl.frameworks_logging(cfg, tmp_path, ["no_such_model"])


def test_an_unknown_framework_is_refused_before_any_launch(cfg, tmp_path):
    from course_lib.frameworks import UnknownFramework

    with pytest.raises(UnknownFramework, match="no logging for torchtitan"):
        fl.frameworks_logging(cfg, tmp_path, ["llama"], ["hf", "torchtitan"])
