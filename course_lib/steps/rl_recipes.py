"""The RL stacks' loss aggregations, re-implemented from their formulas, as
audit steps; and the single-process references of what each one claims.

A policy-gradient step backprops ``-A_t * ratio_t`` per completion token,
ratio_t = pi(t) / pi_old(t), aggregated (summed, then normalized) in a way
that differs from stack to stack. The audit has no generation and no old
policy: the ratio is 1 (every sample is on-policy) and nothing is clipped.
At ratio 1, d ratio_t = d log pi(t) = -d CE_t, so the gradient of
``-A_t * ratio_t`` is the gradient of ``A_t * CE_t``: each RL recipe here
backprops the advantage-weighted cross-entropy with its own normalizer,
and its gradient is the policy gradient its stack computes on that batch.
The loss *value* differs (TRL logs sum(-A) / normalizer); the aggregation
functions take the per-token terms, so ``benchmarks/trl_grpo_loss.py``
feeds them TRL's own terms and compares values too.

Advantages are synthetic and deterministic: one value per completion
(sequence), from {-1, -0.5, 0.5, 1}, chosen by the completion's own
supervised token ids, so a sequence has the same advantage on any rank, in
any microbatch, at any row. The mask is the supervised labels.

"The token mean" of an RL recipe is the advantage-weighted token mean
sum A l / N; each recipe also claims an objective of its own (the
sequence-level mean, a constant normalizer...), and both are built here as
``core.objectives.Objective`` variants (``claim_objective``) so that the
audit's single-process reference (``core.reference``) computes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from course_lib.core.model import supervised_mask
from course_lib.core.normalize import Microbatch, global_count, window_count
from course_lib.core.objectives import OBJECTIVES, Objective, token_losses, window_loss
from course_lib.core.reference import flat_grad, reference_gradient
from course_lib.steps.base import backprop_each

# A completion's advantage, picked by its content (see ``advantages``).
ADVANTAGE_VALUES = (-1.0, -0.5, 0.5, 1.0)
# TRL's max_completion_length (Dr. GRPO's constant): fixed in advance, the
# course's data.max_length, so no completion is longer.
MAX_COMPLETION_LENGTH = 128


# --- the per-token terms ------------------------------------------------------------------


def completion_advantages(labels: torch.Tensor) -> torch.Tensor:
    """Each completion's (row's) advantage, shape (B,): picked by the sum of
    its supervised label ids, so content decides and a sequence keeps its
    advantage wherever it lands (rank, microbatch, row, padding)."""
    mask = supervised_mask(labels)
    key = (labels.clamp(min=0) * mask).sum(dim=-1) % len(ADVANTAGE_VALUES)
    values = torch.tensor(ADVANTAGE_VALUES, dtype=torch.float64, device=labels.device)
    return values[key]


def advantages(labels: torch.Tensor) -> torch.Tensor:
    """A per token, shaped like labels: each completion's advantage broadcast
    over its tokens, 0 where the label is ignored."""
    return completion_advantages(labels).unsqueeze(-1) * supervised_mask(labels)


def weighted(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A_t * l_t per token (l the per-token cross-entropy, 0 where ignored)."""
    return losses * advantages(labels).to(losses.dtype)


