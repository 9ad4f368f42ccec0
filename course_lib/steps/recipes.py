"""The frameworks' recipes, re-implemented from their formulas, as audit steps.

Notation: S = one microbatch's summed token loss, n = its supervised token
count; M = microbatches per window, W = ranks; N = the window's token count
over all ranks, N_r = rank r's count; R = rows whose first label is
not -100 (ne(-100) counts it; no position predicts it). "mean" is DDP's
gradient average, "sum" a SUM reduction (a DDP comm hook here).

Each recipe is a step (``step(model, microbatches, world_size)``, see
``steps``) written from the formula that a framework's source implements;
no framework code is copied. The facts, with the files, functions, PRs and
commits they come from, are surveyed in the course's research notes on peer
recipes; ``Recipe.citation`` names the source of each row.

A recipe step returns the sum of the scalars it backpropagated: the loss
it would log, which tells a NaN loss from a finite one on an empty window.
The audit ignores the return value.

Pure functions here predict what each recipe trains on a given window
(``predict``; ``predict_rows`` from each row's count, for the rows below the
first table) and say whether a measured gradient, classified against the
reference one (``core.verdicts.classify``), matches the prediction
(``matches``); ``recipe_audit`` runs them under torchrun.

Each recipe also names the objective its source *claims* (``Recipe.claims``,
a key of ``rl_recipes.CLAIMS``: the token mean for most, the sequence-level
mean, a constant normalizer...), and is measured and predicted against it
as well as against the token mean. The RL stacks' recipes live in
``rl_recipes`` (advantage-weighted, at importance ratio 1) and are listed in
``RECIPES`` with the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.core.data import IGNORE_INDEX
from course_lib.core.model import count_before_shift, count_tokens, supervised_mask
from course_lib.core.normalize import (
    Microbatch,
    global_count,
    scale_grads,
    window_count,
)
from course_lib.core.verdicts import TOLERANCE, EmptyOutcome, Measured, Verdict
from course_lib.steps import rl_recipes as rl
from course_lib.steps.base import StepInfo, backprop_each, with_setup
from course_lib.steps.catalog import global_token, sum_reduction
from course_lib.steps.rl_recipes import CLAIMS, MAX_COMPLETION_LENGTH

# The verdicts and the empty-window outcomes are core.verdicts'; chapter 08
# reads ``recipes.SCALED``.
EXACT, BIASED, SCALED = Verdict.EXACT, Verdict.BIASED, Verdict.SCALED
RAISES, ZERO_STEP, NAN = EmptyOutcome.RAISES, EmptyOutcome.ZERO_STEP, EmptyOutcome.NAN


class NonFiniteLossError(RuntimeError):
    """torchtitan's guard: a non-finite loss stops training before the step."""


# --- losses, as the frameworks compute them ---------------------------------------------


