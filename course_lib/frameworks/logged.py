"""What the frameworks LOG: their own loss logging and evaluation, run as a
learner runs them, on the skewed window, and the correct recipes.

- the Hugging Face Trainer: the training loss it logs (``logging_steps=1``,
  read by an ``on_log`` callback) and the ``eval_loss`` of
  ``trainer.evaluate()``; its recipe for a token-weighted eval metric
  (``preprocess_logits_for_metrics`` + ``compute_metrics``) in the same call;
- accelerate's ``gather_for_metrics`` on an eval set that the world does not
  divide (``even_batches=True``, the default, pads it with the first samples):
  of per-rank scalar mean losses, of ``loss.repeat(batch_size)`` (the
  ``run_clm_no_trainer`` example), and of per-sample [sum, count] rows;
- Lightning's ``self.log(..., sync_dist=True)``: ``on_step``, and
  ``on_epoch`` with the batch size it infers or ``batch_size=<tokens>``,
  and a torchmetrics ``MeanMetric`` weighted by tokens, read by a ``Logger``
  of our own.

Each function returns the values as logged on this rank and, where the data
layout matters, the rows each step was fed (to reconstruct the formulas).
Nothing of a framework is patched. The recipe functions below are what runs,
and their source is what the report shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from course_lib.frameworks import Setup, hf
from course_lib.frameworks.window import Listed, Window, dispatched

Fed = list[list[torch.Tensor]]  # per step: the (input_ids, labels) rows the model was fed


# --- the recipes: run as written, shown as written -----------------------------------


def token_sums(logits, labels):
    """Per sample: [summed NLL over the supervised labels after the shift, their count].
    HF: preprocess_logits_for_metrics; accelerate: what gather_for_metrics gathers."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:],
                          ignore_index=-100, reduction="none")
    return torch.stack([nll.sum(1), labels[:, 1:].ne(-100).sum(1).to(nll.dtype)], 1)


def token_mean(prediction):
    """HF compute_metrics: the gathered rows (deduplicated per sample), sum / sum."""
    s, n = prediction.predictions.astype("float64").sum(0)
    return {"token_mean": s / n}


def accelerate_token_mean(accelerator, model, loader):
    """accelerate: per-sample rows through gather_for_metrics (it drops the
    even_batches duplicates), then sum / sum."""
    rows = []
    with torch.no_grad():
        for batch in loader:
            rows.append(accelerator.gather_for_metrics(
                token_sums(model(**batch).logits, batch["labels"])))
    s, n = torch.cat(rows).double().sum(0)
    return float(s / n)


def lightning_token_mean(module, name, loss, labels):
    """Lightning, in training_step: the batch's token mean, weighted by its
    tokens, in a torchmetrics MeanMetric (module.token_mean): its states are
    float sums, summed over the ranks at epoch end."""
    module.token_mean.update(loss, weight=labels[:, 1:].ne(-100).sum())
    module.log(name, module.token_mean, on_step=False, on_epoch=True)


def _source(*functions: Callable[..., Any], usage: str) -> str:
    return usage + "\n\n" + "\n".join(inspect.getsource(f) for f in functions)


RECIPES: dict[str, str] = {
    "hf train": (
        "model.loss_type = 'ForCausalLM'  # where the class name hides it (GPT2LMHeadModel:"
        " None), the Trainer counts labels[:, 0] too\n"
        "TrainingArguments(..., average_tokens_across_devices=True, logging_steps=1)"
        "  # the default since 4.54"),
    "hf eval": _source(token_sums, token_mean, usage=(
        "Trainer(..., preprocess_logits_for_metrics=token_sums, compute_metrics=token_mean)"
        ".evaluate()['eval_token_mean']")),
    "accelerate": _source(token_sums, accelerate_token_mean, usage=(
        "accelerate_token_mean(accelerator, model, accelerator.prepare(eval_loader))")),
    "lightning": _source(lightning_token_mean, usage=(
        "self.token_mean = torchmetrics.MeanMetric()  # in the LightningModule's __init__\n"
        "lightning_token_mean(self, 'train_loss', loss, batch['labels'])"
        "  # in training_step; read at epoch end")),
}


# --- the runs ------------------------------------------------------------------------


