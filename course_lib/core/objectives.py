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
- ``weighted``: per-token weights w (class weights here, by label id):
  sum of w l / sum of w.
- ``constant``: a normalizer C chosen in advance (Dr. GRPO's batch size x
  maximum completion length): sum of l / C. No count to share, but C must
  be the same on every rank and in every microbatch.

An objective is named on the command line as ``token``, ``sequence``,
``weighted`` or ``constant:C``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

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


def _weighted_numerator(losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (losses * class_weights(labels).to(losses.dtype)).sum()


@dataclass(frozen=True)
class Objective:
    name: str
    description: str
    numerator: Numerator
    denominator: Denominator | None  # None: the constant C
    constant: float | None = None  # C, for ``constant``

    @property
    def spec(self) -> str:
        """How the command line names it: ``constant:C`` carries its C."""
        return f"{self.name}:{self.constant:g}" if self.constant is not None else self.name

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
    Objective("weighted", "per-token class weights w: sum w l / sum w",
              _weighted_numerator, lambda labels: class_weights(labels).sum()),
    Objective("constant", "a normalizer C fixed in advance: sum l / C",
              lambda losses, labels: losses.sum(), None),
)}
NAMES = tuple(OBJECTIVES)
DEFAULT = "token"


def parse(text: str | None) -> Objective:
    """``token``, ``sequence``, ``weighted`` or ``constant:C`` (C > 0)."""
    name, sep, value = (text or DEFAULT).strip().partition(":")
    if name not in OBJECTIVES:
        raise ObjectiveError(f"--objective: unknown objective {name!r} "
                             f"(choose from {', '.join(NAMES)})")
    found = OBJECTIVES[name]
    if name != "constant":
        if sep:
            raise ObjectiveError(f"--objective: {name} takes no value")
        return found
    try:
        c = float(value)
    except ValueError:
        c = float("nan")
    if not sep or not c > 0 or c == float("inf"):
        raise ObjectiveError("--objective: constant needs its normalizer, "
                             "e.g. constant:4096 (C > 0)")
    return Objective(found.name, found.description, found.numerator, None, c)


def window_loss(objective: Objective, logits_and_labels: Sequence[tuple[torch.Tensor,
                                                                        torch.Tensor]]
                ) -> torch.Tensor:
    """The single-process loss of a whole window, every microbatch of every
    rank given as (logits, labels)."""
    numerator = sum((objective.numerator(token_losses(lg, lb), lb)
                     for lg, lb in logits_and_labels), torch.zeros(()))
    if objective.constant is not None:
        return numerator / objective.constant
    total = objective.local_denominator([lb for _, lb in logits_and_labels])
    if float(total) <= 0:
        raise EmptyWindowError(f"{objective.name}: the window's normalizer is 0")
    return numerator / total.to(numerator.dtype)


# The objective the rank's job audits: steps written for one objective read
# it here (a constant's C), since a step's signature carries no objective.
_ACTIVE: list[Objective] = [OBJECTIVES[DEFAULT]]


def active() -> Objective:
    return _ACTIVE[-1]


@contextlib.contextmanager
def auditing(objective: Objective) -> Iterator[None]:
    """The objective a job's steps and references use, for the job's length."""
    _ACTIVE.append(objective)
    try:
        yield
    finally:
        _ACTIVE.pop()
