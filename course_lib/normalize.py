"""The course's rule: each rank backprops W * S_r / N.

S_r is the rank's summed token loss over the whole accumulation window and N
the all-reduced number of supervised tokens in that window. DDP then averages
gradients over W ranks, which yields the gradient of sum_r S_r / N.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .model import count_tokens, loss_sum

MODES = ("global_token", "mean_of_means")


class EmptyWindowError(RuntimeError):
    """No supervised token in the whole window, on any rank."""


def global_count(local_count: torch.Tensor) -> torch.Tensor:
    """N: the window's token count summed over ranks, kept on the device."""
    count = local_count.detach().clone().to(torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return count


def global_token_loss(local_sum: torch.Tensor, global_tokens: int,
                      world_size: int) -> torch.Tensor:
    """W * S_r / N. Refuses N <= 0: a mean over no token is undefined."""
    if global_tokens <= 0:
        raise EmptyWindowError(
            "no supervised token in the global window (N = 0): "
            "every rank stops here, after the same all_reduce"
        )
    return local_sum * (world_size / global_tokens)


@dataclass
class WindowStats:
    local_tokens: int
    global_tokens: int
    local_loss_sum: float


Microbatch = tuple[torch.Tensor, torch.Tensor]  # (inputs, labels)


def accumulate_window(model: nn.Module, microbatches: Sequence[Microbatch],
                      mode: str, world_size: int,
                      on_micro_end: Callable[[int], None] | None = None
                      ) -> WindowStats:
    """Forward/backward every microbatch of one window; no optimizer step.

    Counting happens first, so every microbatch uses the same window-wide N.
    ``no_sync()`` wraps forward AND backward of every microbatch except the
    last: DDP prepares its reduction during forward, so wrapping only
    backward would still synchronise.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    local_count = sum(count_tokens(labels) for _, labels in microbatches)
    if mode == "global_token":
        # One scalar all_reduce per window; N is needed on the host to refuse
        # an empty window before any backward, the only sync before the loop.
        global_tokens = int(global_count(local_count))
    else:
        global_tokens = -1  # the naive mode never learns N
    model.zero_grad(set_to_none=True)
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    summed = torch.zeros((), device=local_count.device)
    last = len(microbatches) - 1
    for index, (inputs, labels) in enumerate(microbatches):
        with no_sync() if index < last else contextlib.nullcontext():
            s = loss_sum(model(inputs), labels)
            if mode == "global_token":
                loss = global_token_loss(s, global_tokens, world_size)
            else:
                # Negative control: a local mean (0/0 on an empty rank).
                loss = s / local_count
            loss.backward()
        summed = summed + s.detach()
        if on_micro_end is not None:
            on_micro_end(index)
    return WindowStats(int(local_count), global_tokens, float(summed))
