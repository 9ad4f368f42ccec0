"""Training steps the audit can check: the correct designs, the control, the bug catalog.

A step is one accumulation window of one rank, without the optimizer::

    def step(model, microbatches, world_size) -> None

- ``model`` is the DDP-wrapped model (``model.no_sync()`` exists);
- ``microbatches`` is this rank's share of the window, a sequence of
  ``(inputs, labels)`` pairs; labels equal to -100 are ignored;
- the step runs forward and backward on every microbatch and leaves the
  gradients in ``.grad``. It may call ``torch.distributed`` collectives.

The audit zeroes the gradients before each call and compares what the step
leaves in ``.grad`` with the single-process gradient of the mean over every
supervised token of the window.

Set-up before the first forward (a DDP comm hook, say) goes in an optional
``setup(model, world_size)`` attribute of the step; the audit calls it once,
right after wrapping a fresh model in DDP. ``with_setup`` attaches one.

A step is named by a short built-in name (``global_token``), a recipe's
name (``fairseq``, see ``recipes``), by ``package.module:function`` or by
``path/to/file.py:function``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .model import count_before_shift, count_tokens, loss_sum
from .normalize import (
    Microbatch,
    accumulate_window,
    checked_global_count,
    deferred_sync,
    global_count,
    scale_grads,
    window_count,
)

Step = Callable[[nn.Module, Sequence[Microbatch], int], None]


class StepSpecError(ValueError):
    """A step SPEC that names nothing loadable."""


def with_setup(setup: Callable[[nn.Module, int], None]) -> Callable[[Step], Step]:
    """Attach ``setup(model, world_size)``, called once before the first forward."""
    def attach(step: Step) -> Step:
        step.setup = setup
        return step
    return attach


# --- building blocks ------------------------------------------------------------


def _backprop_each(model: nn.Module, microbatches: Sequence[Microbatch],
                   scale: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Forward/backward every microbatch with loss = scale(S, labels)."""
    for _, (inputs, labels) in deferred_sync(model, microbatches):
        scale(loss_sum(model(inputs), labels), labels).backward()


# --- the correct designs ------------------------------------------------------------


def global_token(model, microbatches, world_size):
    """Each rank backprops W * S_r / N; DDP's mean then gives sum_r S_r / N."""
    accumulate_window(model, microbatches, "global_token", world_size)


def _sum_allreduce_hook(state, bucket):
    """DDP comm hook: SUM the gradients over ranks instead of averaging them."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def sum_reduction(model: nn.Module, world_size: int) -> None:
    """Set-up for steps that want DDP to SUM gradients over ranks."""
    model.register_comm_hook(None, _sum_allreduce_hook)


@with_setup(sum_reduction)
def sum_hook(model, microbatches, world_size):
    """Each rank backprops S_r / N; a comm hook SUMs gradients instead of averaging."""
    n = checked_global_count(window_count(microbatches))
    _backprop_each(model, microbatches, lambda s, _: s / n)


def post_scale(model, microbatches, world_size):
    """Backprop the raw sum S_r; after DDP's mean, scale the gradients by W / N."""
    _backprop_each(model, microbatches, lambda s, _: s)
    scale_grads(model, world_size / checked_global_count(window_count(microbatches)))


# --- the negative control -------------------------------------------------------------


def mean_of_means(model, microbatches, world_size):
    """Each rank backprops its own mean S_r / N_r; DDP averages the W means."""
    accumulate_window(model, microbatches, "mean_of_means", world_size)


# --- the bug catalog ------------------------------------------------------------------


def local_count(model, microbatches, world_size):
    n_local = window_count(microbatches)
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / n_local))


def extra_accumulation_division(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    steps = len(microbatches)
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / n) / steps)


def forgot_world_size(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    _backprop_each(model, microbatches, lambda s, _: s / n)


def padding_counted(model, microbatches, world_size):
    padded = sum(torch.tensor(labels.numel()) for _, labels in microbatches)
    n = int(global_count(padded))
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / n))


def length_before_shift(model, microbatches, world_size):
    n = int(global_count(sum(count_before_shift(lb) for _, lb in microbatches)))
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / n))


def first_microbatch_only(model, microbatches, world_size):
    n = int(global_count(count_tokens(microbatches[0][1])))
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / n))


def no_sync_backward_only(model, microbatches, world_size):
    n = checked_global_count(window_count(microbatches))
    last = len(microbatches) - 1
    for index, (inputs, labels) in enumerate(microbatches):
        loss = loss_sum(model(inputs), labels) * (world_size / n)
        with model.no_sync() if index < last else contextlib.nullcontext():
            loss.backward()


