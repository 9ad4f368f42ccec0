"""Drive the explorers by setting slider values; check what they display."""

from __future__ import annotations

import re

import pytest

from course_lib.core import arithmetic
from course_lib.course.widgets import (
    MAX_RANKS,
    ThetaExplorer,
    TokenExplorer,
    explorer_state,
    theta_state,
)

PNG = b"\x89PNG"


def shown_number(html: str, label: str) -> float:
    """The number printed after ``label:`` in a readout's HTML."""
    match = re.search(re.escape(label) + r":? (-?\d+\.\d{4})\b", html)
    assert match, f"{label!r} not found in {html!r}"
    return float(match.group(1))


# --- pure functions ------------------------------------------------------------


def test_explorer_state_counter_example():
    st = explorer_state([12, 36], [1.0, 3.0], 2)
    assert st["mean_of_means"] == 2.0
    assert st["global_mean"] == 2.5
    assert st["bias"] == pytest.approx(-0.5)
    assert st["token_weights"]["global"] == [pytest.approx(1 / 48)] * 2
    assert st["token_weights"]["mean_of_means"] == [pytest.approx(1 / 24),
                                                    pytest.approx(1 / 72)]
    assert st["weight_ratio"] == pytest.approx(3.0)
    assert st["rank_shares"]["global"] == [0.25, 0.75]
    assert st["rank_shares"]["mean_of_means"] == [0.5, 0.5]
    assert st["scaled_local_losses"] == [pytest.approx(0.5), pytest.approx(4.5)]


def test_explorer_state_uses_only_first_w_ranks():
    st = explorer_state([12, 36, 100], [1.0, 3.0, 9.0], 2)
    assert st["tokens"] == [12, 36]
    assert st["global_mean"] == 2.5
    with pytest.raises(ValueError):
        explorer_state([12, 36], [1.0, 3.0], 3)


def test_theta_state_same_loss_different_gradient():
    st = theta_state(0.0)
    assert st["loss_mean_of_means"] == st["loss_global"] == 1.0
    assert st["grad_mean_of_means"] == 0.0
    assert st["grad_global"] == 1.0


def test_a_bias_of_rounding_reads_zero_not_minus_zero():
    ex = TokenExplorer()
    ex.set([12, 36], [0.1, 0.1])  # equal means: the bias is rounding, -1e-17
    assert ex.state["bias"] != 0.0, "this case should leave a rounding residue"
    assert "bias: 0.0000" in ex.bias_readout.value
    assert "-0.0000" not in ex.bias_readout.value


# --- token explorer ---------------------------------------------------------------


def test_defaults_show_the_counter_example():
    ex = TokenExplorer()
    assert ex.world_size.value == 2
    assert [s.value for s in ex.tokens[:2]] == [12, 36]
    assert [s.value for s in ex.losses[:2]] == [1.0, 3.0]
    assert "global mean: 2.5000" in ex.global_readout.value
    assert "mean of means: 2.0000" in ex.mom_readout.value
    assert "-0.5000" in ex.bias_readout.value
    assert bytes(ex.image.value).startswith(PNG)


def test_dom_contract():
    ex = TokenExplorer()
    assert len(ex.tokens) == len(ex.losses) == MAX_RANKS
    for r in range(MAX_RANKS):
        assert ex.tokens[r].description == f"rank {r} tokens"
        assert f"course-tokens-r{r}" in ex.tokens[r]._dom_classes
        assert f"course-loss-r{r}" in ex.losses[r]._dom_classes
    assert "course-world-size" in ex.world_size._dom_classes
    assert "course-global-mean" in ex.global_readout._dom_classes
    assert "course-mean-of-means" in ex.mom_readout._dom_classes
    assert ex.world_size.min == 1 and ex.world_size.max == 8
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


@pytest.mark.parametrize("tokens,losses", [
    ([5, 80], [2.0, 0.5]),
    ([100, 7], [0.25, 4.0]),
    ([33, 33], [1.5, 2.5]),
])
def test_readouts_follow_the_sliders(tokens, losses):
    ex = TokenExplorer()
    for r in range(2):
        ex.tokens[r].value = tokens[r]
        ex.losses[r].value = losses[r]
    sums = [n * x for n, x in zip(tokens, losses, strict=True)]
    mom = arithmetic.mean_of_means(sums, tokens)
    glob = arithmetic.global_mean(sums, tokens)
    assert shown_number(ex.global_readout.value, "global mean") == round(glob, 4)
    assert shown_number(ex.mom_readout.value, "mean of means") == round(mom, 4)
    assert f"global mean: {glob:.4f}" in ex.global_readout.value
    assert f"mean of means: {mom:.4f}" in ex.mom_readout.value


