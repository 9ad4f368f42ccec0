"""Which formula a framework's gradient matches.

Each candidate weighs every microbatch's summed-loss gradient g_{r,m} =
∇ S_{r,m} by a coefficient that depends on the window's counts only, so
its gradient is sum_{r,m} c(r, m) g_{r,m}. A measured gradient is compared
with each, from inner products alone (``Against``); the one with the
smallest relative residual is named. The
exact one is the global token mean, c = 1 / N, named "token mean": "exact"
is only a verdict (``core.verdicts``), never a formula's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from course_lib.core.verdicts import Measured, classify_inner
from course_lib.frameworks.window import Counts

Coefficient = Callable[[Counts, int, int], float]  # (counts, rank, micro) -> c


@dataclass(frozen=True)
class Candidate:
    name: str
    formula: str  # what rank r backprops for microbatch m, after DDP's mean
    coefficient: Coefficient
    objective: str | None = None  # the recipes' OBJECTIVES key it is, if any


def _w(c: Counts) -> int:
    return len(c.n)


def _m(c: Counts) -> int:
    return len(c.n[0])


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("token mean", "S / N: the global token mean",
              lambda c, r, m: 1 / c.N, "token_mean"),
    Candidate("counted before the shift", "S / (N + R): every row's first label "
              "counted too", lambda c, r, m: 1 / (c.N + c.R), "shift_scaled"),
    Candidate("mean of rank means", "S / (W N_r)",
              lambda c, r, m: 1 / (_w(c) * c.N_r[r]), "rank_means"),
    Candidate("mean of rank means counted before the shift", "S / (W N_r')",
              lambda c, r, m: 1 / (_w(c) * sum(c.n_before_shift[r])), "rank_means_pre_shift"),
    Candidate("mean of microbatch means", "S / (W M n)",
              lambda c, r, m: 1 / (_w(c) * _m(c) * c.n[r][m]), "microbatch_means"),
    Candidate("mean of microbatch means without 1/M", "S / (W n)",
              lambda c, r, m: 1 / (_w(c) * c.n[r][m]), "microbatch_sums"),
    Candidate("token mean without 1/M", "M S / N",
              lambda c, r, m: _m(c) / c.N),
    Candidate("token mean times 1/W", "S / (W N)",
              lambda c, r, m: 1 / (_w(c) * c.N), "world_scaled"),
    Candidate("mean of rank means without 1/M", "M S / (W N_r)",
              lambda c, r, m: _m(c) / (_w(c) * c.N_r[r])),
)


@dataclass(frozen=True)
class Match:
    name: str
    residual: float  # ||g - candidate|| / ||candidate||


EXACT = CANDIDATES[0]  # the global token mean: the reference

# Formula names changed since a committed report was measured: stored -> today's.
RENAMED = {"exact": "token mean", "exact without 1/M": "token mean without 1/M",
           "exact times 1/W": "token mean times 1/W"}


# --- the same, from inner products only -------------------------------------------
#
# A candidate is a combination of the K = W M microbatch gradients, so its
# distance to a measured g needs only <g_i, g_j>, <g, g_i> and |g|^2: no
# candidate gradient is ever built (GPT-2 small has 124M components).


def pairs(vectors: Sequence[torch.Tensor], others: Sequence[torch.Tensor] | None = None,
          chunk: int = 1 << 20) -> torch.Tensor:
    """float64 inner products <v_i, w_j> of equally long vectors: (K, K)
    among ``vectors``, or (K, L) against ``others``. A block of columns at
    a time, in float64: each component is converted once, not once per pair
    (a float32 product is exact in float64)."""
    rows = [v.flatten() for v in vectors]
    cols = rows if others is None else [w.flatten() for w in others]
    n = rows[0].numel()
    found = torch.zeros((len(rows), len(cols)), dtype=torch.float64)
    left = torch.empty((len(rows), min(chunk, n)), dtype=torch.float64)
    right = left if others is None else torch.empty((len(cols), min(chunk, n)),
                                                     dtype=torch.float64)
    for start in range(0, n, chunk):
        width = min(chunk, n - start)
        for block, vs in ((left, rows), (right, cols))[: 1 if others is None else 2]:
            for i, v in enumerate(vs):
                block[i, :width].copy_(v[start:start + width])
        found += left[:, :width] @ right[:, :width].T
    return found


@dataclass(frozen=True)
class Gram:
    """The microbatch gradients' inner products, in (rank, micro) order."""

    counts: Counts
    pairs: torch.Tensor  # (K, K) float64: <g_i, g_j>

    @classmethod
    def of(cls, counts: Counts, grads: list[list[torch.Tensor]]) -> Gram:
        return cls(counts, pairs([g for row in grads for g in row]))

    def coefficients(self, candidate: Candidate) -> torch.Tensor:
        c = self.counts
        return torch.tensor([candidate.coefficient(c, r, m) for r in range(len(c.n))
                             for m in range(len(c.n[0]))], dtype=torch.float64)


@dataclass(frozen=True)
class Against:
    """One measured gradient g seen from the microbatch gradients."""

    gram: Gram
    onto: torch.Tensor  # (K,) <g, g_i>
    norm2: float  # |g|^2

    @classmethod
    def of(cls, gram: Gram, g: torch.Tensor, grads: list[list[torch.Tensor]]) -> Against:
        return cls(gram, pairs([g], [x for row in grads for x in row])[0],
                   float(pairs([g])[0, 0]))

    def _terms(self, candidate: Candidate) -> tuple[float, float]:
        c = self.gram.coefficients(candidate)
        return float(c @ self.onto), float(c @ self.gram.pairs @ c)  # <g, g_c>, |g_c|^2

    def residual(self, candidate: Candidate) -> float:
        """|g - g_c| / |g_c|."""
        cross, norm2 = self._terms(candidate)
        return max(self.norm2 - 2 * cross + norm2, 0.0) ** 0.5 / norm2 ** 0.5

    def measured(self, candidate: Candidate, tolerance: float) -> Measured:
        """g judged against g_c as ``classify`` judges vectors."""
        cross, norm2 = self._terms(candidate)
        return classify_inner(self.norm2, cross, norm2, tolerance)

    def scale(self, candidate: Candidate) -> float:
        """The least-squares s of g = s g_c."""
        cross, norm2 = self._terms(candidate)
        return cross / norm2

    def best(self) -> Match:
        return min((Match(c.name, self.residual(c)) for c in CANDIDATES),
                   key=lambda m: m.residual)