def per_microbatch_mean(model, microbatches, world_size):
    steps = len(microbatches)
    _backprop_each(model, microbatches,
                   lambda s, labels: s / count_tokens(labels) / steps)


def count_never_reset(model, microbatches, world_size):
    # The running total lives on the model, so it survives from window to window.
    seen = getattr(model, "_tokens_seen", 0) + checked_global_count(window_count(microbatches))
    model._tokens_seen = seen
    _backprop_each(model, microbatches, lambda s, _: s * (world_size / seen))


# --- the catalog --------------------------------------------------------------------


@dataclass(frozen=True)
class StepInfo:
    name: str
    func: Step
    kind: str  # "correct" or "bug"
    description: str  # what the step does, in one line
    why: str  # why that is right or wrong, in one line

    @property
    def setup(self) -> Callable[[nn.Module, int], None] | None:
        return getattr(self.func, "setup", None)


def _info(func: Step, kind: str, description: str, why: str) -> StepInfo:
    return StepInfo(func.__name__, func, kind, description, why)


BUILTIN: dict[str, StepInfo] = {s.name: s for s in (
    _info(global_token, "correct", "each rank backprops W * S_r / N; DDP averages",
          "the mean over W of W * S_r / N is sum_r S_r / N"),
    _info(sum_hook, "correct", "each rank backprops S_r / N; a comm hook SUMs",
          "the sum over ranks of S_r / N is sum_r S_r / N"),
    _info(post_scale, "correct", "backprop the raw sum S_r; scale grads by W / N",
          "the mean of the sums, times W / N, is sum_r S_r / N"),
    _info(mean_of_means, "bug", "negative control: each rank backprops its mean S_r / N_r",
          "a token on a rank with few tokens weighs more than one on a busy rank"),
    _info(local_count, "bug", "N taken locally, without the all_reduce: W * S_r / N_r",
          "each rank divides by its own count, so ranks are weighted, not tokens"),
    _info(extra_accumulation_division, "bug",
          "an extra division by the number of accumulation steps",
          "N already counts the whole window: dividing again shrinks the gradient"),
    _info(forgot_world_size, "bug", "W forgotten: each rank backprops S_r / N",
          "DDP averages over W ranks, so the gradient comes out W times too small"),
    _info(padding_counted, "bug", "padding counted as tokens in N",
          "N grows with the padding, which depends on how sequences are batched"),
    _info(length_before_shift, "bug",
          "sequence length counted before the label shift (L, not L - 1)",
          "N is too large by one per sequence: the gradient shrinks by N / (N + R)"),
    _info(first_microbatch_only, "bug", "N counted on the first microbatch only",
          "the other microbatches' tokens are missing from N: the gradient is too big"),
    _info(no_sync_backward_only, "bug", "no_sync() wraps the backward only",
          "DDP arms its hooks in forward, so every microbatch syncs: the gradient "
          "is right (averaging is linear) but the communication is wasted"),
    _info(per_microbatch_mean, "bug", "each microbatch's own mean, divided by the steps",
          "a mean of microbatch means weighs tokens by their microbatch's size"),
    _info(count_never_reset, "bug", "the token count is never reset between windows",
          "right on the first window, then N keeps growing and the gradient fades"),
)}


def load(spec: str) -> StepInfo:
    """A built-in name, a recipe's name, ``package.module:function`` or
    ``path/to/file.py:function``."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    from .recipes import RECIPES  # the frameworks' recipes, kind "recipe"

    if spec in RECIPES:
        return RECIPES[spec].step
    if ":" not in spec:
        known = ", ".join(BUILTIN)
        raise StepSpecError(f"--step: {spec!r} is not a built-in step ({known}), "
                            "a recipe (course-lib recipes) "
                            "nor module:function or file.py:function")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        module = _module_from_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise StepSpecError(f"--step: cannot import {where!r}: {exc}") from None
    func = getattr(module, name, None)
    if not callable(func):
        raise StepSpecError(f"--step: {where} has no function {name!r}")
    doc = (func.__doc__ or "").strip().splitlines()
    return StepInfo(name, func, "custom", doc[0] if doc else f"{spec}", "")


def _module_from_file(path: Path):
    if not path.is_file():
        raise StepSpecError(f"--step: no such file: {path}")
    name = f"course_user_step_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # a learner's file: any error is bad input
        raise StepSpecError(f"--step: {path} failed to import: "
                            f"{type(exc).__name__}: {exc}") from None
    return module
