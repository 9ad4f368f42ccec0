"""Test loss per token and token accuracy, against the entropy floor; in one
process, or added up from the shards of several ranks.

Every evaluation scores each sequence on its own (its summed loss, its
supervised tokens, its correct predictions) in float64, then adds the
scores up. A sum does not depend on how the sequences were split among
ranks or batches, up to float64 round-off, so the distributed evaluation
can be held to the single-process one. In float32 the kernels' summation
order changes with the batch's shape, and the two would agree to about
1e-7 only.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler

from course_lib.core.data import IGNORE_INDEX, Corpus, collate
from course_lib.core.model import supervised_mask

DTYPE = torch.float64
# Token-weighted distributed vs single-process: float64 round-off, relative.
RTOL = 1e-12


@dataclass(frozen=True)
class Scores:
    """One entry per sequence: what an evaluation adds up."""

    loss: torch.Tensor  # float64: the summed NLL of the sequence's supervised targets
    tokens: torch.Tensor  # int64: its supervised targets (L - 1)
    correct: torch.Tensor  # int64: the targets whose argmax prediction is right

    def totals(self, keep: torch.Tensor | None = None) -> torch.Tensor:
        """[loss sum, tokens, correct] in float64 (counts stay exact below
        2**53), over the sequences ``keep`` marks: the vector to all-reduce."""
        rows = torch.stack([self.loss, self.tokens.to(DTYPE), self.correct.to(DTYPE)])
        return (rows if keep is None else rows[:, keep]).sum(dim=1)


@torch.no_grad()
def score(model: nn.Module, corpus: Corpus, ids: Sequence[int], batch_size: int = 64,
          device: str | torch.device = "cpu") -> Scores:
    """Each sequence of ``ids`` scored alone, by a float64 copy of ``model``."""
    model = copy.deepcopy(model).to(device=device, dtype=DTYPE).eval()
    losses, tokens, correct = [], [], []
    for start in range(0, len(ids), batch_size):
        inputs, labels = collate(corpus, list(ids[start:start + batch_size]), device=device)
        logits = model(inputs)
        mask = supervised_mask(labels)
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                              ignore_index=IGNORE_INDEX, reduction="none")
        losses.append((nll.view_as(labels) * mask).sum(dim=1))
        tokens.append(mask.sum(dim=1))
        correct.append(((logits.argmax(-1) == labels) & mask).sum(dim=1))
    if not losses:
        empty = torch.zeros(0, dtype=torch.int64)
        return Scores(torch.zeros(0, dtype=DTYPE), empty, empty)
    return Scores(torch.cat(losses).cpu(), torch.cat(tokens).cpu(), torch.cat(correct).cpu())


@dataclass(frozen=True)
class Score:
    loss_per_token: float
    token_accuracy: float

    @classmethod
    def of(cls, totals: torch.Tensor) -> Score:
        """From [loss sum, tokens, correct]: the token mean and the accuracy."""
        loss, tokens, correct = (float(x) for x in totals)
        return cls(loss / tokens, correct / tokens)


def evaluate(model: nn.Module, corpus: Corpus, split: str = "test",
             batch_size: int = 64, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The single-process evaluation of ``split``."""
    ids = corpus.splits[split]
    totals = score(model, corpus, ids, batch_size, device).totals()
    s = Score.of(totals)
    return {
        "sequences": len(ids),
        "tokens": int(totals[1]),
        "loss_per_token": s.loss_per_token,
        "token_accuracy": s.token_accuracy,
    }


def shard(n: int, world_size: int, rank: int) -> tuple[list[int], torch.Tensor]:
    """The positions ``DistributedSampler`` hands ``rank`` (its defaults:
    no shuffle here, ``drop_last=False``), and which of them are padding.

    The sampler pads the index list by repeating its first entries until W
    divides it, so that every rank runs the same number of batches; rank r
    takes padded positions r, r + W, r + 2W, ... A position at or past n is
    a repeat of a sequence another rank (or this one) already scores.
    """
    sampler: DistributedSampler[int] = DistributedSampler(
        range(n), num_replicas=world_size, rank=rank, shuffle=False)  # type: ignore[arg-type]
    positions = list(sampler)
    duplicate = torch.tensor([rank + k * world_size >= n for k in range(len(positions))],
                             dtype=torch.bool)
    return positions, duplicate


def bayes_accuracy(corpus: Corpus, split: str = "test") -> float:
    """Accuracy of the true source's best guess: the ceiling for any model."""
    src, hits, total = corpus.source, 0, 0
    for i in corpus.splits[split]:
        seq = corpus.sequences[i]
        for a, b in zip(seq[:-1], seq[1:], strict=True):
            row = src.transitions[a]
            hits += b == max(range(len(row)), key=row.__getitem__)
            total += 1
    return hits / total
