"""Training steps the audit can check: the correct designs, the control, the
bug catalog, the frameworks' recipes, and any learner's step.

A step is one accumulation window of one rank, without the optimizer::

    def step(model, microbatches, world_size) -> None

- ``model`` is the DDP-wrapped model (``model.no_sync()`` exists);
- ``microbatches`` is this rank's share of the window, a sequence of
  ``(inputs, labels)`` pairs; labels equal to -100 are ignored;
- the step runs forward and backward on every microbatch and leaves the
  gradients in ``.grad``. It may call ``torch.distributed`` collectives.

The audit zeroes the gradients before each call and compares what the step
leaves in ``.grad`` with the single-process gradient of the mean over every
supervised token of the window.

Set-up before the first forward (a DDP comm hook, say) goes in an optional
``setup(model, world_size)`` attribute of the step; the audit calls it once,
right after wrapping a fresh model in DDP. ``with_setup`` attaches one.

A step is named by a short built-in name (``global_token``), a recipe's
name (``fairseq``, see ``recipes``), by ``package.module:function`` or by
``path/to/file.py:function``.
"""

from course_lib.steps.base import Step, StepInfo, StepSpecError, with_setup
from course_lib.steps.catalog import BUILTIN
from course_lib.steps.registry import load

__all__ = ["BUILTIN", "Step", "StepInfo", "StepSpecError", "load", "with_setup"]
