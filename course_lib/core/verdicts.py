"""The measurement vocabulary: what a gradient is judged to be, the
tolerances it is judged with, and the one formula that judges it.

Every layer that names a verdict (the recipes, the frameworks, the course's
tables, the CLI) compares these members. They are ``str``-valued, so the
JSON reports keep the same words and old reports still load.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import torch

from course_lib.core.edition import marks, tr


class _Word(str, Enum):
    """A member is its word: in JSON, f-strings and ``str()`` alike."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Verdict(_Word):
    """A measured gradient against the reference g*."""

    EXACT = "exact"
    SCALED = "uniformly scaled"  # collinear with g*: g = c g*, c != 1
    BIASED = "biased"
    NON_FINITE = "non-finite"
    RANKS_DISAGREE = "ranks disagree"  # the ranks hold different gradients
    NOT_RUN = "not run"  # nothing measured; the row says why
    # The framework raised while it trained, on every rank: the row names the error.
    FAILED = "failed"


class EmptyOutcome(_Word):
    """What a step does with a window that holds no supervised token (N = 0)."""

    RAISES = "raises"
    ZERO_STEP = "zero step"
    NAN = "NaN"  # a non-finite component on some rank
    NONZERO_STEP = "nonzero step"  # a gradient from no token: never expected


def said(verdict: Verdict | str, factor: float | None = None) -> str:
    """A verdict as the tables write it, in the learner's language
    (``COURSE_EDITION``): a uniform scale with its factor, "scaled x0.956"
    (French « à l'échelle ×0,956 »). Reports keep the ``Verdict`` itself."""
    if verdict == Verdict.SCALED and factor:
        return tr("scaled x{factor}").format(factor=marks(f"{factor:.4g}"))
    return tr(str(verdict))


# --- the tolerances ----------------------------------------------------------------


@dataclass(frozen=True)
class Tolerances:
    # ||g - g*|| / ||g*|| at or below this is exact, by the precision the
    # gradient was computed in: float32 rounding sits near 1e-7, bf16 keeps
    # 8 bits of mantissa, float64 proves the formula rather than its rounding.
    exact: dict[str, float]
    factor: float  # measured vs predicted uniform scale, relative
    row: float  # float64 arithmetic on counts: equal weights agree far below this
    # (atol, rtol) per component in float64: the formula, not fp32 rounding.
    float64_components: tuple[float, float]

    def of(self, precision: str) -> float:
        """The exactness bound for ``precision`` (float32's for an unknown one)."""
        return self.exact.get(precision, self.exact["float32"])


TOLERANCE = Tolerances(
    exact={"float64": 1e-10, "float32": 1e-5, "bfloat16": 2e-2},
    factor=1e-6,
    row=1e-9,
    float64_components=(1e-12, 0.0),
)


# --- the judgement ------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    relative_error: float | None  # ||g - g*|| / ||g*||
    scale: float | None  # least squares: <g, g*> / <g*, g*>
    residual: float | None  # ||g - scale g*|| / ||scale g*||: 0 when collinear
    verdict: Verdict
    factor: float | None  # the scale, when the gradient is uniformly scaled


NOT_FINITE = Measured(None, None, None, Verdict.NON_FINITE, None)


def _judge(distance: float, ref_norm: float, scale: float, off_line: float,
           tolerance: float) -> Measured:
    """From ||g - g*||, ||g*||, the scale s and ||g - s g*||.

    The collinearity residual is relative to the *scaled* reference,
    ||g - s g*|| / ||s g*||, not to g*: it is then the same for g and for
    any multiple of g, so a verdict does not depend on the gradient's units.
    Rounding grows with the scale (x71 for a sum over sequences), and a
    collinear g must not look biased for it, nor a small biased one (1/W of
    the reference) pass as collinear."""
    if ref_norm == 0:
        rel = 0.0 if distance == 0 else math.inf
    else:
        rel = distance / ref_norm
    scaled = abs(scale) * ref_norm
    residual = off_line / scaled if scaled > 0 else math.inf
    if rel <= tolerance:
        return Measured(rel, scale, residual, Verdict.EXACT, None)
    if residual <= tolerance:
        return Measured(rel, scale, residual, Verdict.SCALED, scale)
    return Measured(rel, scale, residual, Verdict.BIASED, None)


def classify(g: torch.Tensor, reference: torch.Tensor, tolerance: float) -> Measured:
    """Exact, uniformly scaled (collinear with g*), biased, or non-finite:
    from the vectors (their differences in float64, no cancellation)."""
    v, r = g.double().flatten(), reference.double().flatten()
    if not bool(torch.isfinite(v).all()):
        return NOT_FINITE
    rr = float(r @ r)
    scale = float(v @ r) / rr if rr > 0 else 0.0
    return _judge(float((v - r).norm()), rr ** 0.5, scale, float((v - scale * r).norm()),
                  tolerance)


def classify_inner(gg: float, gr: float, rr: float, tolerance: float) -> Measured:
    """``classify``'s judgement from inner products alone: |g|^2, <g, g*>,
    |g*|^2 (the frameworks build no reference vector: GPT-2 small has 124M
    components). Distances come from the expanded squares, so this suits
    float32 tolerances, not float64's."""
    if not all(math.isfinite(x) for x in (gg, gr, rr)):
        return NOT_FINITE
    scale = gr / rr if rr > 0 else 0.0

    def distance(s: float) -> float:  # ||g - s g*||
        return float(max(gg - 2 * s * gr + s * s * rr, 0.0) ** 0.5)

    return _judge(distance(1.0), max(rr, 0.0) ** 0.5, scale, distance(scale), tolerance)


def worst(errors: Iterable[float | None]) -> float | None:
    """The largest error, or None when one is missing or not a number (NaN)."""
    values = list(errors)
    if any(v is None or v != v for v in values):
        return None
    return max((v for v in values if v is not None), default=0.0)
