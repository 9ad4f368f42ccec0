"""Padding: sequences become (inputs, labels) batches, and padding never
counts as a token (its label is ``IGNORE_INDEX``)."""

from __future__ import annotations

import torch

from course_lib.core.data.corpus import Corpus

IGNORE_INDEX = -100


def collate(corpus: Corpus, ids: list[int], supervised: bool = True,
            device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences into (inputs, labels) for next-token prediction.

    inputs[b, t] = seq[t], labels[b, t] = seq[t + 1]. Padded label positions
    hold IGNORE_INDEX and never count as tokens. ``supervised=False`` ignores
    every label (a prompt-only batch: the rank runs, but holds no token).
    """
    seqs = [corpus.sequences[i] for i in ids]
    width = max(len(s) for s in seqs) - 1
    inputs = torch.full((len(seqs), width), corpus.pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), IGNORE_INDEX, dtype=torch.long)
    for row, seq in enumerate(seqs):
        n = len(seq) - 1
        inputs[row, :n] = torch.tensor(seq[:-1])
        if supervised:
            labels[row, :n] = torch.tensor(seq[1:])
    return inputs.to(device), labels.to(device)