def test_figure_updates_with_the_state():
    ex = TokenExplorer()
    before = ex.image.value
    ex.tokens[0].value = 36
    assert ex.image.value != before
    assert ex.bars_mom[0].get_height() == pytest.approx(1 / 72)
    assert ex.bars_global[1].get_height() == pytest.approx(1 / 72)
    assert ex.mean_bars[0].get_height() == pytest.approx(2.0)


def test_world_size_hides_and_shows_rank_sliders():
    ex = TokenExplorer()
    for r in range(MAX_RANKS):
        hidden = ex.tokens[r].layout.display == "none"
        assert hidden == (r >= 2)
        assert (ex.losses[r].layout.display == "none") == (r >= 2)
    ex.world_size.value = 5
    for r in range(MAX_RANKS):
        assert (ex.tokens[r].layout.display == "none") == (r >= 5)
    assert ex.bars_mom[4].get_visible()
    assert ex.bars_mom[5].get_visible() is False
    ex.world_size.value = 1
    assert ex.tokens[1].layout.display == "none"
    assert ex.tokens[0].layout.display != "none"


def test_world_size_changes_the_means():
    ex = TokenExplorer()
    ex.world_size.value = 3
    tokens = [s.value for s in ex.tokens[:3]]
    losses = [s.value for s in ex.losses[:3]]
    sums = [n * x for n, x in zip(tokens, losses, strict=True)]
    glob = arithmetic.global_mean(sums, tokens)
    assert f"global mean: {glob:.4f}" in ex.global_readout.value
    assert ex.state["world_size"] == 3
    ex.world_size.value = 1  # one rank: both means are its own mean
    assert "global mean: 1.0000" in ex.global_readout.value
    assert "mean of means: 1.0000" in ex.mom_readout.value


def test_balanced_counts_make_the_means_equal():
    ex = TokenExplorer()
    ex.tokens[1].value = 12
    assert "global mean: 2.0000" in ex.global_readout.value
    assert "mean of means: 2.0000" in ex.mom_readout.value
    assert shown_number(ex.bias_readout.value, "bias") == 0.0


def test_equal_local_means_hide_the_bias():
    ex = TokenExplorer()
    ex.losses[1].value = 1.0
    assert "global mean: 1.0000" in ex.global_readout.value
    assert "mean of means: 1.0000" in ex.mom_readout.value


# --- theta explorer ----------------------------------------------------------------


def test_theta_explorer_at_zero():
    th = ThetaExplorer()
    assert th.theta.value == 0.0
    assert shown_number(th.loss_readout.value, "mean of means") == 1.0
    assert shown_number(th.loss_readout.value, "global") == 1.0
    assert shown_number(th.grad_readout.value, "mean of means") == 0.0
    assert shown_number(th.grad_readout.value, "global") == 1.0
    assert bytes(th.image.value).startswith(PNG)


def test_theta_explorer_follows_the_slider():
    th = ThetaExplorer()
    th.theta.value = 0.5
    ex = arithmetic.theta_example(0.5)
    assert shown_number(th.loss_readout.value, "global") == round(ex["loss_global"], 4)
    assert shown_number(th.grad_readout.value, "mean of means") == round(
        ex["grad_mean_of_means"], 4)
    x, y = th.markers["grad", "global"].get_data()
    assert list(x) == [0.5] and list(y) == [pytest.approx(ex["grad_global"])]


def test_the_figures_label_their_axes_and_round_to_two_decimals():
    theta = ThetaExplorer(theta=0.0)
    assert theta.ax_loss.get_ylabel() and theta.ax_grad.get_ylabel()
    assert theta.ax_grad.get_legend() is not None
    token = TokenExplorer()
    assert [t.get_text() for t in token.mean_texts] == ["2.00", "2.50"]
    assert token.bias_text.get_text() == "bias -0.50"
