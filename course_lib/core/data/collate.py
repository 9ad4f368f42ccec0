"""Padding and packing: sequences become (inputs, labels) batches, and
neither padding nor a document boundary ever counts as a token (its label
is ``IGNORE_INDEX``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from course_lib.core.data.corpus import Corpus

IGNORE_INDEX = -100
# How many filler documents a packed row tries before it stops filling.
FILLER_TRIES = 32


@dataclass(frozen=True)
class Packing:
    """Packed rows of at most ``width`` tokens. Each sampled sequence opens a
    row, and the collator fills the rest with whole documents drawn from a
    filler pool (the corpus's test split, which nothing else trains on).

    The fillers are a fixed function of the opening sequence, so a row is
    the same whatever microbatch, rank or world size it lands in: the
    invariance checks still compare like with like. Short sequences leave
    room for more documents than long ones, so rows hold different numbers
    of documents, as token-budget packing gives.
    """

    width: int
    seed: int = 0

    def documents(self, corpus: Corpus, opening: int) -> list[int]:
        """The ids of the documents in the row that ``opening`` opens."""
        rng = random.Random(f"{self.seed}:{opening}")  # a str seed: the same in every process
        pool = corpus.splits["test"]
        row, used = [opening], len(corpus.sequences[opening])
        for filler in rng.sample(pool, min(FILLER_TRIES, len(pool))):
            if used + len(corpus.sequences[filler]) <= self.width:
                row.append(filler)
                used += len(corpus.sequences[filler])
        return row


def collate(corpus: Corpus, ids: list[int], supervised: bool = True,
            device: torch.device | str = "cpu", packing: Packing | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad rows into (inputs, labels) for next-token prediction.

    A row is one sequence, or with ``packing`` the documents of a packed
    row one after the other. inputs[b, t] = row[t], labels[b, t] = row[t + 1].
    Padded label positions hold IGNORE_INDEX and never count as tokens; so
    does the label that would cross from one document into the next, so a
    document is a maximal run of supervised labels. ``supervised=False``
    ignores every label (a prompt-only batch: the rank runs, but holds no
    token).
    """
    rows = [[corpus.sequences[d] for d in (packing.documents(corpus, i) if packing else [i])]
            for i in ids]
    streams = [[t for doc in docs for t in doc] for docs in rows]
    width = max(len(s) for s in streams) - 1
    inputs = torch.full((len(rows), width), corpus.pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for row, (docs, stream) in enumerate(zip(rows, streams, strict=True)):
        n = len(stream) - 1
        inputs[row, :n] = torch.tensor(stream[:-1])
        if supervised:
            labels[row, :n] = torch.tensor(stream[1:])
            end = 0
            for doc in docs[:-1]:  # the last document's end is the row's end
                end += len(doc)
                labels[row, end - 1] = IGNORE_INDEX  # the next document's first token
    return inputs.to(device), labels.to(device)