def _flat(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.flatten(0, 1), labels.flatten()


def sum_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """S: cross-entropy with ``ignore_index`` and a SUM reduction (fairseq,
    HF's ``fixed_cross_entropy``, torchtitan since #2206)."""
    return F.cross_entropy(*_flat(logits, labels), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def mean_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """S / n: the default mean cross-entropy; NaN when n = 0 (zero gradient)."""
    return F.cross_entropy(*_flat(logits, labels), ignore_index=IGNORE_INDEX)


def masked_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """S, Megatron's way: a cross-entropy on every position times a loss mask.

    The labels under the mask are real token ids there, so the cross-entropy
    has no ignore_index: dividing this sum by 0 sends NaN into every logit.
    """
    mask = supervised_mask(labels)
    logits, targets = _flat(logits, labels.clamp(min=0))
    per_token = F.cross_entropy(logits, targets, reduction="none")
    return (per_token * mask.flatten()).sum()


# --- building blocks ----------------------------------------------------------------------


def _mean_of_microbatch_means(model: nn.Module, microbatches: Sequence[Microbatch]):
    """Each microbatch's mean cross-entropy, divided by the microbatches."""
    steps = len(microbatches)
    return backprop_each(model, microbatches, lambda lg, lb: mean_ce(lg, lb) / steps)


# --- the recipes ------------------------------------------------------------------------


def course_rule(model, microbatches, world_size):
    """The course: count first, each rank backprops W * S_r / N, DDP averages."""
    global_token(model, microbatches, world_size)


def fairseq(model, microbatches, world_size):
    """fairseq: backprop the raw sum S; after DDP's mean, grads x W / max(N, 1)."""
    logged = backprop_each(model, microbatches, sum_ce)
    sample_size = int(global_count(window_count(microbatches)))  # summed over ranks
    scale_grads(model, world_size / max(sample_size, 1))  # `sample_size or 1.0`
    return logged


def hf_trainer_le_4_45(model, microbatches, world_size):
    """HF Trainer <= 4.45: the model's mean loss, divided by the accumulation steps."""
    return _mean_of_microbatch_means(model, microbatches)


def hf_trainer_4_46_0(model, microbatches, world_size):
    """HF Trainer 4.46.0-4.46.1: S over this rank's own window count N_r."""
    steps = len(microbatches)
    num_items = window_count(microbatches)  # local, after the shift
    # The Trainer multiplies by the accumulation steps, accelerate divides again.
    return backprop_each(model, microbatches,
                     lambda lg, lb: sum_ce(lg, lb) / num_items * steps / steps)


def hf_trainer_4_46_mean_loss(model, microbatches, world_size):
    """HF Trainer 4.46.0-4.47 with a model that takes no loss kwargs (GPT-2):
    the model's own mean, and nothing divides by the accumulation steps."""
    return backprop_each(model, microbatches, mean_ce)


def hf_trainer_local_tokens(model, microbatches, world_size):
    """HF Trainer >= 4.46.3, average_tokens_across_devices off: S / N_r',
    this rank's own window count, taken before the shift."""
    num_items = torch.stack([count_before_shift(lb) for _, lb in microbatches]).sum()
    return backprop_each(model, microbatches, lambda lg, lb: sum_ce(lg, lb) / num_items)


def hf_trainer_avg_tokens(model, microbatches, world_size):
    """HF Trainer 4.46.3-5.9 (and later, on a model whose loss_type is None),
    average_tokens_across_devices: W * S / N', N'
    counted before the shift and summed over ranks."""
    num_items = global_count(torch.stack([count_before_shift(lb)
                                          for _, lb in microbatches]).sum())
    return backprop_each(model, microbatches,
                     lambda lg, lb: sum_ce(lg, lb) / num_items * world_size)


def hf_trainer_5_10_1(model, microbatches, world_size):
    """HF Trainer >= 5.10.1: W * S / N with N counted after the shift."""
    num_items = global_count(window_count(microbatches))
    return backprop_each(model, microbatches,
                     lambda lg, lb: sum_ce(lg, lb) / num_items * world_size)


def accelerate_accumulate(model, microbatches, world_size):
    """accelerate's ``accumulate()``: the model's mean loss, which
    ``Accelerator.backward`` divides by the accumulation steps."""
    return _mean_of_microbatch_means(model, microbatches)


def accelerate_docs(model, microbatches, world_size):
    """accelerate's guide: S * GA * W / N', then accelerate divides by GA.
    The guide counts ``labels.ne(-100)`` on the batch, before a causal LM
    shifts its labels: N' = N + R."""
    steps = len(microbatches)
    num_items = int(global_count(torch.stack([count_before_shift(lb)
                                              for _, lb in microbatches]).sum()))
    return backprop_each(model, microbatches,
                     lambda lg, lb: sum_ce(lg, lb) * steps * world_size / num_items / steps)


def torchtitan_pre_2206(model, microbatches, world_size):
    """torchtitan before #2206: mean cross-entropy, rescaled by 1 / accumulation."""
    return _mean_of_microbatch_means(model, microbatches)


@with_setup(sum_reduction)
def torchtitan_fsdp(model, microbatches, world_size):
    """torchtitan #2206 on FSDP: S / N and a SUM reduction; stops on a NaN loss."""
    valid = global_count(window_count(microbatches))
    logged = backprop_each(model, microbatches, lambda lg, lb: sum_ce(lg, lb) / valid)
    _stop_unless_finite(logged, microbatches)
    return logged


def _stop_unless_finite(logged: float, microbatches: Sequence[Microbatch]) -> None:
    """Every rank learns whether any rank's loss is non-finite, then all stop."""
    bad = torch.tensor([0 if math.isfinite(logged) else 1],
                       device=microbatches[0][1].device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(bad)
    if int(bad):
        raise NonFiniteLossError("non-finite loss: training stops before the "
                                 "optimizer step (torchtitan #4226)")


def torchtitan_ddp(model, microbatches, world_size):
    """torchtitan #2206 on pure DDP: S / N, but DDP still averages over W."""
    valid = global_count(window_count(microbatches))
    return backprop_each(model, microbatches, lambda lg, lb: sum_ce(lg, lb) / valid)


def megatron_default(model, microbatches, world_size):
    """Megatron-LM default: masked sum / clamp(n, 1), divided by the microbatches."""
    steps = len(microbatches)
    return backprop_each(model, microbatches, lambda lg, lb: masked_sum(lg, lb)
                     / torch.clamp(count_tokens(lb), min=1) / steps)


def megatron_pre_clamp(model, microbatches, world_size):
    """Megatron-LM default before the clamp: masked sum / n / microbatches."""
    steps = len(microbatches)
    return backprop_each(model, microbatches,
                     lambda lg, lb: masked_sum(lg, lb) / count_tokens(lb) / steps)


@with_setup(sum_reduction)
def megatron_per_token(model, microbatches, world_size):
    """Megatron-LM calculate_per_token_loss: the masked sum S, a SUM reduction,
    then grads x 1 / clamp(N, 1) with N counted during the pass."""
    logged = backprop_each(model, microbatches, masked_sum)
    total = global_count(window_count(microbatches))  # finalize_model_grads
    # 1 / N in float64: a float32 reciprocal alone is off by ~1e-8.
    scale_grads(model, 1.0 / torch.clamp(total, min=1).double())
    return logged


def lightning(model, microbatches, world_size):
    """PyTorch Lightning: the step's (mean) loss / accumulate_grad_batches."""
    return _mean_of_microbatch_means(model, microbatches)


def nanogpt(model, microbatches, world_size):
    """nanoGPT train.py: mean cross-entropy / gradient_accumulation_steps."""
    return _mean_of_microbatch_means(model, microbatches)


def deepspeed(model, microbatches, world_size):
    """DeepSpeed engine.backward: the user's mean loss / GAS (scale_wrt_gas)."""
    return _mean_of_microbatch_means(model, microbatches)


def axolotl(model, microbatches, world_size):
    """axolotl: the HF Trainer with average_tokens_across_devices hard-set to
    False (#2984), on a model whose loss_type resolves to ForCausalLMLoss
    (transformers >= 5.10.1): S / N_r, this rank's own window count."""
    num_items = window_count(microbatches)  # local, after the shift
    return backprop_each(model, microbatches, lambda lg, lb: sum_ce(lg, lb) / num_items)


def unsloth_count(model, microbatches, world_size):
    """Unsloth's get_batch_samples: N = labels[..., 1:] != -100 (after the
    shift, packed boundaries left out), gathered across the ranks with
    average_tokens_across_devices: W * S / N."""
    num_items = global_count(window_count(microbatches))
    return backprop_each(model, microbatches,
                         lambda lg, lb: sum_ce(lg, lb) / num_items * world_size)


def llamafactory_v1(model, microbatches, world_size):
    """LLaMA-Factory v1 fit: mean_loss * n_m * W / N. The mean divides by the
    shifted count, while n_m and N count ``labels != -100`` before the shift
    (N all-reduced): each microbatch weighs (n_m + R_m) / n_m too much."""
    total = global_count(torch.stack([count_before_shift(lb) for _, lb in microbatches]).sum())
    return backprop_each(model, microbatches, lambda lg, lb: mean_ce(lg, lb)
                         * count_before_shift(lb) * world_size / total)


def torchtune_distributed(model, microbatches, world_size):
    """torchtune full_finetune_distributed: backprop S (labels come shifted),
    then all_reduce(num_tokens) and scale_grads(W / num_tokens), unguarded."""
    logged = backprop_each(model, microbatches, sum_ce)
    num_tokens = global_count(window_count(microbatches))
    scale_grads(model, world_size / num_tokens.double())  # float64: see megatron_per_token
    return logged


# --- what each recipe trains -------------------------------------------------------------

# How the gradient relates to the reference g* = grad(sum S / N):
OBJECTIVES = {
    "token_mean": "sum S / N: the global token mean",
    "microbatch_means": "a mean of per-microbatch means: exact only when every n is equal",
    "rank_means": "(1/W) sum_r S_r / N_r: exact only when every N_r is equal",
    "rank_means_pre_shift": "(1/W) sum_r S_r / (N_r + R_r): rank means, each row's "
                            "first label counted too",
    "microbatch_sums": "(1/W) sum S / n: a mean of microbatch means without its 1/M",
    "world_scaled": "sum S / (W * N): the token mean times 1/W",
    "shift_scaled": "sum S / (N + R): the token mean times N / (N + R)",
    # The new rows' objectives: each predicted from the rows' counts (``row_weights``).
    "generation_tokens": "sum S / (N_gen x GA / spg): the window over the average window "
                         "count of its generation batch",
    "trl_sequence_means": "each completion's token mean, averaged over each microbatch's B "
                          "completions, / (M W)",
    "sequence_means": "each completion's token mean, averaged over the non-empty completions",
    "sequence_sums": "each completion's sum, averaged over the non-empty completions",
    "trl_constant": f"sum S / (B x {MAX_COMPLETION_LENGTH} x M x W): a constant per "
                    "microbatch (B its completions)",
    "llamafactory_v1": "sum_m S_m (n_m + R_m) / (n_m (N + R)): each microbatch's mean, "
                       "weighted by its count before the shift",
}


@dataclass(frozen=True)
class RealRun:
    """Selects the version matrix's rows that ran the real code of a recipe:
    a framework, a PEP 440 range of ``package``'s version (the framework's
    own by default), the model classes, and the flags that must be set."""

    framework: str  # a frameworks adapter: hf, accelerate, lightning, trl
    versions: str  # e.g. ">=4.46.3,<5.10.1"
    models: tuple[str, ...] = ()  # model_types; () is any
    flags: tuple[tuple[str, Any], ...] = ()  # (flag, value) pairs the row must hold
    package: str = ""  # whose version ``versions`` bounds; "" is the framework's


# average_tokens_across_devices, as the Trainer's rows of the matrix set it.
_ON = (("average_tokens_across_devices", True),)
_OFF = (("average_tokens_across_devices", False),)
# The model classes the matrix audits, by what decides the Trainer's count:
# GPT2LMHeadModel took no loss kwargs before 4.48 and has loss_type None;
# LlamaForCausalLM takes them and resolves to ForCausalLMLoss.
_LLAMA, _GPT2 = ("llama",), ("gpt2",)


@dataclass(frozen=True)
class Recipe:
    name: str
    func: Callable
    label: str  # short, for tables and plots
    framework: str
    versions: str
    citation: str  # file / function, PR or commit
    backprop: str  # the scalar each microbatch backprops
    reduction: str  # how the ranks' gradients are combined
    objective: str  # a key of OBJECTIVES
    verdict: str  # one line
    empty: tuple[EmptyOutcome, bool]  # (outcome, loss is finite) on a window with N = 0
    # The runs of the real code this row re-implements (rows of the version
    # matrix, data/frameworks-matrix.json), or why it was not run.
    real: tuple[RealRun, ...] = ()
    unrun: str = ""
    tried: str = ""  # the matrix entry that tried to install it, if any
    # What the source says it trains (a key of rl_recipes.CLAIMS), measured
    # beside the token mean; old rows claim the token mean.
    claims: str = "token_mean"
    policy: bool = False  # an RL recipe: it backprops A l (advantage-weighted), not l
    # Optimizer steps the audited microbatches span (TRL's steps_per_generation
    # / GA): the step trains the first 1/generation of each rank's.
    generation: int = 1
    # Keys of the TRL loss comparison (data/trl-grpo-loss.json) that ran its real loss.
    loss_runs: tuple[str, ...] = ()

    @property
    def claimed(self) -> str:
        return CLAIMS[self.claims]

    @property
    def step(self) -> StepInfo:
        return StepInfo(self.name, self.func, "recipe",
                        f"{self.framework}, {self.versions}", self.verdict)

    @property
    def effective(self) -> str:
        return OBJECTIVES[self.objective]

    @property
    def predicted_empty(self) -> str:
        return describe_empty(*self.empty)


def describe_empty(outcome: EmptyOutcome | str, loss_finite: bool | None) -> str:
    """'raises', 'NaN gradients', 'zero step' or 'zero step, NaN loss'."""
    if outcome == NAN:
        return "NaN gradients"
    if outcome == RAISES or loss_finite is None or loss_finite:
        return str(outcome)
    return f"{outcome}, NaN loss"


def _recipe(func, label, framework, versions, citation, backprop, reduction,
            objective, verdict, empty, real=(), unrun="", tried="", **more) -> Recipe:
    return Recipe(func.__name__, func, label, framework, versions, citation,
                  backprop, reduction, objective, verdict, empty, tuple(real), unrun,
                  tried, **more)


# Why the real code of the frameworks without an adapter was not run here.
NO_ADAPTER = {
    "fairseq": "not tried: fairseq's loop is its fairseq-train CLI over binarized "
               "datasets on disk; no adapter",
    "torchtitan": "no adapter: its Trainer builds its own model, tokenizer and "
                  "dataset from a TOML job config",
    "Megatron-LM": "not tried: Megatron-LM's loop needs its own model-parallel setup "
                   "and model classes; no adapter",
    "nanoGPT": "nanoGPT is a script, not a package: its formula is the whole row",
    "DeepSpeed": "not tried: no adapter for DeepSpeed's engine",
    "this course": "this course's own rule: chapters 03-04 audit it",
    "verl": "not tried: verl's actor runs inside its Ray workers over a rollout; no adapter",
    "OpenRLHF": "not tried: OpenRLHF's loss runs inside its DeepSpeed/Ray actors; no adapter",
    "NeMo-RL": "not tried: NeMo-RL's loss runs inside its Ray policy workers; no adapter",
    "axolotl": "not tried: axolotl is a CLI over a YAML config; it configures the HF "
               "Trainer that hf_trainer_4_46_0's rows ran with "
               "average_tokens_across_devices off",
    "LLaMA-Factory": "not tried: no adapter for LLaMA-Factory's v1 trainer",
    "torchtune": "no adapter: its loop is a recipe script driven by a YAML config",
}
# The TRL GRPO rows: the real loss function on one process
# (benchmarks/trl_grpo_loss.py), and the real trainer's step under torchrun on
# every rank (benchmarks/trl_grpo_trainer.py: dapo, bnpo, grpo and dr_grpo
# train what these recipes do).
TRL_GRPO = ("TRL GRPOTrainer", "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss")


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    _recipe(course_rule, "this course", "this course", "chapter 03",
            "course_lib.core.normalize.accumulate_window",
            "W·S / N", "mean", "token_mean",
            "exact; an empty window is refused on every rank (EmptyWindowError)",
            (RAISES, None),
            unrun=NO_ADAPTER["this course"]),
    _recipe(fairseq, "fairseq", "fairseq", "since v0.6.0 (2018)",
            "fairseq/trainer.py Trainer.train_step, FairseqOptimizer.multiply_grads "
            "(commits 1082ba35, 4a6f89d3)",
            "S", "mean, then grads × W / max(N, 1)", "token_mean",
            "exact: sums first, divides by the all-reduced sample size last",
            (ZERO_STEP, True),
            unrun=NO_ADAPTER["fairseq"]),
    _recipe(hf_trainer_le_4_45, "HF <=4.45", "HF transformers Trainer", "<= 4.45",
            "transformers/trainer.py Trainer.training_step + accelerate "
            "Accelerator.backward (loss / GA)",
            "S / (M·n)", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, False),
            real=[RealRun("hf", "<4.46")]),
    _recipe(hf_trainer_4_46_0, "HF 4.46.0-1", "HF transformers Trainer",
            "4.46.0-4.46.1",
            "transformers PR #34191; trainer.py get_batch_samples, "
            "loss_utils.fixed_cross_entropy",
            "S / N_r (local window count)", "mean", "rank_means",
            "biased: each rank's own window mean, averaged over ranks", (ZERO_STEP, False),
            real=[RealRun("hf", ">=4.46.0,<4.46.2", _LLAMA),
                  RealRun("hf", ">=5.10.1", _LLAMA, _OFF)]),
    _recipe(hf_trainer_4_46_mean_loss, "HF 4.46-4.47, mean loss", "HF transformers Trainer",
            "4.46.0-4.47 (not 4.46.2), a model that takes no loss kwargs (GPT-2)",
            "transformers PR #34191 (model_accepts_loss_kwargs False), fixed for "
            "GPT-2 by PR #35438 (4.48)",
            "S / n", "mean", "microbatch_sums",
            "biased: a mean of microbatch means, M times too large", (ZERO_STEP, False),
            real=[RealRun("hf", ">=4.46.0,<4.48,!=4.46.2", _GPT2)]),
    _recipe(hf_trainer_local_tokens, "HF >=4.46.3, local", "HF transformers Trainer",
            ">= 4.46.3 with average_tokens_across_devices off (from 5.10.1: a model "
            "whose loss_type is None, such as GPT-2)",
            "transformers trainer.py _get_num_items_in_batch (no gather), compute_loss",
            "S / N_r', N_r' = N_r + R_r", "mean", "rank_means_pre_shift",
            "biased: each rank's own window mean, its first labels counted too",
            (ZERO_STEP, False),
            real=[RealRun("hf", ">=4.46.3,<4.48", _LLAMA, _OFF),
                  RealRun("hf", ">=4.48,<5.10.1", (), _OFF),
                  RealRun("hf", ">=5.10.1", _GPT2, _OFF)]),
    _recipe(hf_trainer_avg_tokens, "HF 4.46.3-5.9", "HF transformers Trainer",
            "4.46.3-5.9 with average_tokens_across_devices (default since 4.54); "
            "from 5.10.1, a model whose loss_type is None (GPT-2); TRL's SFTTrainer and "
            "Unsloth's too",
            "transformers PR #34373 (default: PR #39395); trainer.py "
            "_get_num_items_in_batch, compute_loss",
            "W·S / N', N' = N + R", "mean", "shift_scaled",
            "uniformly scaled by N / (N + R): every token weighs the same, "
            "but too little", (ZERO_STEP, False),
            real=[RealRun("hf", ">=4.46.3,<4.48", _LLAMA, _ON),
                  RealRun("hf", ">=4.48,<5.10.1", (), _ON),
                  RealRun("hf", ">=5.10.1", _GPT2, _ON),
                  RealRun("trl", ">=4.48,<5.10.1", package="transformers"),
                  RealRun("trl", ">=5.10.1", _GPT2, package="transformers"),
                  RealRun("unsloth", ">=5.10.1", _GPT2, package="transformers")]),
    _recipe(hf_trainer_5_10_1, "HF >=5.10.1", "HF transformers Trainer",
            ">= 5.10.1, a model whose loss_type resolves to ForCausalLMLoss (Llama); "
            "TRL's SFTTrainer too (Unsloth's count: unsloth_count)",
            "transformers PR #46204; trainer.py _get_num_items_in_batch (labels[..., 1:])",
            "W·S / N", "mean", "token_mean", EXACT.value, (ZERO_STEP, False),
            real=[RealRun("hf", ">=5.10.1", _LLAMA, _ON),
                  RealRun("trl", ">=5.10.1", _LLAMA, package="transformers")]),
    _recipe(accelerate_accumulate, "accelerate accumulate()", "HF accelerate",
            "Accelerator.accumulate()",
            "accelerate accelerator.py Accelerator.accumulate, Accelerator.backward "
            "(loss / gradient_accumulation_steps)",
            "S / (M·n)", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, False),
            real=[RealRun("accelerate", ">=1.0", (), (("recipe", "accumulate"),))]),
    _recipe(accelerate_docs, "accelerate docs", "HF accelerate (docs recipe)",
            "since PR #3193 (2024-12)",
            "accelerate docs/source/usage_guides/gradient_accumulation.md, PR #3193",
            "W·S / N', N' = N + R (×M, then ÷M)", "mean", "shift_scaled",
            "uniformly scaled by N / (N + R) on a causal LM: the guide counts the "
            "labels before the model shifts them", (ZERO_STEP, False),
            real=[RealRun("accelerate", ">=1.0", (), (("recipe", "docs_recipe"),))]),
    _recipe(torchtitan_pre_2206, "torchtitan <#2206", "torchtitan", "before #2206 (2026-01)",
            "torchtitan components/loss.py RescaleAccumulatedLoss (before PR #2206)",
            "S / (M·n)", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, False),
            unrun=NO_ADAPTER["torchtitan"],
            tried="torchtitan-0.3.0"),
    _recipe(torchtitan_fsdp, "torchtitan FSDP", "torchtitan",
            "#2206 on FSDP/HSDP (stops on NaN since #4226)",
            "torchtitan PR #2206 train_step (global_valid_tokens), "
            "disable_fsdp_gradient_division; PR #4226 (loss_is_finite)",
            "S / N", "sum (gradient divide factor 1)", "token_mean",
            "exact: a SUM reduction needs no W", (RAISES, None),
            unrun=NO_ADAPTER["torchtitan"],
            tried="torchtitan-0.3.0"),
    _recipe(torchtitan_ddp, "torchtitan DDP", "torchtitan",
            "#2206 on pure DDP, until #2458 (2026-03)",
            "torchtitan PR #2206 with apply_ddp (replicate averages); "
            "documented in PR #2323, fixed by PR #2458",
            "S / N", "mean", "world_scaled",
            "uniformly scaled by 1/W: DDP averages what was already a global mean",
            (ZERO_STEP, False),
            unrun=NO_ADAPTER["torchtitan"],
            tried="torchtitan-0.3.0"),
    _recipe(megatron_default, "Megatron default", "Megatron-LM",
            "default (calculate_per_token_loss=False)",
            "megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss "
            "(clamp: commit 1aef9f8eff)",
            "S / (M·max(n, 1))", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, True),
            unrun=NO_ADAPTER["Megatron-LM"]),
    _recipe(megatron_pre_clamp, "Megatron pre-clamp", "Megatron-LM",
            "default, 2024-05 to 2025-09 (before commit 1aef9f8eff)",
            "megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss "
            "(commits 795b45cc0e..1aef9f8eff)",
            "S / (M·n), S masked multiplicatively", "mean", "microbatch_means",
            "biased; one microbatch with n = 0 turns every gradient into NaN",
            (NAN, False),
            unrun=NO_ADAPTER["Megatron-LM"]),
    _recipe(megatron_per_token, "Megatron per-token", "Megatron-LM",
            "calculate_per_token_loss=True",
            "megatron/core/distributed/finalize_model_grads.py finalize_model_grads "
            "(commit 795b45cc0e)",
            "S", "sum, then grads × 1 / clamp(N, 1)", "token_mean",
            "exact: sums, then divides by the all-reduced count", (ZERO_STEP, True),
            unrun=NO_ADAPTER["Megatron-LM"]),
    _recipe(lightning, "Lightning", "PyTorch Lightning", "accumulate_grad_batches",
            "lightning loops/optimization/automatic.py "
            "ClosureResult.from_training_step_output (normalize)",
            "mean CE / M", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, False),
            real=[RealRun("lightning", ">=2.0")]),
    _recipe(nanogpt, "nanoGPT", "nanoGPT", "train.py (HEAD 3adf61e)",
            "karpathy/nanoGPT train.py (loss / gradient_accumulation_steps)",
            "(S / n) / M", "mean", "microbatch_means",
            "exact only while every n is equal (no masking)", (ZERO_STEP, False),
            unrun=NO_ADAPTER["nanoGPT"]),
    _recipe(deepspeed, "DeepSpeed", "DeepSpeed", "engine.backward, scale_wrt_gas=True",
            "deepspeed/runtime/engine.py DeepSpeedEngine.backward (_scale_loss_by_gas)",
            "(S / n) / M", "mean", "microbatch_means",
            "biased: a mean of microbatch means", (ZERO_STEP, False),
            unrun=NO_ADAPTER["DeepSpeed"]),
    # --- fine-tuning stacks (peer-recipes-rl.md) ---
    _recipe(axolotl, "axolotl", "axolotl", "since #2984 (2025-07), snapshot 067b021",
            "src/axolotl/core/builders/base.py (average_tokens_across_devices=False, "
            "PR #2984); user report axolotl#2262",
            "S / N_r (local window count)", "mean", "rank_means",
            "biased: each rank's own window mean, averaged over ranks", (ZERO_STEP, False),
            unrun=NO_ADAPTER["axolotl"]),
    _recipe(unsloth_count, "Unsloth", "Unsloth (unsloth-zoo)",
            "unsloth 015bdef, unsloth-zoo ce232d6; a model whose loss_type resolves to "
            "ForCausalLMLoss (Llama)",
            "unsloth_zoo/loss_utils.py _unsloth_get_batch_samples (patched by "
            "unsloth/models/_utils.py patch_gradient_accumulation_fix; #1134, #1146)",
            "W·S / N", "mean", "token_mean",
            "exact: the count after the shift, gathered over the ranks", (ZERO_STEP, False),
            real=[RealRun("unsloth", ">=5.10.1", _LLAMA, package="transformers")]),
    _recipe(llamafactory_v1, "LLaMA-Factory v1", "LLaMA-Factory",
            "v1 trainer, snapshot ff6d4d1",
            "src/llamafactory/v1/core/base_trainer.py fit (#9752), compute_loss "
            "(loss_weights[..., 1:])",
            "(S / n) · (n + R_m) · W / (N + R)", "mean", "llamafactory_v1",
            "biased: each microbatch weighs (n + R_m) / n, counted before the shift; "
            "exact when every n is equal", (ZERO_STEP, False),
            unrun=NO_ADAPTER["LLaMA-Factory"]),
    _recipe(torchtune_distributed, "torchtune", "torchtune",
            "full_finetune_distributed, snapshot bd2a0fc",
            "recipes/full_finetune_distributed.py (all_reduce(num_tokens), "
            "scale_grads(world_size / num_tokens)); PRs #1875, #1917, #2687",
            "S", "mean, then grads × W / N", "token_mean",
            "exact; an empty window divides zero gradients by 0", (NAN, True),
            unrun=NO_ADAPTER["torchtune"], tried="torchtune-0.6.1"),
    # --- RL stacks: advantage-weighted, at importance ratio 1 (rl_recipes) ---
    _recipe(rl.trl_grpo_dapo, "TRL GRPO dapo", TRL_GRPO[0],
            "1.16.0, loss_type dapo (the default), steps_per_generation = GA",
            f"{TRL_GRPO[1]} (num_items_in_batch over the generation batch); "
            "PR #3938; PR #6024 (x GA / steps_per_generation)",
            "A·S·W / N_gen", "mean", "token_mean",
            "exact: the generation batch is the window", (ZERO_STEP, True),
            policy=True, loss_runs=("trl-1.16.0/dapo/spg=ga",)),
    _recipe(rl.trl_grpo_dapo_spg2, "TRL GRPO dapo, spg=2GA", TRL_GRPO[0],
            "1.16.0 (with PR #6024), loss_type dapo, steps_per_generation = 2 GA",
            f"{TRL_GRPO[1]}; PR #6024 (issue #5619)",
            "A·S·W / (N_gen / 2), N_gen: 2 windows", "mean", "generation_tokens",
            "uniformly scaled by 2 N / N_gen: the average window count, not its own",
            (ZERO_STEP, True), policy=True, generation=2,
            loss_runs=("trl-1.16.0/dapo/spg=2ga",)),
    _recipe(rl.trl_grpo_bnpo, "TRL GRPO bnpo", TRL_GRPO[0],
            "0.19.1 (its default) and 1.16.0, loss_type bnpo",
            f"{TRL_GRPO[1]} (bnpo); grpo_config.py loss_type help ('the local batch')",
            "A·S / (M·n)", "mean", "microbatch_means",
            "exact for its claim, a mean of local-batch means; biased for the token mean",
            (ZERO_STEP, True), claims="microbatch_means", policy=True,
            loss_runs=("trl-0.19.1/bnpo", "trl-1.16.0/bnpo")),
    _recipe(rl.trl_grpo_grpo, "TRL GRPO grpo", TRL_GRPO[0],
            "0.19.1 and 1.16.0, loss_type grpo",
            f"{TRL_GRPO[1]} (grpo: per-sequence mean, then mean over sequences)",
            "A·(row means) / (B·M)", "mean", "trl_sequence_means",
            "exact for its claim, the sequence-level mean; biased for the token mean",
            (ZERO_STEP, True), claims="sequence_means", policy=True,
            loss_runs=("trl-0.19.1/grpo", "trl-1.16.0/grpo")),
    _recipe(rl.trl_grpo_dr_grpo, "TRL GRPO dr_grpo", TRL_GRPO[0],
            "0.19.1 and 1.16.0, loss_type dr_grpo",
            f"{TRL_GRPO[1]} (dr_grpo); 'Understanding R1-Zero-Like Training' (Dr. GRPO)",
            f"A·S / (B·{MAX_COMPLETION_LENGTH}·M)", "mean", "trl_constant",
            "exact for its claim, C = B_window x max length; uniformly scaled "
            "by N / C for the token mean", (ZERO_STEP, True), claims="constant",
            policy=True, loss_runs=("trl-0.19.1/dr_grpo", "trl-1.16.0/dr_grpo")),
    _recipe(rl.verl_token_mean, "verl token-mean", "verl", "engine path, snapshot 1dda039",
            "verl/trainer/ppo/core_algos.py agg_loss (token-mean); "
            "workers/engine/fsdp/transformer_impl.py forward_backward_batch; PR #5366",
            "A·S·dp / N", "mean", "token_mean", EXACT.value, (ZERO_STEP, False),
            policy=True, unrun=NO_ADAPTER["verl"]),
    _recipe(rl.verl_seq_mean_token_mean, "verl seq-mean-token-mean", "verl",
            "engine path, snapshot 1dda039",
            "verl/trainer/ppo/core_algos.py agg_loss (seq-mean-token-mean)",
            "A·(row means)·dp / non-empty seqs", "mean", "sequence_means",
            "exact for its claim, the sequence-level mean; biased for the token mean",
            (ZERO_STEP, False), claims="sequence_means", policy=True,
            unrun=NO_ADAPTER["verl"]),
    _recipe(rl.verl_seq_mean_token_sum, "verl seq-mean-token-sum", "verl",
            "engine path, snapshot 1dda039",
            "verl/trainer/ppo/core_algos.py agg_loss (seq-mean-token-sum)",
            "A·S·dp / non-empty seqs", "mean", "sequence_sums",
            "exact for its claim, the mean of sequence sums; uniformly scaled by "
            "N / sequences for the token mean", (ZERO_STEP, False),
            claims="sequence_sums", policy=True, unrun=NO_ADAPTER["verl"]),
    _recipe(rl.verl_dp_actor_legacy, "verl dp_actor (legacy)", "verl",
            "workers/actor/dp_actor.py, deprecated in #5604, removed in #6067 (2026-04)",
            "verl/workers/actor/dp_actor.py (no global count), verl_F.masked_mean; "
            "issue #5625",
            "A·S / ((n + 1e-8)·M)", "mean", "microbatch_means",
            "biased: a mean of micro-batch means, though it claims token-mean",
            (ZERO_STEP, True), policy=True, unrun=NO_ADAPTER["verl"]),
    _recipe(rl.openrlhf_window, "OpenRLHF", "OpenRLHF", "since PR #1249 (2026-06)",
            "openrlhf/models/loss.py aggregate_loss; openrlhf/utils/loss_utils.py "
            "iter_grad_accum_global_norm (batch_num_tokens = N / GAS)",
            "A·S·W / (N / M), then DeepSpeed / M", "mean", "token_mean", EXACT.value,
            (ZERO_STEP, False), policy=True, unrun=NO_ADAPTER["OpenRLHF"]),
    _recipe(rl.nemo_rl, "NeMo-RL", "NeMo-RL", "snapshot 7ea279a",
            "masked_mean(global_normalization_factor=global_valid_toks); "
            "nemo_rl/models/automodel/data.py; docs/design-docs/loss-functions.md",
            "A·S·dp / N", "mean", "token_mean", EXACT.value, (ZERO_STEP, False),
            policy=True, unrun=NO_ADAPTER["NeMo-RL"]),
)}


