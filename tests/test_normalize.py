import pytest
import torch

from course_lib.core import data, normalize
from course_lib.core.model import build_model, loss_sum
from course_lib.core.reference import compare, flat_grad, reference_gradient


def test_global_token_loss_refuses_empty_windows():
    for n in (0, -3):
        with pytest.raises(normalize.EmptyWindowError, match="N = 0"):
            normalize.global_token_loss(torch.tensor(1.0), n, 2)


def test_global_token_loss_is_w_s_over_n():
    out = normalize.global_token_loss(torch.tensor(108.0), 48, 2)
    assert float(out) == pytest.approx(4.5)


def test_global_count_without_a_process_group_is_the_local_count():
    c = normalize.global_count(torch.tensor(12))
    assert c.dtype == torch.int64 and int(c) == 12


def _window(cfg, corpus):
    window = data.make_plan(cfg, corpus, 2)[0]
    return [[data.collate(corpus, ids) for ids in window[r]] for r in range(2)]


def test_simulated_ranks_match_the_reference_only_with_the_global_rule(cfg, corpus):
    """Average per-rank gradients like DDP does, without any process group."""
    per_rank = _window(cfg, corpus)
    n = sum(int((lab != data.IGNORE_INDEX).sum()) for mbs in per_rank for _, lab in mbs)
    ref, n_ref, _ = reference_gradient(build_model(cfg).eval(),
                                       [mb for mbs in per_rank for mb in mbs])
    assert n == n_ref
    results = {}
    for mode in normalize.MODES:
        grads = []
        for mbs in per_rank:
            model = build_model(cfg).eval()
            if mode == "global_token":
                model.zero_grad()
                for inputs, labels in mbs:
                    normalize.global_token_loss(loss_sum(model(inputs), labels), n, 2
                                                ).backward()
            else:
                normalize.accumulate_window(model, mbs, mode, 2)
            grads.append(flat_grad(model))
        results[mode] = compare(sum(grads) / 2, ref, 1e-6, 1e-4)
    assert results["global_token"].allclose
    assert not results["mean_of_means"].allclose
    assert results["mean_of_means"].max_abs_err > 1e-3


def test_dividing_again_by_accumulation_halves_the_gradient(cfg, corpus):
    mbs = _window(cfg, corpus)[0]
    model = build_model(cfg).eval()
    normalize.accumulate_window(model, mbs, "global_token", 1)
    right = flat_grad(model)
    model.zero_grad()
    n = sum(int((lab != data.IGNORE_INDEX).sum()) for _, lab in mbs)
    for inputs, labels in mbs:
        (normalize.global_token_loss(loss_sum(model(inputs), labels), n, 1)
         / len(mbs)).backward()
    assert torch.allclose(flat_grad(model) * 2, right, atol=1e-7)


def test_accumulate_window_rejects_unknown_mode(cfg, corpus):
    with pytest.raises(ValueError, match="mode"):
        normalize.accumulate_window(build_model(cfg), _window(cfg, corpus)[0], "sum", 1)


def test_compare_counts_violations_with_allclose_semantics():
    ref = torch.tensor([0.0, 1.0, 100.0], dtype=torch.float64)
    # The bound at each component: 1e-6, 1.01e-4, 1.0001e-2.
    inside = torch.tensor([0.9e-6, 1.0e-4, 0.9e-2], dtype=torch.float64)
    ok = compare(ref + inside, ref, 1e-6, 1e-4)
    assert ok.allclose and ok.violations == 0
    outside = torch.tensor([2e-6, 0.0, float("nan")], dtype=torch.float64)
    bad = compare(ref + outside, ref, 1e-6, 1e-4)
    assert not bad.allclose and bad.violations == 2
