"""What a step function is, and the pieces every step is built from.

A step is one accumulation window of one rank, without the optimizer::

    def step(model, microbatches, world_size) -> None

See ``course_lib.steps`` for the contract. The built-in steps written for
any objective (``steps.objectives``) take the audited objective as a fourth
argument, which the harness passes (``StepInfo.call``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.model import loss_sum
from course_lib.core.normalize import Microbatch, deferred_sync
from course_lib.core.objectives import Objective

# A step may return the loss it logged (the recipes do); the audit ignores it.
Step = Callable[[DDP, Sequence[Microbatch], int], float | None]


class StepSpecError(ValueError):
    """A step SPEC that names nothing loadable."""


def with_setup(setup: Callable[[DDP, int], None]) -> Callable[[Step], Step]:
    """Attach ``setup(model, world_size)``, called once before the first forward."""
    def attach(step: Step) -> Step:
        setattr(step, "setup", setup)  # noqa: B010 (a function's attribute, not a field)
        return step
    return attach


@dataclass(frozen=True)
class StepInfo:
    name: str
    func: Step
    kind: str  # "correct" or "bug"; a learner's: "custom" (KINDS)
    description: str  # what the step does, in one line
    why: str  # why that is right or wrong, in one line
    takes_objective: bool = False  # func(model, microbatches, world_size, objective)

    def call(self, model: DDP, microbatches: Sequence[Microbatch], world_size: int,
             objective: Objective) -> float | None:
        """Run the step once, with the audited objective where it takes one."""
        if self.takes_objective:
            return self.func(model, microbatches, world_size, objective)  # type: ignore[call-arg]
        return self.func(model, microbatches, world_size)

    @property
    def setup(self) -> Callable[[DDP, int], None] | None:
        return getattr(self.func, "setup", None)


KINDS = ("correct", "bug", "custom")  # what an audit table says a step is


def info(func: Callable[..., float | None], kind: str, description: str, why: str,
         takes_objective: bool = False) -> StepInfo:
    return StepInfo(func.__name__, func, kind, description, why, takes_objective)


def backprop_each(model: nn.Module, microbatches: Sequence[Microbatch],
                  loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
    """Forward/backward every microbatch (all but the last under ``no_sync``)
    with the scalar ``loss_of(logits, labels)``; return the scalars' sum."""
    logged = 0.0
    for _, (inputs, labels) in deferred_sync(model, microbatches):
        loss = loss_of(model(inputs), labels)
        loss.backward()
        logged += float(loss.detach())
    return logged


def backprop_sums(model: nn.Module, microbatches: Sequence[Microbatch],
                  scale: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """``backprop_each`` with loss = scale(S, labels), S the microbatch's
    summed token loss."""
    backprop_each(model, microbatches,
                  lambda logits, labels: scale(loss_sum(logits, labels), labels))
