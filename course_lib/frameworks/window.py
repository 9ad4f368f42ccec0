"""The skewed window a framework is fed, and its counts.

Every rank holds its own fixed sequences, drawn from the course's Markov
source: short ones on rank 0, long ones on the last rank, so per-rank token
counts differ. Each microbatch is padded to one common length (the
frameworks concatenate batches across ranks when they dispatch them), with
``IGNORE_INDEX`` on the padding, and some rows mask their first labels (a
prompt), so some rows' first label is ignored and others' is not (R differs
from the number of rows). Labels are unshifted, as Hugging Face models take
them: the model shifts them internally.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.core.data import IGNORE_INDEX, MarkovSource

PAD = 0  # the padding token id; the source's symbols are shifted by one


@dataclass(frozen=True)
class WindowShape:
    world_size: int
    microbatches: int  # M, per rank
    batch_size: int  # rows per microbatch
    length: int  # every row, padded
    seed: int = 1234

    def lengths(self, rank: int) -> tuple[int, int]:
        """The band of real lengths of ``rank``: short on rank 0, long on the last."""
        lo = 6 + (self.length - 10) * rank // max(self.world_size, 1)
        hi = 6 + (self.length - 10) * (rank + 1) // max(self.world_size, 1)
        return lo, max(lo + 1, hi)


@dataclass(frozen=True)
class Microbatch:
    input_ids: torch.Tensor  # (B, L) int64
    attention_mask: torch.Tensor  # (B, L) int64, 0 on padding
    labels: torch.Tensor  # (B, L) int64, unshifted, IGNORE_INDEX where ignored
    # Packed rows (DataCollatorWithFlattening): positions restart at each
    # sequence, and the model was fed no attention mask.
    position_ids: torch.Tensor | None = None

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "labels": self.labels}


Window = list[list[Microbatch]]  # window[rank][micro]


class Listed(torch.utils.data.Dataset):
    """A list as a map-style dataset, for a DataLoader that keeps its order."""

    def __init__(self, items: list[Any]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def vocab_size(source: MarkovSource) -> int:
    """The model's vocabulary: the source's symbols, shifted by one, and PAD."""
    return len(source.stationary) + 1


def build(shape: WindowShape, source: MarkovSource) -> Window:
    """Every rank's microbatches: deterministic from ``shape.seed``."""
    rng = random.Random(shape.seed)
    window: Window = []
    for rank in range(shape.world_size):
        lo, hi = shape.lengths(rank)
        micro = []
        for m in range(shape.microbatches):
            ids = torch.full((shape.batch_size, shape.length), PAD, dtype=torch.int64)
            labels = torch.full_like(ids, IGNORE_INDEX)
            for row in range(shape.batch_size):
                n = rng.randint(lo, hi)
                seq = [1 + s for s in source.sample(rng, n)]
                ids[row, :n] = torch.tensor(seq)
                labels[row, :n] = ids[row, :n]
                # Odd rows of odd microbatches mask a prompt: their first
                # labels are ignored, so R (rows with a supervised first
                # label) is not simply the number of rows.
                if (row + m) % 2:
                    labels[row, : min(3, n - 2)] = IGNORE_INDEX
            micro.append(Microbatch(ids, (ids != PAD).long(), labels))
        window.append(micro)
    return window


@dataclass(frozen=True)
class Counts:
    """The window's counts, as the candidate formulas use them."""

    n: list[list[int]]  # n[r][m]: supervised labels after the shift
    n_before_shift: list[list[int]]  # the same, counted before the shift
    rows_first_supervised: list[list[int]]  # R per microbatch: labels[:, 0] supervised

    @property
    def N(self) -> int:  # noqa: N802 (the course's notation)
        return sum(map(sum, self.n))

    @property
    def N_r(self) -> list[int]:  # noqa: N802
        return [sum(row) for row in self.n]

    @property
    def R(self) -> int:  # noqa: N802
        return sum(map(sum, self.rows_first_supervised))


def counts(window: Window) -> Counts:
    def after(mb: Microbatch) -> int:
        return int((mb.labels[:, 1:] != IGNORE_INDEX).sum())

    def before(mb: Microbatch) -> int:
        return int((mb.labels != IGNORE_INDEX).sum())

    def first(mb: Microbatch) -> int:
        return int((mb.labels[:, 0] != IGNORE_INDEX).sum())

    return Counts([[after(mb) for mb in rank] for rank in window],
                  [[before(mb) for mb in rank] for rank in window],
                  [[first(mb) for mb in rank] for rank in window])


def dispatched(window: Window, row_of: Callable[[Any, int], dict] | None = None) -> Any:
    """Rows in the order accelerate's dispatcher deals them: for each
    microbatch m, rank 0's rows, then rank 1's, and so on. ``row_of(mb, row)``
    makes one row (default: input ids, attention mask and labels)."""
    from torch.utils.data import IterableDataset

    def whole(mb: Any, row: int) -> dict:
        return {"input_ids": mb.input_ids[row], "attention_mask": mb.attention_mask[row],
                "labels": mb.labels[row]}

    make = row_of or whole

    class Rows(IterableDataset):
        def __iter__(self):
            for m in range(len(window[0])):
                for rank in window:
                    mb = rank[m]
                    for row in range(mb.input_ids.shape[0]):
                        yield make(mb, row)

    return Rows()
