"""PyTorch Lightning: a LightningModule around the model, whose
``training_step`` returns the model's own loss (a mean over the
microbatch's labels), and ``Trainer(accumulate_grad_batches=M)`` with the
DDP strategy. Each rank's DataLoader holds its own microbatches
(``use_distributed_sampler=False``), in order. A Callback's
``on_before_optimizer_step`` takes the gradient; no clipping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_lib.frameworks import Captured, Setup, flat_grad, train_and_capture
from course_lib.frameworks.window import Listed, Window


class LightningAdapter:
    package = "lightning"
    modules: tuple[str, ...] = ("lightning",)  # the agent server's preload
    variants: tuple[dict[str, Any], ...] = ({},)

    def supports(self, flags: dict[str, Any]) -> bool:
        return True

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        import lightning as L
        from torch.utils.data import DataLoader

        lr = setup.lr

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def training_step(self, batch, batch_idx):
                return self.model(**batch).loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=lr)

        class Capture(L.Callback):
            grad: torch.Tensor | None = None

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                if self.grad is None:
                    self.grad = flat_grad(model)

        mine = [mb.as_dict() for mb in window[setup.rank]]
        loader = DataLoader(Listed(mine), batch_size=None, shuffle=False)
        capture = Capture()
        trainer = L.Trainer(
            accelerator="gpu" if setup.device.type == "cuda" else "cpu",
            devices=setup.world_size, num_nodes=1, strategy="ddp",
            accumulate_grad_batches=setup.shape.microbatches, max_steps=1,
            use_distributed_sampler=False, gradient_clip_val=None, logger=False,
            enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=str(setup.workdir),
            callbacks=[capture])
        module = Module()
        return lambda: train_and_capture(
            model, lambda: trainer.fit(module, train_dataloaders=loader),
            lambda: capture.grad, "Lightning")


ADAPTER = LightningAdapter()
