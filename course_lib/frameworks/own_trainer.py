"""A learner's own Hugging Face Trainer: ``course-lib audit --trainer
my_trainer.py:make_trainer``.

``make_trainer(model, train_dataset)`` returns a configured
``transformers.Trainer`` (their ``TrainingArguments``, callbacks, subclass,
collator). The audit feeds it the skewed window, in the dispatch order the
Trainer's accelerate uses, adds one callback that keeps the gradient of the
first optimizer step and stops the training there, and runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_lib.core.files import working_dir
from course_lib.frameworks import Captured, Setup, train_and_capture
from course_lib.frameworks.hf import capture_callback
from course_lib.frameworks.window import Window, dispatched
from course_lib.steps.base import StepSpecError
from course_lib.steps.registry import load_function

FLAG = "--trainer"


def make(spec: str, model: torch.nn.Module, dataset: Any) -> Any:
    """The learner's Trainer, or StepSpecError (bad input) when it is none."""
    from transformers import Trainer

    build = load_function(spec, FLAG)
    try:
        trainer = build(model, dataset)
    except Exception as exc:  # a learner's function: any error is bad input
        raise StepSpecError(f"{FLAG}: {spec} raised {type(exc).__name__}: {exc}"
                            .splitlines()[0]) from None
    if not isinstance(trainer, Trainer):
        raise StepSpecError(f"{FLAG}: {spec} returned {type(trainer).__name__}, "
                            "not a transformers.Trainer")
    return trainer


class _Later:
    """The train dataset, handed to ``make_trainer`` before its rows exist:
    they depend on the Trainer's own batch size and accumulation."""

    def __init__(self) -> None:
        self.rows: Any = None

    def __iter__(self):
        return iter(self.rows)


class OwnTrainerAdapter:
    package = "transformers"
    # what prepare imports: the agent server's preload (frameworks.modules)
    modules: tuple[str, ...] = ("transformers.trainer",)
    variants: tuple[dict[str, Any], ...] = ()  # audited only by `audit --trainer`

    def supports(self, flags: dict[str, Any]) -> bool:
        return "spec" in flags

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        from torch.utils.data import IterableDataset
        from transformers import TrainerCallback

        later = type("Rows", (_Later, IterableDataset), {})()
        # A learner's relative paths (output_dir="out") land in the audit's
        # scratch space, never in the directory the audit was started from.
        setup.workdir.mkdir(parents=True, exist_ok=True)
        with working_dir(setup.workdir):
            trainer = make(setup.flags["spec"], model, later)
        if setup.rebuild is not None:
            window = setup.rebuild(trainer.args.per_device_train_batch_size,
                                   trainer.args.gradient_accumulation_steps)
        later.rows = dispatched(window)
        capture = capture_callback(model)

        class Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                control.should_training_stop = True

        trainer.add_callback(capture)
        trainer.add_callback(Stop())
        bf16 = bool(getattr(trainer.args, "bf16", False))
        clip = getattr(trainer.args, "max_grad_norm", None)
        notes = (f"max_grad_norm={clip:g}: the Trainer clips before the optimizer step, "
                 "which scales a large gradient uniformly",) if clip else ()

        def run() -> Captured:
            with working_dir(setup.workdir):
                return train_and_capture(model, trainer.train, lambda: capture.grad,
                                         "the Trainer", "bfloat16" if bf16 else "float32",
                                         notes)
        return run


ADAPTER = OwnTrainerAdapter()
