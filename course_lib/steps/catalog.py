"""The built-in steps: the correct designs, the negative control and the bug catalog.

Each is a small function with a one-line description (``BUILTIN``); the
audit runs them like any learner's step (see ``course_lib.steps``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.data import IGNORE_INDEX
from course_lib.core.model import count_before_shift, count_tokens, loss_sum
from course_lib.core.normalize import (
    accumulate_window,
    checked_global_count,
    global_count,
    scale_grads,
    window_count,
)
from course_lib.steps.base import StepInfo, backprop_sums, info, with_setup

# --- the correct designs ------------------------------------------------------------


def global_token(model, microbatches, world_size):
    """Each rank backprops W * S_r / N; DDP's mean then gives sum_r S_r / N."""
    accumulate_window(model, microbatches, "global_token", world_size)


def sum_reduction(model: DDP, world_size: int) -> None:
    """Set-up for steps that want DDP to SUM gradients over ranks."""
    def sum_allreduce(state, bucket):
        """DDP comm hook: SUM a bucket of gradients over ranks, no division by W."""
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(None, sum_allreduce)


@with_setup(sum_reduction)
def sum_hook(model, microbatches, world_size):
    """Each rank backprops S_r / N; a comm hook SUMs gradients instead of averaging."""
    n = checked_global_count(window_count(microbatches))
    backprop_sums(model, microbatches, lambda s, _: s / n)


def post_scale(model, microbatches, world_size):
    """Backprop the raw sum S_r; after DDP's mean, scale the gradients by W / N."""
    backprop_sums(model, microbatches, lambda s, _: s)
    scale_grads(model, world_size / checked_global_count(window_count(microbatches)))


def pad_to_longest_rank(model, microbatches, world_size):
    """Uneven ranks: all-reduce the longest rank's microbatch count, pad the
    others with empty microbatches, then the course's rule. Every rank runs
    the same loop, so any collective in it pairs up, whatever each holds."""
    longest = torch.tensor(len(microbatches), device=microbatches[-1][1].device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    inputs, labels = microbatches[-1]
    empty = (inputs[:1], torch.full_like(labels[:1], IGNORE_INDEX))  # runs, holds no token
    global_token(model, [*microbatches, *[empty] * (int(longest) - len(microbatches))],
                 world_size)


# --- the negative control -------------------------------------------------------------


def mean_of_means(model, microbatches, world_size):
    """Each rank backprops its own mean S_r / N_r; DDP averages the W means."""
    accumulate_window(model, microbatches, "mean_of_means", world_size)


# --- the bug catalog ------------------------------------------------------------------


def local_count(model, microbatches, world_size):
    n_local = window_count(microbatches)
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n_local))


def extra_accumulation_division(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    steps = len(microbatches)
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n) / steps)


def forgot_world_size(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    backprop_sums(model, microbatches, lambda s, _: s / n)


def padding_counted(model, microbatches, world_size):
    padded = torch.tensor(sum(labels.numel() for _, labels in microbatches))
    n = int(global_count(padded))
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n))


def length_before_shift(model, microbatches, world_size):
    n = int(global_count(torch.stack([count_before_shift(lb) for _, lb in microbatches])
                         .sum()))
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n))


def first_microbatch_only(model, microbatches, world_size):
    n = int(global_count(count_tokens(microbatches[0][1])))
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n))


def no_sync_backward_only(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    last = len(microbatches) - 1
    for index, (inputs, labels) in enumerate(microbatches):
        loss = loss_sum(model(inputs), labels) * (world_size / n)
        with model.no_sync() if index < last else contextlib.nullcontext():
            loss.backward()


def join_every_microbatch(model, microbatches, world_size):
    # Join lets a rank that ran out of microbatches shadow the others'
    # all-reduces with zeros; each microbatch syncs (no no_sync).
    n = checked_global_count(window_count(microbatches))
    with Join([model]):
        for inputs, labels in microbatches:
            (loss_sum(model(inputs), labels) * (world_size / n)).backward()


def per_microbatch_mean(model, microbatches, world_size):
    steps = len(microbatches)
    backprop_sums(model, microbatches,
                   lambda s, labels: s / count_tokens(labels) / steps)


def count_never_reset(model, microbatches, world_size):
    # The running total lives on the model, so it survives from window to window.
    seen = getattr(model, "_tokens_seen", 0) + checked_global_count(window_count(microbatches))
    model._tokens_seen = seen
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / seen))


# --- the catalog --------------------------------------------------------------------


BUILTIN: dict[str, StepInfo] = {s.name: s for s in (
    info(global_token, "correct", "each rank backprops W * S_r / N; DDP averages",
          "the mean over W of W * S_r / N is sum_r S_r / N"),
    info(sum_hook, "correct", "each rank backprops S_r / N; a comm hook SUMs",
          "the sum over ranks of S_r / N is sum_r S_r / N"),
    info(post_scale, "correct", "backprop the raw sum S_r; scale grads by W / N",
          "the mean of the sums, times W / N, is sum_r S_r / N"),
    info(pad_to_longest_rank, "correct",
         "uneven ranks: pad to the longest rank's microbatch count, then W * S_r / N",
         "empty microbatches add no token and every rank makes the same collectives"),
    info(mean_of_means, "bug", "negative control: each rank backprops its mean S_r / N_r",
          "a token on a rank with few tokens weighs more than one on a busy rank"),
    info(local_count, "bug", "N taken locally, without the all_reduce: W * S_r / N_r",
          "each rank divides by its own count, so ranks are weighted, not tokens"),
    info(extra_accumulation_division, "bug",
          "an extra division by the number of accumulation steps",
          "N already counts the whole window: dividing again shrinks the gradient"),
    info(forgot_world_size, "bug", "W forgotten: each rank backprops S_r / N",
          "DDP averages over W ranks, so the gradient comes out W times too small"),
    info(padding_counted, "bug", "padding counted as tokens in N",
          "N grows with the padding, which depends on how sequences are batched"),
    info(length_before_shift, "bug",
          "sequence length counted before the label shift (L, not L - 1)",
          "N is too large by one per sequence: the gradient shrinks by N / (N + R)"),
    info(first_microbatch_only, "bug", "N counted on the first microbatch only",
          "the other microbatches' tokens are missing from N: the gradient is too big"),
    info(no_sync_backward_only, "bug", "no_sync() wraps the backward only",
          "DDP arms its hooks in forward, so every microbatch syncs: on even ranks "
          "the gradient is right (averaging is linear) but the communication is "
          "wasted; uneven ranks hang"),
    info(join_every_microbatch, "bug", "Join around a loop that syncs every microbatch",
          "a rank that ran out shadows the syncs with zeros, and what was synced "
          "before is averaged again: no hang, a wrong gradient"),
    info(per_microbatch_mean, "bug",
         "each microbatch's own mean, divided by the number of microbatches",
          "a mean of microbatch means weighs tokens by their microbatch's size"),
    info(count_never_reset, "bug",
          "the token count, kept on the model, is never reset between windows",
          "right on the first window, then N keeps growing and the gradient fades"),
)}


