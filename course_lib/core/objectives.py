"""What a window's loss averages over: the unit of weighting, as a choice.

Every objective here is a ratio over the whole window (every rank, every
microbatch)::

    loss = sum_microbatches numerator(logits, labels) / normalizer

where ``numerator`` is a sum of per-token terms of one microbatch and the
normalizer is either the sum of every microbatch's ``denominator(labels)``
or a constant C fixed in advance. That one shape gives each objective its
single-process reference (``window_loss``) and its distributed rule beside
it: each rank backprops ``W * numerator / normalizer`` with the normalizer
all-reduced first (or C, the same on every rank), and DDP's mean over W
ranks gives the window's loss exactly.

- ``token``: every supervised token weighs the same (sum of l / N).
- ``sequence``: every sequence weighs the same: the mean over sequences of
  each one's token mean; sequences without a supervised token are left
  out, and their count is global.
- ``document``: packed rows hold several documents (``core.data.Packing``,
  rows of WIDTH tokens), and every document weighs the same, whatever row
  or rank it lands on: the mean over documents of each one's token mean,
  the document count global. A document is a maximal run of supervised
  labels: the collator ignores the label that crosses a boundary.
- ``weighted``: per-token weights w (class weights here, by label id):
  sum of w l / sum of w.
- ``constant``: a normalizer C chosen in advance (Dr. GRPO's batch size x
  maximum completion length): sum of l / C. No count to share, but C must
  be the same on every rank and in every microbatch.
- ``zloss``: the token mean plus a per-token auxiliary term λ z (PaLM's
  z-loss), which rides in the numerator and shares the tokens' N.
- ``l2``: the token mean plus λ/2 |θ|^2, a term on the parameters that
  enters once per optimizer step: not once per rank, nor per microbatch.

An objective is named on the command line as ``token``, ``sequence``,
``document:WIDTH``, ``weighted``, ``constant:C``, ``zloss:λ`` or ``l2:λ``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.core.data import IGNORE_INDEX
from course_lib.core.model import supervised_mask
from course_lib.core.normalize import EmptyWindowError

# per-token losses, labels -> this microbatch's numerator (a scalar tensor)
Numerator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# labels -> this microbatch's share of the normalizer (a scalar tensor)
Denominator = Callable[[torch.Tensor], torch.Tensor]


class ObjectiveError(ValueError):
    """An --objective that names nothing, or lacks what it needs."""


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each position's cross-entropy, 0 where the label is ignored; shaped like labels."""
    flat = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="none")
    return flat.view(labels.shape) * supervised_mask(labels).to(flat.dtype)


def class_weights(labels: torch.Tensor) -> torch.Tensor:
    """The ``weighted`` objective's per-token weights: 1, 2 or 3 by label id
    (a class weight), 0 where the label is ignored."""
    mask = supervised_mask(labels)
    return (1 + labels.clamp(min=0) % 3).to(torch.float64) * mask


def _rows(labels: torch.Tensor) -> torch.Tensor:
    """Each row's supervised count."""
    return supervised_mask(labels).sum(dim=-1)


