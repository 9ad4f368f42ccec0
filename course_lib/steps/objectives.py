"""Steps for any objective of ``core.objectives``: one correct design
(the distributed rule of ``core.objectives``) and the bugs each invites.

Each step takes the objective the job audits as a fourth argument, after
``(model, microbatches, world_size)``: the harness passes the rank
context's (``StepInfo.call``). The bugs below are each written for one
objective. ``CATALOGS`` maps an objective to the steps ``course-lib bugs
--objective`` runs: the token mean keeps the built-in catalog.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from course_lib.core import objectives
from course_lib.core.model import count_tokens, supervised_mask
from course_lib.core.normalize import EmptyWindowError, Microbatch, deferred_sync, window_count
from course_lib.core.objectives import Objective
from course_lib.steps.base import StepInfo, backprop_each
from course_lib.steps.base import info as plain_info
from course_lib.steps.catalog import BUILTIN, global_token


def _params(model) -> torch.nn.Module:
    return getattr(model, "module", model)


def _backprop_with_penalty(model, microbatches, o: Objective, scale, penalty_at) -> None:
    """Backprop ``scale(numerator, labels)`` on every microbatch, plus the
    objective's window penalty times ``penalty_at(index, rank)`` (0: none)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    for index, (inputs, labels) in deferred_sync(model, microbatches):
        logits = model(inputs)
        loss = scale(o.microbatch_numerator(logits, labels), labels)
        weight = penalty_at(index, rank)
        penalty = o.window_penalty(_params(model)) if weight else None
        if penalty is not None:
            loss = loss + weight * penalty
        loss.backward()


def _labels(microbatches: Sequence[Microbatch]) -> list[torch.Tensor]:
    return [labels for _, labels in microbatches]


