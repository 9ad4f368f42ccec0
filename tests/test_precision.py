"""Where bfloat16 changes the sums and counts of the course's step."""

import pytest
import torch

from course_lib.core import precision


@pytest.fixture(scope="module")
def autocast(cfg, corpus):
    return precision.measure(cfg, corpus, modes=("autocast_bf16",))


def test_a_count_kept_in_bf16_is_not_n(autocast):
    c = autocast.count
    assert c.exact == 2283
    assert c.bfloat16 != c.exact and c.bfloat16 % 16 == 0  # bf16's spacing above 2,048
    assert abs(c.float16 - c.exact) <= 1


def test_bf16_noise_fails_float32_parity_yet_the_bias_stands_out(autocast):
    (row,) = autocast.rows
    assert row.mode == "autocast_bf16"
    # the right rule, computed in bf16, misses the float32 tolerances ...
    assert not row.global_token.passes and row.global_token.violations > 0
    # ... while the mean of means' error is an order of magnitude above that noise
    assert row.mean_of_means.max_abs_err > 10 * row.global_token.max_abs_err
    assert not row.mean_of_means.passes
    # the sums differ from float64's in the fifth significant digit, not the eighth
    rel = [abs(a - b) / b for a, b in zip(row.loss_sums, row.loss_sums_float64, strict=True)]
    assert max(rel) > 1e-6


def test_float32_passes_where_bf16_fails(cfg, corpus):
    grad, sums = precision.ddp_gradient(cfg, corpus, "float32", "global_token")
    exact, exact_sums = precision.ddp_gradient(cfg, corpus, "float64", "global_token")
    assert torch.allclose(grad, exact, atol=cfg.parity.atol, rtol=cfg.parity.rtol)
    assert sums == pytest.approx(exact_sums, rel=1e-6)
    with pytest.raises(ValueError, match="mode must be one of"):
        precision.ddp_gradient(cfg, corpus, "int8", "global_token")