# The recipes chapter 08 reads and runs, one per family of outcome; every row
# of RECIPES is in docs/recipes.md (``course.recipes_page``).
REPRESENTATIVE = ("fairseq", "hf_trainer_le_4_45", "hf_trainer_4_46_0", "accelerate_docs",
                  "torchtitan_ddp", "torchtitan_fsdp", "megatron_pre_clamp",
                  "megatron_per_token")

# --- predictions: pure functions of the window's counts ------------------------------------


@dataclass(frozen=True)
class WindowShape:
    """The counts of one window that decide what each recipe trains."""

    microbatch_tokens: list[list[int]]  # [rank][micro] -> n
    first_label_rows: int  # R: rows whose first label is not -100
    rank_first_label_rows: tuple[int, ...] = ()  # R_r per rank; () when unknown (0s)
    # [rank][micro] -> each row's n, and R_m: the rows' counts (``row_weights``).
    row_tokens: tuple[tuple[tuple[int, ...], ...], ...] = ()
    microbatch_first_rows: tuple[tuple[int, ...], ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.microbatch_tokens)

    @property
    def local_tokens(self) -> list[int]:
        return [sum(rank) for rank in self.microbatch_tokens]

    @property
    def tokens(self) -> int:
        return sum(self.local_tokens)

    @property
    def rows(self) -> int:
        return sum(len(rows) for rank in self.row_tokens for rows in rank)


