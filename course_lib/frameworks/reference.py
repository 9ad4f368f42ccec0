"""The single-process side: each microbatch's summed-loss gradient g_{r,m},
from the initial weights, and the reference g* = sum_{r,m} g_{r,m} / N."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from course_lib.core.data import IGNORE_INDEX
from course_lib.core.reference import grad_parts
from course_lib.frameworks.window import Microbatch, Window


def summed_loss(model: torch.nn.Module, mb: Microbatch) -> torch.Tensor:
    """S: the causal LM's cross-entropy summed over the supervised labels,
    after the shift (position t predicts label t + 1)."""
    # The model as fed. Packed rows: no mask, positions restarting per
    # sequence, and no cache, as the Trainer trains (it sets use_cache from
    # TrainingArguments, False): with one, transformers 5.25 skips the packed
    # mask and the rows attend to each other.
    fed = ({"attention_mask": mb.attention_mask} if mb.position_ids is None
           else {"position_ids": mb.position_ids, "use_cache": False})
    logits = model(input_ids=mb.input_ids, **fed).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                           mb.labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def each_grad(model: torch.nn.Module, microbatches: Sequence[Microbatch]
              ) -> Iterator[list[torch.Tensor]]:
    """g_m = ∇ S_m for each microbatch in turn, as its parameters' parts:
    one at a time, never concatenated, so that a caller that reduces each
    (a sketch) neither holds them all nor copies them."""
    for mb in microbatches:
        model.zero_grad(set_to_none=True)
        summed_loss(model, mb).backward()
        yield grad_parts(model)
    model.zero_grad(set_to_none=True)


def microbatch_grads(model: torch.nn.Module, window: Window) -> list[list[torch.Tensor]]:
    """g_{r,m} = ∇ S_{r,m} for every rank's every microbatch (CPU, float32)."""
    return [[torch.cat(parts).float().cpu() for parts in each_grad(model, rank)]
            for rank in window]
