"""The course's rule: each rank backprops W * S_r / N.

S_r is the rank's summed token loss over the whole accumulation window and N
the all-reduced number of supervised tokens in that window. DDP then averages
gradients over W ranks, which yields the gradient of sum_r S_r / N.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.edition import reword
from course_lib.core.model import count_tokens, loss_sum

MODES = ("global_token", "mean_of_means")


class EmptyWindowError(RuntimeError):
    """No supervised token in the whole window, on any rank."""

    @property
    def said(self) -> str:
        """The message in the learner's language (``COURSE_EDITION``); the
        message itself stays English, as logs and reports keep it."""
        return reword(str(self), MESSAGES)


EMPTY_WINDOW = ("no supervised token in the global window (N = 0): "
                "every rank stops here, after the same all_reduce")
# What an EmptyWindowError says: here, in core.reference and for an
# objective (core.objectives, steps.objectives), as ``said`` reads it.
MESSAGES = (EMPTY_WINDOW, "no supervised token in the window (N = 0)",
            "{objective}: the window's normalizer is 0 on every rank",
            "{objective}: the window's normalizer is 0")


def global_count(local_count: torch.Tensor) -> torch.Tensor:
    """N: the window's token count summed over ranks, kept on the device."""
    count = local_count.detach().clone().to(torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return count


def checked_global_count(local_count: torch.Tensor) -> int:
    """N on the host, refused when it is 0: every rank sees the same N, so
    every rank stops at the same point, right after the same all_reduce."""
    n = int(global_count(local_count))
    if n <= 0:
        raise EmptyWindowError(EMPTY_WINDOW)
    return n


def global_token_loss(local_sum: torch.Tensor, global_tokens: int,
                      world_size: int) -> torch.Tensor:
    """W * S_r / N. Refuses N <= 0: a mean over no token is undefined."""
    if global_tokens <= 0:
        raise EmptyWindowError(EMPTY_WINDOW)
    return local_sum * (world_size / global_tokens)


def scale_grads(model: nn.Module, factor: float | torch.Tensor) -> None:
    """Multiply every gradient in place (after DDP's sync, so every rank alike)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)


@dataclass
class WindowStats:
    local_tokens: int
    global_tokens: int
    local_loss_sum: float


def window_loss(stats: WindowStats, device: torch.device) -> float:
    """The window's loss per token over every rank, sum_r S_r / N: the
    number a training log should report, on every rank alike. One float64
    all_reduce of S_r, which every rank calls."""
    total = torch.tensor([stats.local_loss_sum], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total) / stats.global_tokens


Microbatch = tuple[torch.Tensor, torch.Tensor]  # (inputs, labels)


def window_count(microbatches: Sequence[Microbatch]) -> torch.Tensor:
    """This rank's supervised tokens over the whole window, on the device.
    Every rank holds at least one microbatch, even an empty one."""
    counts = [count_tokens(labels) for _, labels in microbatches]
    return torch.stack(counts).sum() if counts else torch.zeros((), dtype=torch.int64)


def deferred_sync(model: nn.Module, microbatches: Sequence[Microbatch]
                  ) -> Iterator[tuple[int, Microbatch]]:
    """Yield the microbatches; all but the last run inside ``no_sync()``.

    The caller's loop body (forward AND backward) runs inside the context:
    DDP arms its reduction during the forward pass, so wrapping only the
    backward would still synchronise every microbatch.
    """
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    last = len(microbatches) - 1
    for index, mb in enumerate(microbatches):
        with no_sync() if index < last else contextlib.nullcontext():
            yield index, mb


def accumulate_window(model: nn.Module, microbatches: Sequence[Microbatch],
                      mode: str, world_size: int,
                      on_micro_end: Callable[[int], None] | None = None
                      ) -> WindowStats:
    """Forward/backward every microbatch of one window; no optimizer step.

    Counting happens first, so every microbatch uses the same window-wide N.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    local_count = window_count(microbatches)
    # One scalar all_reduce per window; N is needed on the host to refuse an
    # empty window before any backward. The naive mode never learns N.
    global_tokens = checked_global_count(local_count) if mode == "global_token" else -1
    model.zero_grad(set_to_none=True)
    summed = torch.zeros((), device=local_count.device)
    for index, (inputs, labels) in deferred_sync(model, microbatches):
        s = loss_sum(model(inputs), labels)
        if mode == "global_token":
            loss = global_token_loss(s, global_tokens, world_size)
        else:
            # Negative control: a local mean. On a rank with no token the loss
            # is 0/0 = NaN, yet its gradient is a finite zero (cross-entropy's
            # backward zeroes ignored targets): the empty rank silently
            # dilutes the others by 1/W.
            loss = s / local_count
        loss.backward()
        summed = summed + s.detach()
        if on_micro_end is not None:
            on_micro_end(index)
    return WindowStats(int(local_count), global_tokens, float(summed))
