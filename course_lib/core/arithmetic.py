"""Plain-Python means: the whole lesson before any tensor appears."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The token explorer's ranks: rank 0 and 1 give the 12/36 counter-example;
# the others are there when the learner raises W.
DEFAULT_TOKENS = (12, 36, 24, 48, 8, 60, 16, 30)
DEFAULT_LOSSES = (1.0, 3.0, 2.0, 1.5, 2.5, 0.5, 3.5, 1.0)


def mean_of_means(loss_sums: Sequence[float], counts: Sequence[int]) -> float:
    """Average each rank's mean, then average the ranks: every rank weighs 1/W."""
    _check(loss_sums, counts)
    return sum(s / n for s, n in zip(loss_sums, counts, strict=True)) / len(counts)


def global_mean(loss_sums: Sequence[float], counts: Sequence[int]) -> float:
    """Mean over all tokens: every token weighs 1/N."""
    _check(loss_sums, counts)
    return sum(loss_sums) / sum(counts)


def rank_weights(counts: Sequence[int]) -> list[float]:
    """Share of the global mean that each rank's local mean carries (N_r / N)."""
    total = sum(counts)
    return [n / total for n in counts]


def token_weights(counts: Sequence[int], scheme: str) -> list[float]:
    """Weight of one token of each rank in the final number.

    ``global``: 1/N for every token. ``mean_of_means``: 1/(W * N_r).
    """
    if scheme == "global":
        return [1 / sum(counts)] * len(counts)
    if scheme == "mean_of_means":
        return [1 / (len(counts) * n) for n in counts]
    raise ValueError(f"unknown scheme {scheme!r}")


def scaled_local_losses(loss_sums: Sequence[float], counts: Sequence[int]) -> list[float]:
    """What each rank backprops under the course's rule: W * S_r / N."""
    world, total = len(counts), sum(counts)
    if total <= 0:
        raise ValueError("no supervised token in the window: N must be > 0")
    return [world * s / total for s in loss_sums]


def counter_example() -> dict[str, Any]:
    """The 12/36 counter-example: 2 versus 2.5."""
    counts, loss_sums = [12, 36], [12.0, 108.0]
    scaled = scaled_local_losses(loss_sums, counts)
    return {
        "local_tokens": counts,
        "local_loss_sums": loss_sums,
        "local_means": [s / n for s, n in zip(loss_sums, counts, strict=True)],
        "mean_of_means": mean_of_means(loss_sums, counts),
        "global_mean": global_mean(loss_sums, counts),
        "rank_weights": rank_weights(counts),
        "scaled_local_losses": scaled,
        "ddp_average_of_scaled": sum(scaled) / len(scaled),
    }


def theta_example(theta: float, counts: Sequence[int] = (12, 36),
                  targets: Sequence[float] = (1.0, -1.0)) -> dict[str, Any]:
    """One parameter, squared error: equal losses at theta=0, unequal gradients.

    Rank r holds counts[r] targets equal to targets[r];
    its loss sum is counts[r] * (theta - target)^2.
    """
    sums = [n * (theta - y) ** 2 for n, y in zip(counts, targets, strict=True)]
    grads = [n * 2 * (theta - y) for n, y in zip(counts, targets, strict=True)]
    return {
        "loss_mean_of_means": mean_of_means(sums, counts),
        "loss_global": global_mean(sums, counts),
        "grad_mean_of_means": mean_of_means(grads, counts),
        "grad_global": global_mean(grads, counts),
    }


def _check(loss_sums: Sequence[float], counts: Sequence[int]) -> None:
    if len(loss_sums) != len(counts) or not counts:
        raise ValueError("need one loss sum per rank, and at least one rank")
    if any(n <= 0 for n in counts):
        raise ValueError("every rank needs at least one token for a local mean")