def window_shape(microbatches_per_rank: Sequence[Sequence[Microbatch]]) -> WindowShape:
    """Counts from every rank's microbatches (labels only)."""
    first = tuple(tuple(int(count_tokens(lb[:, :1])) for _, lb in rank)
                  for rank in microbatches_per_rank)
    rows = tuple(sum(rank) for rank in first)
    return WindowShape(
        [[int(count_tokens(lb)) for _, lb in rank] for rank in microbatches_per_rank],
        sum(rows), rows,
        tuple(tuple(tuple(int(n) for n in supervised_mask(lb).sum(dim=-1)) for _, lb in rank)
              for rank in microbatches_per_rank),
        first)


@dataclass(frozen=True)
class Prediction:
    verdict: Verdict
    factor: float | None = None  # the uniform scale, when there is one


def predict(objective: str, shape: WindowShape) -> Prediction:
    """What a recipe with this effective objective gives on this window."""
    if objective == "token_mean":
        return Prediction(EXACT)
    if objective == "microbatch_means":
        counts = {n for rank in shape.microbatch_tokens for n in rank}
        return Prediction(EXACT if len(counts) == 1 else BIASED)
    if objective == "rank_means":
        return Prediction(EXACT if len(set(shape.local_tokens)) == 1 else BIASED)
    if objective == "world_scaled":
        w = shape.world_size
        return Prediction(EXACT) if w == 1 else Prediction(SCALED, 1.0 / w)
    if objective == "shift_scaled":
        return _shift_scaled(shape)
    if objective == "rank_means_pre_shift":  # exact or scaled only on equal N_r + R_r
        rows = shape.rank_first_label_rows or (0,) * shape.world_size
        totals = {n + r for n, r in zip(shape.local_tokens, rows, strict=True)}
        return _shift_scaled(shape) if len(totals) == 1 else Prediction(BIASED)
    if objective == "microbatch_sums":  # M times the token mean when every n is equal
        counts = {n for rank in shape.microbatch_tokens for n in rank}
        steps = len(shape.microbatch_tokens[0])
        if len(counts) > 1:
            return Prediction(BIASED)
        return Prediction(EXACT) if steps == 1 else Prediction(SCALED, float(steps))
    raise ValueError(f"unknown objective {objective!r}")