def summed_over_ranks(local: torch.Tensor) -> torch.Tensor:
    """A float64 sum over every rank (a class-weight sum is no integer count)."""
    total = local.detach().clone().to(torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def _global_normalizer(microbatches: Sequence[Microbatch], o: Objective) -> torch.Tensor:
    """The objective's normalizer over every rank: C, or the all-reduced sum
    of every microbatch's denominator. Every rank takes part, and every
    rank refuses an empty window together."""
    if o.constant is not None:
        return torch.tensor(o.constant, dtype=torch.float64, device=microbatches[0][1].device)
    total = summed_over_ranks(o.local_denominator(_labels(microbatches)))
    if float(total) <= 0:
        raise EmptyWindowError(f"{o.name}: the window's normalizer is 0 on every rank")
    return total


# --- the correct design ------------------------------------------------------------


def objective_global(model, microbatches, world_size, objective: Objective):
    """Each rank backprops W * numerator_r / normalizer, the normalizer
    all-reduced first (or C); DDP's mean gives the window's objective. A
    penalty on the parameters enters once per rank, on the last
    microbatch: DDP's mean of W equal terms is the term once."""
    den = _global_normalizer(microbatches, objective)
    last = len(microbatches) - 1
    _backprop_with_penalty(model, microbatches, objective,
                           lambda num, lb: num * world_size / den.to(num.dtype),
                           lambda index, rank: 1.0 if index == last else 0.0)


# --- bugs, whatever the normalizer -----------------------------------------------------


def local_normalizer(model, microbatches, world_size, objective: Objective):
    den = objective.local_denominator(_labels(microbatches))
    backprop_each(model, microbatches, lambda lg, lb: objective.microbatch_numerator(lg, lb)
                  * world_size / den.to(lg.dtype))


def per_microbatch_normalizer(model, microbatches, world_size, objective: Objective):
    o, steps = objective, len(microbatches)
    backprop_each(model, microbatches, lambda lg, lb: o.microbatch_numerator(lg, lb)
                  / o.local_denominator([lb]).clamp(min=1).to(lg.dtype) / steps)


# --- the document mean's own bug -------------------------------------------------------


def rows_as_documents(model, microbatches, world_size, objective: Objective):
    # The sequence objective's rule, right on rows of one sequence, run on packed rows.
    rows = objectives.OBJECTIVES["sequence"]
    den = summed_over_ranks(rows.local_denominator(_labels(microbatches)))
    backprop_each(model, microbatches, lambda lg, lb: rows.microbatch_numerator(lg, lb)
                  * world_size / den.to(lg.dtype))


# --- the weighted mean's own bug -----------------------------------------------------


def weights_over_token_count(model, microbatches, world_size, objective: Objective):
    n = summed_over_ranks(window_count(microbatches))
    backprop_each(model, microbatches, lambda lg, lb: objective.microbatch_numerator(lg, lb)
                  * world_size / n.to(lg.dtype))


# --- the constant's own bugs ---------------------------------------------------------


def constant_from_the_batch(model, microbatches, world_size, objective: Objective):
    # Dr. GRPO's C is batch x max length: taken from each microbatch's own shape.
    backprop_each(model, microbatches, lambda lg, lb: objective.microbatch_numerator(lg, lb)
                  * world_size
                  / (lb.shape[0] * int(supervised_mask(lb).sum(dim=-1).max())))


def constant_forgot_world_size(model, microbatches, world_size, objective: Objective):
    c = objective.constant or 1.0
    backprop_each(model, microbatches,
                  lambda lg, lb: objective.microbatch_numerator(lg, lb) / c)


# --- the regularisers' own bugs ------------------------------------------------------


def _token_part(microbatches, world_size, objective: Objective):
    """The correct scaling of the numerator: W / the all-reduced normalizer."""
    den = _global_normalizer(microbatches, objective)
    return lambda num, lb: num * world_size / den.to(num.dtype)


def penalty_every_microbatch(model, microbatches, world_size, objective: Objective):
    _backprop_with_penalty(model, microbatches, objective,
                           _token_part(microbatches, world_size, objective),
                           lambda index, rank: 1.0)


def penalty_times_world_size(model, microbatches, world_size, objective: Objective):
    # The penalty inside the W * (...) that undoes DDP's mean: W times too strong.
    last = len(microbatches) - 1
    _backprop_with_penalty(model, microbatches, objective,
                           _token_part(microbatches, world_size, objective),
                           lambda index, rank: float(world_size) if index == last else 0.0)


def penalty_on_rank_zero(model, microbatches, world_size, objective: Objective):
    # Added once "globally", by rank 0 alone: DDP's mean divides it by W.
    last = len(microbatches) - 1
    _backprop_with_penalty(model, microbatches, objective,
                           _token_part(microbatches, world_size, objective),
                           lambda index, rank: 1.0 if index == last and rank == 0 else 0.0)


def zloss_mean_per_microbatch(model, microbatches, world_size, objective: Objective):
    o, steps = objective, len(microbatches)
    n = summed_over_ranks(window_count(microbatches))

    def loss_of(lg, lb):
        token = objectives.token_losses(lg, lb).sum() * world_size / n.to(lg.dtype)
        z_mean = objectives.z_loss(lg, lb) / count_tokens(lb).clamp(min=1).to(lg.dtype)
        return token + (o.strength or 0.0) * z_mean / steps  # the z term's own mean
    backprop_each(model, microbatches, loss_of)


# --- the catalogs ---------------------------------------------------------------------


def info(func, kind: str, description: str, why: str) -> StepInfo:
    """A step of this module: it takes the objective (``StepInfo.call``)."""
    return plain_info(func, kind, description, why, takes_objective=True)


_CORRECT = info(objective_global, "correct",
                "each rank backprops W * numerator_r / normalizer (all-reduced, or C)",
                "the mean over W of W * numerator_r / normalizer is the window's objective")
_LOCAL = info(local_normalizer, "bug", "the normalizer taken locally, without the all_reduce",
              "each rank divides by its own share, so ranks are weighted, not the units")
_PER_MICRO = info(per_microbatch_normalizer, "bug",
                  "each microbatch's own normalizer, divided by the number of microbatches",
                  "a mean of microbatch means weighs a unit by its microbatch's size")

STEPS: dict[str, StepInfo] = {s.name: s for s in (
    _CORRECT, _LOCAL, _PER_MICRO,
    info(rows_as_documents, "bug", "every packed row weighs the same (the sequence rule)",
         "a row of many short documents counts as one: each of them weighs less"),
    info(weights_over_token_count, "bug", "the weighted sum divided by the token count N",
         "the weights' sum, not N, normalizes a weighted mean"),
    info(constant_from_the_batch, "bug",
         "C taken from each microbatch's shape (rows x longest row)",
         "C changes from microbatch to microbatch and rank to rank: a length bias again"),
    info(constant_forgot_world_size, "bug", "W forgotten: each rank backprops S_r / C",
         "DDP averages over W ranks, so the gradient comes out W times too small"),
    info(penalty_every_microbatch, "bug", "the L2 penalty added to every microbatch's loss",
         "it enters M times per optimizer step: the penalty grows with accumulation"),
    info(penalty_times_world_size, "bug", "the L2 penalty inside the W * (...) scaling",
         "the W that undoes DDP's mean of the token term multiplies the penalty too"),
    info(penalty_on_rank_zero, "bug", "the L2 penalty added once, on rank 0 only",
         "DDP averages it with W - 1 zeros: the penalty is W times too weak"),
    info(zloss_mean_per_microbatch, "bug",
         "the z-loss as each microbatch's own mean, divided by the number of microbatches",
         "the auxiliary term needs the token term's normalization, not its own"),
)}

# The token mean's wrong unit, in the other objectives' catalogs.
_TOKEN_MEAN = plain_info(global_token, "bug", "the token mean's design, W * S_r / N",
                   "right for the token mean, wrong for this objective")

CATALOGS: dict[str, dict[str, StepInfo]] = {
    "token": BUILTIN,
    # The planned windows hold the same number of sequences in every
    # microbatch; a per-microbatch sequence count goes wrong on token-budget
    # microbatches (uneven_microbatches) only.
    "sequence": {s.name: s for s in (_CORRECT, _LOCAL, _PER_MICRO, _TOKEN_MEAN)},
    # Packed rows hold different numbers of documents: a per-microbatch count is a bug.
    "document": {s.name: s for s in (_CORRECT, _LOCAL, _PER_MICRO, _TOKEN_MEAN,
                                     STEPS["rows_as_documents"])},
    "weighted": {s.name: s for s in (_CORRECT, _LOCAL, _PER_MICRO, _TOKEN_MEAN,
                                     STEPS["weights_over_token_count"])},
    "constant": {s.name: s for s in (_CORRECT, STEPS["constant_from_the_batch"],
                                     STEPS["constant_forgot_world_size"], _TOKEN_MEAN)},
    "zloss": {s.name: s for s in (_CORRECT, _TOKEN_MEAN,
                                  STEPS["zloss_mean_per_microbatch"])},
    "l2": {s.name: s for s in (_CORRECT, _TOKEN_MEAN, STEPS["penalty_every_microbatch"],
                               STEPS["penalty_times_world_size"],
                               STEPS["penalty_on_rank_zero"])},
}
