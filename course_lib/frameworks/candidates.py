"""Which formula a framework's gradient matches.

Each candidate weighs every microbatch's summed-loss gradient g_{r,m} =
∇ S_{r,m} by a coefficient that depends on the window's counts only, so
its gradient is sum_{r,m} c(r, m) g_{r,m}. A measured gradient is compared
with each; the one with the smallest relative residual is named. The
exact one is the global token mean, c = 1 / N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_lib.frameworks.window import Counts

Coefficient = Callable[[Counts, int, int], float]  # (counts, rank, micro) -> c


@dataclass(frozen=True)
class Candidate:
    name: str
    formula: str  # what rank r backprops for microbatch m, after DDP's mean
    coefficient: Coefficient


def _w(c: Counts) -> int:
    return len(c.n)


def _m(c: Counts) -> int:
    return len(c.n[0])


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("exact", "S / N: the global token mean",
              lambda c, r, m: 1 / c.N),
    Candidate("counted before the shift", "S / (N + R): every row's first label "
              "counted too", lambda c, r, m: 1 / (c.N + c.R)),
    Candidate("mean of rank means", "S / (W N_r)",
              lambda c, r, m: 1 / (_w(c) * c.N_r[r])),
    Candidate("mean of rank means counted before the shift", "S / (W N_r')",
              lambda c, r, m: 1 / (_w(c) * sum(c.n_before_shift[r]))),
    Candidate("mean of microbatch means", "S / (W M n)",
              lambda c, r, m: 1 / (_w(c) * _m(c) * c.n[r][m])),
    Candidate("mean of microbatch means without 1/M", "S / (W n)",
              lambda c, r, m: 1 / (_w(c) * c.n[r][m])),
    Candidate("exact without 1/M", "M S / N",
              lambda c, r, m: _m(c) / c.N),
    Candidate("exact times 1/W", "S / (W N)",
              lambda c, r, m: 1 / (_w(c) * c.N)),
    Candidate("mean of rank means without 1/M", "M S / (W N_r)",
              lambda c, r, m: _m(c) / (_w(c) * c.N_r[r])),
)


def combine(candidate: Candidate, counts: Counts,
            grads: list[list[torch.Tensor]]) -> torch.Tensor:
    """sum_{r,m} c(r, m) g_{r,m}, in float64."""
    total = torch.zeros_like(grads[0][0], dtype=torch.float64)
    for r, row in enumerate(grads):
        for m, g in enumerate(row):
            total += candidate.coefficient(counts, r, m) * g.double()
    return total


@dataclass(frozen=True)
class Match:
    name: str
    residual: float  # ||g - candidate|| / ||candidate||


def best_match(grad: torch.Tensor, counts: Counts,
               grads: list[list[torch.Tensor]]) -> Match:
    """The candidate nearest to ``grad``, by relative residual."""
    g = grad.double().flatten()
    found = []
    for cand in CANDIDATES:
        ref = combine(cand, counts, grads).flatten()
        found.append(Match(cand.name, float((g - ref).norm() / ref.norm())))
    return min(found, key=lambda m: m.residual)