def _shift_scaled(shape: WindowShape) -> Prediction:
    n, r = shape.tokens, shape.first_label_rows
    return Prediction(EXACT) if r == 0 else Prediction(SCALED, n / (n + r))


# --- predictions from the rows' counts: each token's weight in the gradient --------------


def row_weights(objective: str, shape: WindowShape, generation: int = 1) -> list[float]:
    """Each row's weight per token, d loss / d (A l) of any of its tokens, in
    rank, microbatch, row order: a pure function of the counts (the
    advantages factor out). Rows outside the trained part (the first
    1/generation of each rank's microbatches) weigh 0; so do empty ones."""
    world, length = shape.world_size, MAX_COMPLETION_LENGTH
    ranks = shape.row_tokens
    trained = [rank[:len(rank) // generation] for rank in ranks]
    mbs = [(r, m, rows) for r, rank in enumerate(trained) for m, rows in enumerate(rank)]
    tokens = sum(sum(rows) for *_, rows in mbs)
    everything = sum(sum(rows) for rank in ranks for rows in rank)
    first = sum(shape.microbatch_first_rows[r][m] for r, m, _ in mbs)
    sequences = sum(1 for *_, rows in mbs for n in rows if n > 0)
    completions = sum(len(rows) for *_, rows in mbs)
    local = [sum(sum(rows) for rows in rank) for rank in trained]
    per_row = {
        "token_mean": lambda r, m, rows, n: 1 / tokens,
        "microbatch_means": lambda r, m, rows, n: 1 / (sum(rows) * len(mbs)),
        "rank_means": lambda r, m, rows, n: 1 / (world * local[r]),
        "generation_tokens": lambda r, m, rows, n: generation / everything,
        "trl_sequence_means": lambda r, m, rows, n: 1 / (n * len(rows) * len(mbs)),
        "sequence_means": lambda r, m, rows, n: 1 / (n * sequences),
        "sequence_sums": lambda r, m, rows, n: 1 / sequences,
        "trl_constant": lambda r, m, rows, n: 1 / (len(rows) * length * len(mbs)),
        "constant": lambda r, m, rows, n: 1 / (completions * length),
        "llamafactory_v1": lambda r, m, rows, n: (
            (sum(rows) + shape.microbatch_first_rows[r][m]) / (sum(rows) * (tokens + first))),
    }[objective]
    weights = {(r, m): [per_row(r, m, rows, n) if n else 0.0 for n in rows]
               for r, m, rows in mbs}
    return [w for r, rank in enumerate(ranks) for m, rows in enumerate(rank)
            for w in weights.get((r, m), [0.0] * len(rows))]


ROW_OBJECTIVES = ("token_mean", "microbatch_means", "rank_means", "generation_tokens",
                  "trl_sequence_means", "sequence_means", "sequence_sums", "trl_constant",
                  "constant", "llamafactory_v1")


def predict_rows(objective: str, reference: str, shape: WindowShape,
                 generation: int = 1) -> Prediction:
    """A gradient sum_t w_t A_t grad l_t against the reference's w*_t: exact
    when every supervised row's weight is the reference's, uniformly scaled
    when they all share one ratio, biased otherwise."""
    got = row_weights(objective, shape, generation)
    want = row_weights(reference, shape, generation)
    counts = [n for rank in shape.row_tokens for rows in rank for n in rows]
    ratios = []
    for g, w, n in zip(got, want, counts, strict=True):
        if n and (g == 0 or w == 0):
            if g != w:
                return Prediction(BIASED)
        elif n:
            ratios.append(g / w)
    if all(abs(r - 1) <= TOLERANCE.row for r in ratios):  # no supervised row: nothing differs
        return Prediction(EXACT)
    if max(ratios) - min(ratios) <= TOLERANCE.row * abs(ratios[0]):
        return Prediction(SCALED, ratios[0])
    return Prediction(BIASED)


def predictions(recipe: Recipe, shape: WindowShape) -> tuple[Prediction, Prediction]:
    """(against the token mean, against the recipe's claim). The first table's
    objectives keep ``predict``; the others come from the rows' counts."""
    if recipe.objective in ROW_OBJECTIVES and (recipe.objective not in _COUNT_OBJECTIVES
                                               or recipe.generation != 1):
        token = predict_rows(recipe.objective, "token_mean", shape, recipe.generation)
    else:
        token = predict(recipe.objective, shape)
    if recipe.claims == "token_mean":
        return token, token
    return token, predict_rows(recipe.objective, recipe.claims, shape, recipe.generation)


# The objectives ``predict`` knows from the window's counts alone.
_COUNT_OBJECTIVES = ("token_mean", "microbatch_means", "rank_means", "world_scaled",
                     "shift_scaled", "rank_means_pre_shift", "microbatch_sums")


def trains_the_token_mean(name: str) -> bool:
    """True when the recipe's gradient is the global token mean's on any window."""
    return RECIPES[name].objective == "token_mean"


# --- measurements: a gradient against the reference ---------------------------------------
# ``classify`` (core.verdicts) measures it; a match is the verdict, and the scale too.


def matches(measured: Measured, predicted: Prediction,
            factor_rtol: float = TOLERANCE.factor) -> bool:
    if measured.verdict != predicted.verdict:
        return False
    if predicted.verdict == SCALED:
        if measured.factor is None or predicted.factor is None:
            return False
        return abs(measured.factor / predicted.factor - 1.0) <= factor_rtol
    return True


def empty_outcome(raised: bool, grads: Sequence[torch.Tensor]) -> EmptyOutcome:
    """raises, NaN (any non-finite component on any rank), zero step, or
    nonzero step (a gradient from no token: never expected)."""
    if raised:
        return RAISES
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        return NAN
    if all(not bool(g.any()) for g in grads):
        return ZERO_STEP
    return EmptyOutcome.NONZERO_STEP
