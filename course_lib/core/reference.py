"""Single-process reference: the gradient of sum(all window token losses) / N."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from course_lib.core.model import loss_sum
from course_lib.core.normalize import EmptyWindowError, Microbatch, window_count
from course_lib.core.objectives import Objective, window_loss


def grad_parts(model: nn.Module) -> list[torch.Tensor]:
    """Each parameter's gradient, flat, in parameter order (zeros for none)."""
    return [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
            for p in model.parameters()]


def flat_grad(model: nn.Module) -> torch.Tensor:
    """All gradient components, concatenated in parameter order (FP32 or wider)."""
    return torch.cat(grad_parts(model))


def window_tokens(microbatches: Sequence[Microbatch]) -> int:
    """N, the window's supervised tokens; an empty window is refused."""
    n = int(window_count(microbatches))
    if n <= 0:
        raise EmptyWindowError("no supervised token in the window (N = 0)")
    return n


def token_reference(model: nn.Module, microbatches: Sequence[Microbatch]
                    ) -> tuple[torch.Tensor, int, float]:
    """One backward through the mean over every supervised token of the
    window: every rank's microbatches, in one process. Returns (flat
    gradient, N, the window's loss per token)."""
    n = window_tokens(microbatches)
    model.zero_grad(set_to_none=True)
    sums = [loss_sum(model(inputs), labels) for inputs, labels in microbatches]
    loss = sum(sums[1:], sums[0]) / n
    loss.backward()
    return flat_grad(model), n, float(loss.detach())


def reference_gradient(model: nn.Module, microbatches: Sequence[Microbatch],
                       objective: Objective | None = None) -> tuple[torch.Tensor, int, float]:
    """The token mean's reference (``token_reference``), or one backward
    through another objective's window loss (``core.objectives``)."""
    if objective is None or objective.name == "token":
        return token_reference(model, microbatches)
    n = window_tokens(microbatches)
    model.zero_grad(set_to_none=True)
    loss = window_loss(objective, [(model(inputs), labels)
                                   for inputs, labels in microbatches])
    penalty = objective.window_penalty(model)
    if penalty is not None:  # once for the window, whatever its microbatches
        loss = loss + penalty
    loss.backward()
    return flat_grad(model), n, float(loss.detach())


@dataclass(frozen=True)
class Comparison:
    """One gradient (or the worst of every rank's) against the reference."""

    max_abs_err: float | None  # None when a component is not finite
    allclose: bool
    violations: int  # components with |g - g*| > atol + rtol |g*|


def compare(candidate: torch.Tensor, reference: torch.Tensor,
            atol: float, rtol: float) -> Comparison:
    """torch.allclose semantics, component by component.

    A component violates when |candidate - reference| > atol + rtol * |reference|.
    """
    err = (candidate - reference).abs()
    bound = atol + rtol * reference.abs()
    violations = int((~(err <= bound)).sum())  # NaN and inf count as violations
    return Comparison(
        max_abs_err=float(err.max()) if err.numel() else 0.0,
        allclose=bool(torch.allclose(candidate, reference, atol=atol, rtol=rtol)),
        violations=violations,
    )