def record_eval(model: torch.nn.Module, fed: Fed) -> Any:
    """A forward pre-hook keeping every no-grad forward's (input_ids, labels)."""
    def keep(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled() and "labels" in kwargs:
            fed.append([kwargs["input_ids"].detach().cpu().clone(),
                        kwargs["labels"].detach().cpu().clone()])
    return model.register_forward_pre_hook(keep, with_kwargs=True)


def hf_run(setup: Setup, model: torch.nn.Module, window: Window,
           eval_rows: list[dict[str, torch.Tensor]], eval_batch_size: int,
           loss_type: str | None = None) -> tuple[dict[str, float], Fed]:
    """One Trainer (``setup.flags``): ``evaluate()`` from the initial weights,
    then one logged optimizer step. The logged training loss, ``eval_loss``
    and the recipe's ``eval_token_mean``; the rows evaluation was fed.
    ``loss_type``: set on the model first (the train recipe)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    if loss_type is not None:
        setattr(model, "loss_type", loss_type)  # noqa: B010 (a Module's attributes are typed)

    logged: list[float] = []

    class OnLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                logged.append(float(logs["loss"]))

    args = hf.arguments(setup)
    args.update(logging_strategy="steps", logging_steps=1,
                per_device_eval_batch_size=eval_batch_size)
    trainer = Trainer(model=model, args=TrainingArguments(**args),
                      train_dataset=dispatched(window), eval_dataset=Listed(eval_rows),
                      data_collator=default_data_collator, callbacks=[OnLog()],
                      preprocess_logits_for_metrics=token_sums, compute_metrics=token_mean)
    fed: Fed = []
    hook = record_eval(model, fed)
    try:
        metrics = trainer.evaluate()
    finally:
        hook.remove()
    trainer.train()
    if not logged:
        raise RuntimeError("the Trainer logged no training loss")
    return ({"train loss": logged[0], "eval_loss": float(metrics["eval_loss"]),
             "eval_token_mean": float(metrics["eval_token_mean"])}, fed)


def accelerate_run(model: torch.nn.Module, eval_rows: list[dict[str, torch.Tensor]],
                   eval_batch_size: int, cpu: bool) -> tuple[dict[str, float], Fed]:
    """The eval loops a script writes around ``gather_for_metrics``, on a
    prepared loader with the default ``even_batches=True``."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import DataLoader

    AcceleratorState._reset_state(reset_partial_state=False)  # a fresh Accelerator
    GradientState._reset_state()
    accelerator = Accelerator(cpu=cpu)
    loader = accelerator.prepare(DataLoader(Listed(eval_rows), batch_size=eval_batch_size,
                                            shuffle=False))
    model.eval()
    scalar, repeated = [], []
    fed: Fed = []
    hook = record_eval(model, fed)
    try:
        with torch.no_grad():
            for batch in loader:
                loss = model(**batch).loss
                scalar.append(accelerator.gather_for_metrics(loss.detach()))
                repeated.append(accelerator.gather_for_metrics(
                    loss.detach().repeat(batch["input_ids"].shape[0])))
    finally:
        hook.remove()
    return ({"scalar": float(torch.cat(scalar).double().mean()),
             "repeat": float(torch.cat(repeated).double().mean()),
             "rows": accelerate_token_mean(accelerator, model, loader)}, fed)


def lightning_run(setup: Setup, model: torch.nn.Module, window: Window
                  ) -> dict[str, float | None]:
    """Each rank's microbatches, one optimizer step each, at learning rate 0
    (every forward sees the initial weights); what our Logger received:
    the first ``on_step`` value and the ``on_epoch`` values."""
    import lightning as L
    from lightning.pytorch.loggers import Logger
    from torch.utils.data import DataLoader
    from torchmetrics import MeanMetric

    class Recorder(Logger):
        def __init__(self) -> None:
            super().__init__()
            self.metrics: list[dict[str, float]] = []

        @property
        def name(self) -> str:
            return "recorder"

        @property
        def version(self) -> int:
            return 0

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.metrics.append(dict(metrics))

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.token_mean = MeanMetric()

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self.log("on_step", loss, on_step=True, on_epoch=False, sync_dist=True)
            self.log("on_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
            self.log("on_epoch_tokens", loss, on_step=False, on_epoch=True, sync_dist=True,
                     batch_size=int(batch["labels"][:, 1:].ne(-100).sum()))
            lightning_token_mean(self, "mean_metric", loss, batch["labels"])
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    recorder = Recorder()
    loader = DataLoader(Listed([mb.as_dict() for mb in window[setup.rank]]), batch_size=None,
                        shuffle=False)
    trainer = L.Trainer(
        accelerator="gpu" if setup.device.type == "cuda" else "cpu",
        devices=setup.world_size, num_nodes=1, strategy="ddp", max_epochs=1,
        use_distributed_sampler=False, logger=recorder, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(setup.workdir))
    trainer.fit(Module(), train_dataloaders=loader)

    def first(key: str) -> float | None:
        found = [m[key] for m in recorder.metrics if key in m]
        return float(found[0]) if found else None

    return {key: first(key) for key in ("on_step", "on_epoch", "on_epoch_tokens",
                                        "mean_metric")}


__all__ = ["RECIPES", "accelerate_run", "accelerate_token_mean", "hf_run", "lightning_run",
           "lightning_token_mean", "token_mean", "token_sums"]
