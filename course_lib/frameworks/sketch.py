"""A gradient's sketch: a few hundred numbers that keep its distances.

The audit judges a gradient from inner products (``candidates``): of every
rank's captured gradient and its microbatch gradients, across ranks. For a
large model, exact cross-rank inner products move whole gradients through
the process group (GPT-2 small: 124M components, 0.5 GB per vector). A
sketch S maps each vector to k = ``rows * cols`` numbers, with
E <Sx, Sy> = <x, y>; the ranks exchange those. S is linear, so a
candidate's residual seen through it is the sketch of the residual,
|S (g - g_c)|: the inner products of the sketches give it without
cancellation beyond float64's.

S x = vec(A X B^T) / sqrt(k): X is x laid out as rows of ``WIDTH``
components (the last one zero-padded), A (rows x X's rows) and B (cols x
WIDTH) are standard Gaussian, drawn from a seed that every rank shares: a
Kronecker-structured Johnson-Lindenstrauss map. It costs ``rows`` float32
multiply-adds per component (A X, in blocks of rows summed in float64),
and no random draw of the gradient's size.

Its power (``miss_bound``): for any fixed nonzero d, conditioned on B,
|A Y|_F^2 for Y = X_d B^T is a weighted sum of chi-squares with ``rows``
degrees of freedom, whose lower tail is largest when Y has rank 1
(Chernoff: E exp(-t sum l_j Q_j) = prod (1 + 2 t l_j)^(-rows/2), largest
for one l_j); likewise |X_d B^T|^2 with ``cols``. So
P(|S d|^2 < eps |d|^2) <= f(sqrt eps, rows) + f(sqrt eps, cols), with
f(e, k) = (e exp(1 - e))^(k/2). A gradient 1e-4 away from the reference
(relative), judged against float32's 1e-5, is missed only when
|S d| < |d| / 10: below 1e-19 at 64 x 256.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

WIDTH = 1 << 13  # components per row of X
BLOCK = 512  # rows of X per float32 product, summed in float64
ROWS, COLS = 64, 256  # k = 16,384 numbers per vector
SEED = 20240531
# The audit compares gradients of up to this many components whole: below
# it, moving them costs less than a framework's window (the tiny models).
WHOLE_UP_TO = 1 << 24
COMPARES = ("auto", "exact", "sketch")


@dataclass(frozen=True)
class Sketch:
    """The map for vectors of ``dim`` components."""

    dim: int
    rows: int = ROWS
    cols: int = COLS
    seed: int = SEED

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def __call__(self, *vectors: torch.Tensor) -> torch.Tensor:
        """(len(vectors), k) float64: each vector's sketch, S x."""
        return torch.stack([self.of_parts([v]) for v in vectors])

    def of_parts(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """(k,) float64: the sketch of the parts' concatenation (a model's
        gradients in parameter order), never built whole: X's rows are laid
        from the parts a block at a time."""
        pieces = [p.detach().reshape(-1) for p in parts]
        if (total := sum(p.numel() for p in pieces)) != self.dim:
            raise ValueError(f"sketch of {self.dim} components given {total}")
        a, b = _factors(self)
        ax = torch.zeros((self.rows, WIDTH), dtype=torch.float64)
        buffer = torch.empty(BLOCK * WIDTH)
        k, at = 0, 0  # the piece, and the offset in it, that the next row starts at
        for start in range(0, a.shape[1], BLOCK):
            rows = min(BLOCK, a.shape[1] - start)
            want = rows * WIDTH
            piece = pieces[k] if k < len(pieces) else None
            if (piece is not None and piece.numel() - at >= want
                    and piece.dtype == torch.float32 and piece.device.type == "cpu"):
                block = piece[at:at + want]  # inside one piece: a view, no copy
                at += want
                if at == piece.numel():
                    k, at = k + 1, 0
            else:
                block, filled = buffer[:want], 0
                while filled < want and k < len(pieces):
                    take = min(want - filled, pieces[k].numel() - at)
                    block[filled:filled + take] = pieces[k][at:at + take]
                    filled, at = filled + take, at + take
                    if at == pieces[k].numel():
                        k, at = k + 1, 0
                block[filled:].zero_()  # the last row's padding
            ax += (a[:, start:start + rows] @ block.view(rows, WIDTH)).double()
        return (ax @ b.T).flatten() / math.sqrt(self.size)


@functools.lru_cache(maxsize=4)
def _factors(s: Sketch) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B, drawn once per map: every call with one map reuses them."""
    g = torch.Generator().manual_seed(s.seed)
    a = torch.randn(s.rows, -(-s.dim // WIDTH), generator=g)
    b = torch.randn(s.cols, WIDTH, generator=g, dtype=torch.float64)
    return a, b


def miss_bound(relative: float, tolerance: float, rows: int = ROWS, cols: int = COLS) -> float:
    """An upper bound on the chance that a gradient ``relative`` away from
    the reference reads within ``tolerance`` through the sketch (the
    module's docstring): the sketch must shrink |d| by tolerance/relative."""
    e = tolerance / relative
    if e >= 1:
        return 1.0
    return sum((e * math.exp(1 - e)) ** (k / 2) for k in (rows, cols))


def chosen(compare: str, dim: int) -> Sketch | None:
    """The sketch that gradients of ``dim`` components are compared
    through, or None to compare them whole (``COMPARES``)."""
    if compare not in COMPARES:
        raise ValueError(f"compare: {compare!r} is not one of {', '.join(COMPARES)}")
    if compare == "exact" or (compare == "auto" and dim <= WHOLE_UP_TO):
        return None
    return Sketch(dim)
