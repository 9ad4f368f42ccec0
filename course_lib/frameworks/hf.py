"""The Hugging Face Trainer (``transformers``), as a learner runs it.

The window reaches the Trainer as an IterableDataset in dispatch order:
accelerate's dispatcher hands batch k to rank k mod W, so rank r gets
exactly its own microbatches, and the Trainer never shuffles an iterable.
A ``TrainerCallback.on_pre_optimizer_step`` takes the gradient; clipping is
off (``max_grad_norm=0``) and one optimizer step is made (``max_steps=1``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch

from course_lib.frameworks import Captured, Setup, flat_grad, options, train_and_capture
from course_lib.frameworks.window import Window, dispatched


class HFAdapter:
    package = "transformers"
    # what prepare imports: the agent server's preload (frameworks.modules)
    modules: tuple[str, ...] = ("transformers.trainer",)
    variants: tuple[dict[str, Any], ...] = ({"average_tokens_across_devices": True},
                                            {"average_tokens_across_devices": False})

    def supports(self, flags: dict[str, Any]) -> bool:
        from transformers import TrainingArguments

        return takes(TrainingArguments, flags)

    def arguments(self, setup: Setup) -> Any:
        from transformers import TrainingArguments

        return TrainingArguments(**arguments(setup))

    def trainer(self, setup: Setup, model: torch.nn.Module, window: Window,
                callback: Any) -> Any:
        from transformers import Trainer, default_data_collator

        dataset, collator = options.data(setup.uses, window, vocab_size(model)) or (
            dispatched(window), default_data_collator)
        return Trainer(model=model, args=self.arguments(setup), train_dataset=dataset,
                       data_collator=collator, callbacks=[callback])

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        capture = capture_callback(model)
        trainer = self.trainer(setup, model, window, capture)
        def run() -> Captured:
            captured = train_and_capture(model, trainer.train, lambda: capture.grad,
                                         "the Trainer", notes=capture.notes)
            captured.sharded, captured.compiled = capture.sharded, capture.compiled
            return captured
        return run


def vocab_size(model: torch.nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]


def takes(config: type, flags: dict[str, Any]) -> bool:
    """Whether the arguments dataclass ``config`` has every flag."""
    from dataclasses import fields

    return set(flags) <= {f.name for f in fields(config)}


def arguments(setup: Setup) -> dict[str, Any]:
    """TrainingArguments for the audit: one optimizer step over the window
    (B rows, M microbatches), plain SGD, clipping and logging off; the
    configuration's flags on top (they may replace a default: --with packing's
    per_device_train_batch_size)."""
    return {**dict(
        output_dir=str(setup.workdir), per_device_train_batch_size=setup.shape.batch_size,
        gradient_accumulation_steps=setup.shape.microbatches, max_steps=1,
        learning_rate=setup.lr, lr_scheduler_type="constant", optim="sgd",
        max_grad_norm=0.0, use_cpu=setup.device.type == "cpu",
        ddp_backend=setup.backend, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        remove_unused_columns=False, seed=setup.shape.seed),
        # a copy: TrainingArguments fills a nested fsdp_config in, and the row
        # keeps the flags as asked
        **copy.deepcopy(setup.flags)}


def capture_callback(model: torch.nn.Module) -> Any:
    """A TrainerCallback keeping the gradient of the first optimizer step:
    ``on_pre_optimizer_step`` where the version has it, else a step pre-hook
    on the Trainer's optimizer (handed to ``on_train_begin``)."""
    from transformers import TrainerCallback

    hooked = hasattr(TrainerCallback, "on_pre_optimizer_step")

    class Capture(TrainerCallback):
        grad: torch.Tensor | None = None
        sharded = compiled = graphs_before = 0

        def __init__(self) -> None:
            super().__init__()
            self.notes: list[str] = []

        def keep(self, *_: Any) -> None:
            if self.grad is None:
                self.sharded = sharded = sum(hasattr(p, "full_tensor")
                                             for p in model.parameters())
                self.grad = flat_grad(model)
                if any(getattr(model, f"is_{kind}_checkpointing", False)
                       for kind in ("activation", "gradient")):
                    self.notes.append("gradient checkpointing was on at the optimizer step"
                                      + _checkpointing(model))
                self.compiled = _graphs() - self.graphs_before
                if self.compiled:
                    self.notes.append(f"torch.compile: dynamo compiled {self.compiled} "
                                      "graph(s) while it trained")
                if sharded:  # FSDP2: every rank held a shard
                    self.notes.append(f"{sharded} of {len(list(model.parameters()))} "
                                      "parameters sharded (DTensor): their gradients "
                                      "gathered whole before comparing")

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.keep()

        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            self.graphs_before = _graphs()
            if not hooked and optimizer is not None:
                optimizer.register_step_pre_hook(lambda opt, a, kw: self.keep())

    return Capture()


def _checkpointing(model: torch.nn.Module) -> str:
    """How the layers checkpoint, as transformers set them: `` (use_reentrant=False)``."""
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if isinstance(func, functools.partial):
            return " (" + ", ".join(f"{k}={v}" for k, v in func.keywords.items()) + ")"
    return ""


def _graphs() -> int:
    """The graphs dynamo compiled in this process so far (0 before torch.compile
    was ever used: its module is not even imported then)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


ADAPTER = HFAdapter()
