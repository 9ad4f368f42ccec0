"""Test loss per token and token accuracy, against the entropy floor."""

from __future__ import annotations

import torch
from torch import nn

from course_lib.core.data import Corpus, collate
from course_lib.core.model import loss_sum, supervised_mask


@torch.no_grad()
def evaluate(model: nn.Module, corpus: Corpus, split: str = "test",
             batch_size: int = 64, device: str | torch.device = "cpu") -> dict:
    model.eval()
    ids = corpus.splits[split]
    total_loss, tokens, correct = 0.0, 0, 0
    for start in range(0, len(ids), batch_size):
        inputs, labels = collate(corpus, list(ids[start:start + batch_size]),
                                 device=device)
        logits = model(inputs)
        mask = supervised_mask(labels)
        total_loss += float(loss_sum(logits, labels))
        tokens += int(mask.sum())
        correct += int(((logits.argmax(-1) == labels) & mask).sum())
    return {
        "sequences": len(ids),
        "tokens": tokens,
        "loss_per_token": total_loss / tokens,
        "token_accuracy": correct / tokens,
    }


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
