"""TRL's ``SFTTrainer``: the Hugging Face Trainer underneath, with TRL's
config. The window is fed pre-tokenised, with its own labels and collator
(``skip_prepare_dataset``), in the dispatch order of ``hf``; the gradient
is taken by the same ``on_pre_optimizer_step`` callback. A configuration
with data of its own (``--with completion_only``, ``packing``...) is
prepared by TRL itself instead: tokenised, masked, packed and collated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from course_lib.frameworks import Captured, Setup, options, train_and_capture
from course_lib.frameworks.hf import arguments, capture_callback, takes
from course_lib.frameworks.tokenizer import word_level
from course_lib.frameworks.window import Window, dispatched


class TRLAdapter:
    package = "trl"
    # the agent server's preload: SFTTrainer and the datasets it streams
    modules: tuple[str, ...] = ("trl.trainer.sft_trainer", "datasets")
    # TRL's SFTConfig trains in bf16 unless told otherwise: both are audited.
    variants: tuple[dict[str, Any], ...] = ({}, {"bf16": False})

    def supports(self, flags: dict[str, Any]) -> bool:
        from trl import SFTConfig

        return takes(SFTConfig, flags)

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        from transformers import default_data_collator
        from trl import SFTConfig, SFTTrainer

        wrapped = cast(Any, model)  # a PreTrainedModel, or PEFT's wrapping of one (--with lora)
        own = options.data(setup.uses, window, wrapped.config.vocab_size)
        # The window as is: already tokenised and labelled, so TRL must not
        # prepare it. A configuration's own rows: TRL prepares and collates them.
        dataset, collator = own or (_as_datasets(window), default_data_collator)
        skip: dict[str, Any] = {} if own else {"dataset_kwargs": {"skip_prepare_dataset": True}}
        args = SFTConfig(**arguments(setup), **skip)
        capture = capture_callback(model)
        trainer = SFTTrainer(model=wrapped, args=args, train_dataset=dataset,
                             data_collator=collator, callbacks=[capture],
                             processing_class=word_level(wrapped.config.vocab_size))

        def run() -> Captured:
            captured = train_and_capture(model, trainer.train, lambda: capture.grad,
                                         "the SFTTrainer",
                                         "bfloat16" if args.bf16 else "float32",
                                         # hf's notes: SFTConfig checkpoints by default
                                         notes=capture.notes)
            if own:  # what TRL made of the rows, measured: the row says it
                captured.notes.append(fed(captured.seen, setup.rank))
            return captured
        return run


def fed(seen: list[Any], rank: int) -> str:
    """What TRL's own preparation fed this rank: padding-free rows (position
    ids, no attention mask) or padded ones, and how many sequences each held."""
    sequences = [int((mb.position_ids == 0).sum()) if mb.position_ids is not None
                 else mb.input_ids.shape[0] for mb in seen]
    lengths = [mb.input_ids.shape[1] for mb in seen]
    how = ("padding-free: one row each, position_ids restarting at every sequence, no "
           "attention mask" if any(mb.position_ids is not None for mb in seen)
           else "padded rows, with an attention mask")
    return (f"TRL fed rank {rank} {len(seen)} microbatches, {how}; sequences "
            f"{sequences}, lengths {lengths}")


def _as_datasets(window: Window) -> Any:
    """The same rows, in the same order, as the ``datasets`` iterable TRL requires."""
    from datasets import IterableDataset

    rows = dispatched(window)

    def generate():
        for row in rows:
            yield {k: v.tolist() for k, v in row.items()}

    return IterableDataset.from_generator(generate).with_format("torch")


ADAPTER = TRLAdapter()
