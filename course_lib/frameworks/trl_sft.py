"""TRL's ``SFTTrainer``: the Hugging Face Trainer underneath, with TRL's
config. The window is fed pre-tokenised, with its own labels and collator
(``skip_prepare_dataset``), in the dispatch order of ``hf``; the gradient
is taken by the same ``on_pre_optimizer_step`` callback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from course_lib.frameworks import Captured, Setup, train_and_capture
from course_lib.frameworks.hf import arguments, capture_callback, takes
from course_lib.frameworks.tokenizer import word_level
from course_lib.frameworks.window import Window, dispatched


class TRLAdapter:
    package = "trl"
    # TRL's SFTConfig trains in bf16 unless told otherwise: both are audited.
    variants: tuple[dict[str, Any], ...] = ({}, {"bf16": False})

    def supports(self, flags: dict[str, Any]) -> bool:
        from trl import SFTConfig

        return takes(SFTConfig, flags)

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        from transformers import default_data_collator
        from trl import SFTConfig, SFTTrainer

        args = SFTConfig(**arguments(setup), dataset_kwargs={"skip_prepare_dataset": True})
        capture = capture_callback(model)
        wrapped = cast(Any, model)  # a PreTrainedModel, or PEFT's wrapping of one (--with lora)
        trainer = SFTTrainer(model=wrapped, args=args, train_dataset=_as_datasets(window),
                             data_collator=default_data_collator, callbacks=[capture],
                             processing_class=word_level(wrapped.config.vocab_size))
        return lambda: train_and_capture(model, trainer.train, lambda: capture.grad,
                                         "the SFTTrainer",
                                         "bfloat16" if args.bf16 else "float32")


def _as_datasets(window: Window) -> Any:
    """The same rows, in the same order, as the ``datasets`` iterable TRL requires."""
    from datasets import IterableDataset

    rows = dispatched(window)

    def generate():
        for row in rows:
            yield {k: v.tolist() for k, v in row.items()}

    return IterableDataset.from_generator(generate).with_format("torch")


ADAPTER = TRLAdapter()