def _sequence_numerator(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    counts = _rows(labels)
    per_row = losses.sum(dim=-1) / counts.clamp(min=1).to(losses.dtype)
    return per_row.sum()  # rows without a supervised token add 0


def documents(labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Each position's document index in this microbatch (-1 where the label
    is ignored), and the number of documents: a document is a maximal run of
    supervised labels within a row."""
    mask = supervised_mask(labels)
    before = torch.zeros_like(mask)
    before[:, 1:] = mask[:, :-1]
    starts = mask & ~before
    index = torch.cumsum(starts.flatten(), 0).view(labels.shape) - 1
    return torch.where(mask, index, -1), int(starts.sum())


def _document_numerator(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    index, count = documents(labels)
    inside = index >= 0
    sums = losses.new_zeros(count).index_add(0, index[inside], losses[inside])
    sizes = torch.bincount(index[inside], minlength=count).to(losses.dtype)
    return (sums / sizes).sum()


def _weighted_numerator(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (losses * class_weights(labels).to(losses.dtype)).sum()


def z_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """PaLM's z-loss, summed over the supervised positions: logsumexp(logits)^2."""
    z = torch.logsumexp(logits.float() if logits.dtype == torch.float16 else logits, dim=-1)
    return (z.square() * supervised_mask(labels).to(z.dtype)).sum()


def half_square_norm(model: nn.Module) -> torch.Tensor:
    """1/2 |θ|^2 over every parameter: an L2 penalty's term."""
    return sum((p.square().sum() for p in model.parameters()), torch.zeros(())) / 2


@dataclass(frozen=True)
class Objective:
    name: str
    description: str
    numerator: Numerator
    denominator: Denominator | None  # None: the constant C
    constant: float | None = None  # C, for ``constant``
    # A regulariser's strength, and its term: per token, summed into the
    # numerator (z-loss), or once per window, on the parameters (an L2 penalty).
    strength: float | None = None
    auxiliary: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    penalty: Callable[[nn.Module], torch.Tensor] | None = None
    packing: int | None = None  # the packed rows' width in tokens, for ``document``

    @property
    def spec(self) -> str:
        """How the command line names it: ``constant:C``, ``document:WIDTH``
        and ``l2:λ`` carry their value."""
        value = next((v for v in (self.constant, self.strength, self.packing)
                      if v is not None), None)
        return f"{self.name}:{value:g}" if value is not None else self.name

    def microbatch_numerator(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """This microbatch's share of the numerator, its per-token regulariser in."""
        found = self.numerator(token_losses(logits, labels), labels)
        if self.auxiliary is not None and self.strength is not None:
            found = found + self.strength * self.auxiliary(logits, labels)
        return found

    def normalizer(self, labels: Sequence[torch.Tensor]) -> torch.Tensor:
        """The normalizer of these microbatches taken together: C, or the sum
        of their denominators; a window whose normalizer is 0 is refused."""
        if self.constant is not None:
            return torch.tensor(self.constant, dtype=torch.float64)
        total = self.local_denominator(labels)
        if float(total) <= 0:
            raise EmptyWindowError(f"{self.name}: the window's normalizer is 0")
        return total

    def window_penalty(self, model: nn.Module) -> torch.Tensor | None:
        """The term that enters once per window (per optimizer step), or None."""
        if self.penalty is None or self.strength is None:
            return None
        return self.strength * self.penalty(model)

    def local_denominator(self, labels: Sequence[torch.Tensor]) -> torch.Tensor:
        """This rank's share of the normalizer, summed over its microbatches
        (float64: a class-weight sum is not an integer count)."""
        if self.denominator is None:
            raise ObjectiveError(f"{self.name}: the normalizer is the constant C")
        return torch.stack([self.denominator(lb).to(torch.float64) for lb in labels]).sum()


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("token", "every supervised token weighs the same: sum l / N",
              lambda losses, labels: losses.sum(),
              lambda labels: supervised_mask(labels).sum()),
    Objective("sequence", "every sequence weighs the same: the mean over sequences of "
              "each one's token mean", _sequence_numerator,
              lambda labels: (_rows(labels) > 0).sum()),
    Objective("document", "every document of the packed rows weighs the same: the mean "
              "over documents of each one's token mean", _document_numerator,
              lambda labels: torch.tensor(documents(labels)[1])),
    Objective("weighted", "per-token class weights w: sum w l / sum w",
              _weighted_numerator, lambda labels: class_weights(labels).sum()),
    Objective("constant", "a normalizer C fixed in advance: sum l / C",
              lambda losses, labels: losses.sum(), None),
    Objective("zloss", "the token mean of l + λ z, z = logsumexp(logits)^2, a per-token "
              "auxiliary loss normalized like the tokens", lambda losses, labels: losses.sum(),
              lambda labels: supervised_mask(labels).sum(), auxiliary=z_loss),
    Objective("l2", "the token mean plus λ/2 |θ|^2, once per optimizer step",
              lambda losses, labels: losses.sum(),
              lambda labels: supervised_mask(labels).sum(), penalty=half_square_norm),
)}
# Objectives that take a value after a colon: (what it is, its symbol, an example).
VALUED = {"constant": ("its normalizer", "C", "4096"),
          "document": ("its packed rows' width", "WIDTH", "128"),
          "zloss": ("its strength", "LAMBDA", "0.1"),
          "l2": ("its strength", "LAMBDA", "0.01")}
NAMES = tuple(OBJECTIVES)
DEFAULT = "token"


def parse(text: str | None) -> Objective:
    """``token``, ``sequence``, ``document:WIDTH``, ``weighted``,
    ``constant:C``, ``zloss:λ`` or ``l2:λ`` (C, λ > 0; WIDTH an integer > 1)."""
    name, sep, value = (text or DEFAULT).strip().partition(":")
    if name not in OBJECTIVES:
        raise ObjectiveError(f"--objective: unknown objective {name!r} "
                             f"(choose from {', '.join(NAMES)})")
    found = OBJECTIVES[name]
    if name not in VALUED:
        if sep:
            raise ObjectiveError(f"--objective: {name} takes no value")
        return found
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    what, symbol, example = VALUED[name]
    if name == "document" and not (sep and number > 1 and number.is_integer()):
        raise ObjectiveError(
            "--objective: document needs document boundaries, and rows of one sequence "
            f"have none: pack them, document:{symbol} (an integer > 1, the packed rows' "
            f"width in tokens), e.g. document:{example}")
    if not sep or not number > 0 or number == float("inf"):
        raise ObjectiveError(f"--objective: {name} needs {what} {symbol} > 0, "
                             f"e.g. {name}:{example}")
    if name == "constant":
        return dataclasses.replace(found, constant=number)
    if name == "document":
        return dataclasses.replace(found, packing=int(number))
    return dataclasses.replace(found, strength=number)


def window_loss(objective: Objective, logits_and_labels: Sequence[tuple[torch.Tensor,
                                                                        torch.Tensor]]
                ) -> torch.Tensor:
    """The single-process loss of a whole window, every microbatch of every
    rank given as (logits, labels)."""
    numerator = sum((objective.microbatch_numerator(lg, lb)
                     for lg, lb in logits_and_labels), torch.zeros(()))
    total = objective.normalizer([lb for _, lb in logits_and_labels])
    return numerator / total.to(numerator.dtype)


def token_weights(objective: Objective, labels: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each token's weight in the window's loss, d loss / d l_t (shaped like
    each microbatch's labels; 0 where ignored): what the objective makes of
    a token, before any model. A regulariser's own terms are left out."""
    losses = [torch.zeros(lb.shape, dtype=torch.float64, requires_grad=True) for lb in labels]
    numerator = sum((objective.numerator(x, lb) for x, lb in zip(losses, labels, strict=True)),
                    torch.zeros((), dtype=torch.float64))
    grads = torch.autograd.grad(numerator / objective.normalizer(labels), losses)
    return [g * supervised_mask(lb) for g, lb in zip(grads, labels, strict=True)]