def policy_terms(logits: torch.Tensor, labels: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_t * CE_t per token, mask): the per-token policy loss at ratio 1,
    up to its value (see the module's docstring). The cross-entropy ignores
    masked positions (an exact 0 and a zero gradient there), so a zero
    count turns the loss into NaN but never the gradients."""
    losses = token_losses(logits, labels)
    return weighted(losses, labels), supervised_mask(labels).to(losses.dtype)


def nonempty_rows(labels: torch.Tensor) -> torch.Tensor:
    """Sequences with at least one supervised token (int64)."""
    return (supervised_mask(labels).sum(dim=-1) > 0).sum()


def _window_rows(microbatches: Sequence[Microbatch]) -> torch.Tensor:
    return torch.stack([nonempty_rows(lb) for _, lb in microbatches]).sum()


# --- the objectives the recipes claim, as single-process references ------------------------


def _sequence_means(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over rows of each row's A-weighted token mean (an empty row adds 0)."""
    counts = supervised_mask(labels).sum(dim=-1).clamp(min=1).to(losses.dtype)
    return (weighted(losses, labels).sum(dim=-1) / counts).sum()


def _weighted_sum(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return weighted(losses, labels).sum()


def _unweighted_sum(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return losses.sum()


# key -> what it averages; the keys are also Recipe.claims.
CLAIMS = {
    "token_mean": "the token mean: sum A l / N (sum l / N without advantages)",
    "microbatch_means": "a mean of local-batch token means: each microbatch's "
                        "sum A l / n, averaged over the microbatches of every rank",
    "sequence_means": "the sequence-level mean: each completion's token mean of A l, "
                      "averaged over the (non-empty) completions",
    "sequence_sums": "the mean over completions of each one's sum of A l",
    "constant": "sum A l / C with C = (completions in the window) x max completion "
                f"length ({MAX_COMPLETION_LENGTH}): Dr. GRPO's constant normalizer",
}


def claim_objective(claim: str, policy: bool, rows: int) -> Objective | None:
    """The claimed objective as an ``Objective`` (None for microbatch means,
    which no window-wide ratio expresses: see ``claim_reference``).
    ``policy``: advantage-weighted; ``rows``: the window's completions (C)."""
    token, sequence = OBJECTIVES["token"], OBJECTIVES["sequence"]
    total = _weighted_sum if policy else _unweighted_sum
    if claim == "token_mean":
        if not policy:
            return token
        return dataclasses.replace(token, name="policy_token", description=CLAIMS[claim],
                                   numerator=total)
    if claim == "sequence_means":
        return dataclasses.replace(sequence, name="policy_sequence",
                                   description=CLAIMS[claim], numerator=_sequence_means)
    if claim == "sequence_sums":
        return dataclasses.replace(sequence, name="policy_sequence_sum",
                                   description=CLAIMS[claim], numerator=total)
    if claim == "constant":
        return dataclasses.replace(OBJECTIVES["constant"], name="policy_constant",
                                   description=CLAIMS[claim], numerator=total,
                                   constant=float(rows * MAX_COMPLETION_LENGTH))
    if claim == "microbatch_means":
        return None
    raise ValueError(f"unknown claim {claim!r}")


def trained_part(microbatches_per_rank: Sequence[Sequence[Microbatch]],
                 generation: int) -> list[Microbatch]:
    """The microbatches one optimizer step trains, every rank's: the first
    1/generation of each rank's (all of them when generation is 1)."""
    return [mb for rank in microbatches_per_rank for mb in rank[:len(rank) // generation]]


def claim_reference(model: nn.Module, microbatches_per_rank: Sequence[Sequence[Microbatch]],
                    claim: str, policy: bool, generation: int = 1) -> torch.Tensor:
    """One process, every rank's microbatches: the gradient of the claimed
    objective over the part of the window one optimizer step trains."""
    trained = trained_part(microbatches_per_rank, generation)
    objective = claim_objective(claim, policy,
                                sum(int(lb.shape[0]) for _, lb in trained))
    if objective is not None:
        return reference_gradient(model, trained, objective)[0]
    mean = claim_objective("token_mean", policy, 0)
    assert mean is not None
    model.zero_grad(set_to_none=True)
    loss = sum((window_loss(mean, [(model(x), y)]) for x, y in trained),
               torch.zeros(())) / len(trained)
    loss.backward()
    return flat_grad(model)


# --- TRL GRPOTrainer --------------------------------------------------------------------------


def trl_grpo_loss(loss_type: str, terms: torch.Tensor, mask: torch.Tensor,
                  accumulation: int, *, generation_steps: int = 1,
                  generation_tokens: torch.Tensor | None = None, world_size: int = 1,
                  max_completion_length: int = MAX_COMPLETION_LENGTH) -> torch.Tensor:
    """One microbatch's loss, as TRL 1.16.0's ``GRPOTrainer._compute_loss``
    aggregates the per-token losses ``terms`` (B, T) under ``mask``, in
    training mode; the Trainer then backprops it as it is (GRPOTrainer sets
    ``loss_is_scaled_for_ga``), and accelerate divides by nothing more.

    - grpo: each row's masked mean, averaged over the B rows, / GA;
    - bnpo: the microbatch's masked mean, / GA;
    - dr_grpo: the masked sum / (B * max_completion_length), / GA;
    - dapo: the masked sum / (N_gen / W * GA / steps_per_generation), N_gen
      the completion tokens of the whole generation batch, all ranks
      (``num_items_in_batch``); GA / steps_per_generation is PR #6024's.
    """
    masked = terms * mask
    if loss_type == "grpo":
        rows = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return rows.mean() / accumulation
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return masked.sum() / (terms.size(0) * max_completion_length) / accumulation
    if loss_type == "dapo":
        if generation_tokens is None:
            raise ValueError("dapo needs the generation batch's token count")
        normalizer = generation_tokens.clamp(min=1.0) / world_size
        normalizer = normalizer * accumulation / generation_steps
        return masked.sum() / normalizer
    raise ValueError(f"unknown loss_type {loss_type!r}")


def trl_token_weights(loss_type: str, labels_per_rank: Sequence[Sequence[torch.Tensor]]
                      ) -> list[torch.Tensor]:
    """Each completion token's weight in one optimizer step's gradient, after
    DDP's mean over the ranks, under TRL's aggregation (``trl_grpo_loss``,
    steps_per_generation = GA): d loss / d (A l)_t on its rank, over W. One
    float64 tensor per microbatch, rank by rank, shaped like its labels (0
    where the label is ignored); the token mean gives every token 1 / N."""
    world = len(labels_per_rank)
    tokens = sum(supervised_mask(lb).sum() for rank in labels_per_rank for lb in rank)
    weights = []
    for rank in labels_per_rank:
        for labels in rank:
            terms = torch.zeros(labels.shape, dtype=torch.float64, requires_grad=True)
            mask = supervised_mask(labels).to(torch.float64)
            loss = trl_grpo_loss(loss_type, terms, mask, len(rank),
                                 generation_steps=len(rank),
                                 generation_tokens=torch.as_tensor(tokens, dtype=torch.float64),
                                 world_size=world)
            (grad,) = torch.autograd.grad(loss, terms)
            weights.append(grad * mask / world)
    return weights


def _trl_step(model, microbatches, world_size, loss_type: str, generation: int = 1):
    """The microbatches are one generation batch of ``generation`` optimizer
    steps (steps_per_generation = generation * GA): the step trains the first
    GA of them, and dapo counts the tokens of all."""
    trained = microbatches[:len(microbatches) // generation]
    tokens = global_count(window_count(microbatches)) if loss_type == "dapo" else None
    return backprop_each(model, trained, lambda lg, lb: trl_grpo_loss(
        loss_type, *policy_terms(lg, lb), len(trained), generation_steps=len(microbatches),
        generation_tokens=tokens, world_size=world_size))


def trl_grpo_dapo(model, microbatches, world_size):
    """TRL GRPO, loss_type dapo (the default), steps_per_generation = GA:
    the masked sum over the window's all-reduced count / W."""
    return _trl_step(model, microbatches, world_size, "dapo")


def trl_grpo_dapo_spg2(model, microbatches, world_size):
    """TRL 1.16.0 GRPO dapo, steps_per_generation = 2 GA: the count spans two
    optimizer steps' completions, and #6024's GA / steps_per_generation halves
    it, so each step divides by the average window count, not its own."""
    return _trl_step(model, microbatches, world_size, "dapo", generation=2)


def trl_grpo_bnpo(model, microbatches, world_size):
    """TRL GRPO, loss_type bnpo: each microbatch's own masked mean, / GA."""
    return _trl_step(model, microbatches, world_size, "bnpo")


def trl_grpo_grpo(model, microbatches, world_size):
    """TRL GRPO, loss_type grpo: each completion's token mean, averaged over
    the microbatch's completions, / GA: every completion weighs the same."""
    return _trl_step(model, microbatches, world_size, "grpo")


def trl_grpo_dr_grpo(model, microbatches, world_size):
    """TRL GRPO, loss_type dr_grpo: the masked sum / (B x max_completion_length),
    / GA: a constant normalizer, the same on every rank."""
    return _trl_step(model, microbatches, world_size, "dr_grpo")


# --- verl, OpenRLHF, NeMo-RL ----------------------------------------------------------------


def _over_global(model, microbatches, world_size, local, per_microbatch):
    """Each microbatch backprops per_microbatch(terms, mask) * W / D, D the
    all-reduce of ``local(microbatches)`` over the window."""
    total = global_count(local(microbatches))
    return backprop_each(model, microbatches, lambda lg, lb: per_microbatch(
        *policy_terms(lg, lb)) * world_size / total)


def _token_sum(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (terms * mask).sum()


def verl_token_mean(model, microbatches, world_size):
    """verl loss_agg_mode token-mean (engine path): masked sum x dp / N, N
    the all-reduce of the mini-batch's loss_mask.sum(); no 1/M on FSDP."""
    return _over_global(model, microbatches, world_size, window_count, _token_sum)


def verl_seq_mean_token_mean(model, microbatches, world_size):
    """verl seq-mean-token-mean: the sum of each sequence's token mean x dp /
    the global count of non-empty sequences."""
    def row_means(terms, mask):
        return ((terms * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()  # empty rows: 0
    return _over_global(model, microbatches, world_size, _window_rows, row_means)


def verl_seq_mean_token_sum(model, microbatches, world_size):
    """verl seq-mean-token-sum: the sum of each sequence's token sum x dp /
    the global count of non-empty sequences."""
    return _over_global(model, microbatches, world_size, _window_rows, _token_sum)


def verl_dp_actor_legacy(model, microbatches, world_size):
    """verl's legacy dp_actor (removed in #6067): each micro-batch's
    masked_mean (sum / (n + 1e-8)), x 1 / GA; no global count."""
    steps = len(microbatches)
    return backprop_each(model, microbatches, lambda lg, lb: _masked_mean(
        *policy_terms(lg, lb)) / steps)


def _masked_mean(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (terms * mask).sum() / (mask.sum() + 1e-8)


def openrlhf_window(model, microbatches, world_size):
    """OpenRLHF #1249: batch_num_tokens = N_window / GAS (all-reduced over
    DP), each microbatch backprops S x dp / batch_num_tokens, and DeepSpeed
    divides by GAS: S x W / N."""
    steps = len(microbatches)
    tokens = global_count(window_count(microbatches)) / steps
    return backprop_each(model, microbatches, lambda lg, lb: _token_sum(
        *policy_terms(lg, lb)) * world_size / tokens / steps)


def nemo_rl(model, microbatches, world_size):
    """NeMo-RL: masked_mean with global_normalization_factor = the DP
    all-reduce of the valid tokens, each microbatch's loss x dp (x cp = 1)."""
    return _over_global(model, microbatches, world_size, window_count, _token_sum)
