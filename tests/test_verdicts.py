"""The measurement vocabulary: one judgement for the vectors (the recipes)
and for the inner products (the frameworks), one worst, one vocabulary."""

import json
import math

import pytest
import torch

from course_lib.core import verdicts
from course_lib.core.verdicts import TOLERANCE, Verdict
from course_lib.frameworks import candidates
from course_lib.frameworks.window import Counts
from course_lib.jobs import frameworks as fw_job

TOL = TOLERANCE.exact["float32"]


def _edge(scale: float, off: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, g*): g = scale g* + e, e orthogonal to g*, with ||e|| = off
    ||scale g*||: a scaled gradient ``off`` tolerances from the line."""
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(200, generator=g, dtype=torch.float64)
    e = torch.randn(200, generator=g, dtype=torch.float64)
    e -= (e @ ref) / (ref @ ref) * ref
    e *= off * abs(scale) * float(ref.norm()) / float(e.norm())
    return scale * ref + e, ref


def _frameworks_verdict(grad: torch.Tensor, ref: torch.Tensor) -> Verdict:
    """What the frameworks job judges, from inner products: one rank, one
    microbatch whose summed-loss gradient is ``ref`` with N = 1 (the token
    mean's coefficient is 1 / N = 1)."""
    counts = Counts(n=[[1]], n_before_shift=[[1]], rows_first_supervised=[[0]])
    seen = candidates.Against.of(candidates.Gram.of(counts, [[ref]]), grad, [[ref]])
    verdict, _ = fw_job._judge(True, seen, TOL)
    return verdict


# Scales far from 1 (x4, 1/4): the two formulas that drifted apart differed
# by |s|, so a residual near the tolerance was judged two ways.
@pytest.mark.parametrize("scale", [4.0, 0.25, 71.0, 0.5])
@pytest.mark.parametrize("off, want", [(0.5, Verdict.SCALED), (2.0, Verdict.BIASED)])
def test_a_scaled_gradient_at_the_edge_is_judged_the_same_on_both_paths(scale, off, want):
    grad, ref = _edge(scale, off * TOL)
    vector = verdicts.classify(grad, ref, TOL)
    inner = verdicts.classify_inner(float(grad @ grad), float(grad @ ref), float(ref @ ref),
                                    TOL)
    assert vector.verdict == want, (scale, off, vector)
    assert inner.verdict == want, (scale, off, inner)
    assert _frameworks_verdict(grad, ref) == want, "the frameworks job judges the same"
    assert inner.residual == pytest.approx(vector.residual, rel=1e-4)
    assert inner.scale == pytest.approx(vector.scale, rel=1e-9)
    if want == Verdict.SCALED:
        assert vector.factor == pytest.approx(scale, rel=1e-9)


def test_the_residual_does_not_depend_on_the_gradients_units():
    grad, ref = _edge(0.3, 3 * TOL)
    one = verdicts.classify(grad, ref, TOL)
    for c in (1e-3, 50.0):
        other = verdicts.classify(c * grad, ref, TOL)
        assert other.residual == pytest.approx(one.residual, rel=1e-9)
        assert other.verdict == one.verdict == Verdict.BIASED


def test_exact_nonfinite_and_an_empty_reference():
    ref = torch.ones(5, dtype=torch.float64)
    assert verdicts.classify(ref * (1 + 0.5 * TOL), ref, TOL).verdict == Verdict.EXACT
    nan = ref.clone()
    nan[0] = math.nan
    assert verdicts.classify(nan, ref, TOL).verdict == Verdict.NON_FINITE
    assert verdicts.classify_inner(math.inf, 1.0, 1.0, TOL).verdict == Verdict.NON_FINITE
    zero = torch.zeros(5, dtype=torch.float64)
    assert verdicts.classify(zero, zero, TOL).verdict == Verdict.EXACT
    assert verdicts.classify(ref, zero, TOL).verdict == Verdict.BIASED


def test_worst_is_none_when_any_error_is_missing_or_nan():
    assert verdicts.worst([1e-7, 3e-6, 0.0]) == 3e-6
    assert verdicts.worst([]) == 0.0
    assert verdicts.worst([1e-7, None]) is None
    assert verdicts.worst([1e-7, math.nan]) is None


def test_a_verdict_is_its_word_in_json_and_in_text():
    assert json.dumps({"v": Verdict.SCALED}) == '{"v": "uniformly scaled"}'
    assert f"{Verdict.NOT_RUN:<9}|" == "not run  |" and str(Verdict.EXACT) == "exact"
    assert Verdict("ranks disagree") is Verdict.RANKS_DISAGREE
    assert TOLERANCE.of("bfloat16") > TOLERANCE.of("float32") > TOLERANCE.of("float64")
    assert TOLERANCE.of("an unknown precision") == TOLERANCE.exact["float32"]
