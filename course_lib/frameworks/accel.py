"""accelerate: the loop a learner writes, in two ways.

- ``accumulate``: the guide's usual loop, ``with accelerator.accumulate(model)``
  around the model's own mean loss and ``accelerator.backward``;
- ``docs_recipe``: the guide's recipe for samples of variable size, as
  written there: the window's batches fetched first, the labels counted
  (``labels.ne(-100)``), the count gathered over the ranks, and each summed
  loss scaled by ``GA * num_processes / count``.

The DataLoader is not shuffled, so ``prepare`` deals batch k to rank k mod W.
The gradient is taken when ``accelerator.sync_gradients`` is set, just
before the first optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from course_lib.core.data import IGNORE_INDEX
from course_lib.frameworks import Captured, Setup, flat_grad, train_and_capture
from course_lib.frameworks.window import Listed, Window


class AccelerateAdapter:
    package = "accelerate"
    modules: tuple[str, ...] = ("accelerate",)  # the agent server's preload
    variants: tuple[dict[str, Any], ...] = ({"recipe": "accumulate"},
                                            {"recipe": "docs_recipe"})

    def supports(self, flags: dict[str, Any]) -> bool:
        return True

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
        from torch.utils.data import DataLoader

        # One process audits several configurations: each starts afresh.
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        ga = setup.shape.microbatches
        accelerator = Accelerator(gradient_accumulation_steps=ga,
                                  cpu=setup.device.type == "cpu")
        loader = DataLoader(Listed(rows(window)), batch_size=setup.shape.batch_size,
                            shuffle=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=setup.lr)
        loop = {"accumulate": _accumulate, "docs_recipe": _docs_recipe}[
            setup.flags.get("recipe", "accumulate")]
        kept: list[torch.Tensor] = []

        def train() -> None:
            ddp, opt, batches = accelerator.prepare(model, optimizer, loader)
            kept.append(loop(accelerator, ddp, model, opt, batches, ga))

        return lambda: train_and_capture(model, train, lambda: kept[0] if kept else None,
                                         "the accelerate loop")


def rows(window: Window) -> list[dict[str, torch.Tensor]]:
    """Every row, microbatch by microbatch and rank by rank within one: in
    batches of B rows, batch k is rank (k mod W)'s microbatch k // W."""
    return [{key: value[row] for key, value in rank[m].as_dict().items()}
            for m in range(len(window[0])) for rank in window
            for row in range(rank[m].input_ids.shape[0])]


def _accumulate(accelerator, ddp, model, optimizer, loader, ga) -> torch.Tensor:
    for batch in loader:
        with accelerator.accumulate(ddp):
            loss = ddp(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                grad = flat_grad(model)
                optimizer.step()
                optimizer.zero_grad()
                return grad
            optimizer.step()
            optimizer.zero_grad()
    raise RuntimeError("the loop never synchronised its gradients")


def _docs_recipe(accelerator, ddp, model, optimizer, loader, ga) -> torch.Tensor:
    batches = list(loader)[:ga]
    count = sum(b["labels"].ne(IGNORE_INDEX).sum() for b in batches)
    count = accelerator.gather(count).sum().item()
    for i, batch in enumerate(batches):
        sync = i == len(batches) - 1
        with accelerator.no_sync(ddp) if not sync else nullcontext():
            logits = ddp(input_ids=batch["input_ids"],
                         attention_mask=batch["attention_mask"]).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   batch["labels"][:, 1:].flatten(),
                                   ignore_index=IGNORE_INDEX, reduction="sum")
            loss = (loss * ga * accelerator.num_processes) / count
            accelerator.backward(loss)
    grad = flat_grad(model)
    optimizer.step()
    optimizer.zero_grad()
    return grad


ADAPTER = AccelerateAdapter()
