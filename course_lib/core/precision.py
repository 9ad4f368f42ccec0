"""Where lower precision changes the course's sums and counts.

The course's step on the parity window, every rank's share in this process,
and DDP's average as its all-reduce computes it (the sum of the ranks'
gradients in the gradients' dtype, divided by W), in three precisions:

- ``float32``: the course's default;
- ``autocast_bf16``: float32 weights, the forward under CPU autocast to
  bfloat16 (the matmuls run in bf16, the cross-entropy in float32);
- ``bf16_weights``: the model cast to bfloat16: logits, per-token losses,
  their sum S_r and the gradients are bf16, and so is the all-reduce.

Each is held to the float64 reference, for the course's rule and for the
mean of means. The count N itself is an integer and exact in every mode; a
count accumulated in the model's dtype is not: a bf16 sum of 2,283 ones
rounds to a multiple of 16.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.core.config import Config
from course_lib.core.data import Corpus, collate, parity_window
from course_lib.core.model import build_model, count_tokens, loss_sum, supervised_mask
from course_lib.core.normalize import MODES as RULES
from course_lib.core.reference import compare, flat_grad, reference_gradient

MODES = ("float32", "autocast_bf16", "bf16_weights")


def _setup(mode: str, model: torch.nn.Module
           ) -> tuple[torch.nn.Module, contextlib.AbstractContextManager[Any]]:
    if mode == "float64":  # the exact sums, for comparison
        return model.double(), contextlib.nullcontext()
    if mode == "float32":
        return model.float(), contextlib.nullcontext()
    if mode == "autocast_bf16":
        return model.float(), torch.autocast("cpu", dtype=torch.bfloat16)
    if mode == "bf16_weights":
        return model.to(torch.bfloat16), contextlib.nullcontext()
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


@dataclass(frozen=True)
class Rule:
    """One normalization in one precision, against the float64 reference."""

    max_abs_err: float
    violations: int
    passes: bool  # within the parity check's atol and rtol


@dataclass(frozen=True)
class PrecisionRow:
    mode: str
    global_token: Rule
    mean_of_means: Rule
    loss_sums: list[float]  # each rank's S_r, as this precision computes it
    loss_sums_float64: list[float]


def ddp_gradient(cfg: Config, corpus: Corpus, mode: str, rule: str,
                 world_size: int = 2) -> tuple[torch.Tensor, list[float]]:
    """DDP's averaged gradient of the parity window under ``rule``
    ("global_token": W S_r / N; "mean_of_means": S_r / N_r), and each rank's
    S_r, with every rank's share computed in this process."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    window = parity_window(cfg, corpus, world_size)
    micro = [[collate(corpus, ids, r not in cfg.train.empty_ranks) for ids in window[r]]
             for r in range(world_size)]
    counts = [int(sum(count_tokens(labels) for _, labels in m)) for m in micro]
    n = sum(counts)
    base = build_model(cfg).eval()
    grads, sums = [], []
    for r, mbs in enumerate(micro):
        model, autocast = _setup(mode, copy.deepcopy(base))
        model.zero_grad(set_to_none=True)
        s_r = torch.zeros((), dtype=next(model.parameters()).dtype)
        for inputs, labels in mbs:
            with autocast:
                s = loss_sum(model(inputs), labels)
            scale = world_size / n if rule == "global_token" else 1.0 / counts[r]
            (s * scale).backward()
            s_r = s_r + s.detach().to(s_r.dtype)
        grads.append(flat_grad(model))
        sums.append(float(s_r))
    total = grads[0].clone()
    for g in grads[1:]:
        total += g  # in the gradients' dtype, as the all-reduce adds them
    return (total / world_size).to(torch.float64), sums


@dataclass(frozen=True)
class Count:
    exact: int  # N, an int64 sum of the supervised mask
    bfloat16: float  # the same mask summed as bf16
    float16: float


@dataclass(frozen=True)
class Precision:
    rows: list[PrecisionRow]
    count: Count


def measure(cfg: Config, corpus: Corpus, world_size: int = 2,
            modes: tuple[str, ...] = MODES) -> Precision:
    """Each mode's gradients and sums on the parity window, and its count."""
    window = parity_window(cfg, corpus, world_size)
    every = [collate(corpus, ids, r not in cfg.train.empty_ranks)
             for r in range(world_size) for ids in window[r]]
    reference, n, _ = reference_gradient(build_model(cfg, torch.float64).eval(), every)
    _, exact_sums = ddp_gradient(cfg, corpus, "float64", "global_token", world_size)
    rows = []
    for mode in modes:
        rules: dict[str, Rule] = {}
        sums: list[float] = []
        for rule in RULES:
            grad, got = ddp_gradient(cfg, corpus, mode, rule, world_size)
            c = compare(grad, reference, cfg.parity.atol, cfg.parity.rtol)
            rules[rule] = Rule(float("nan") if c.max_abs_err is None else c.max_abs_err,
                               c.violations, c.allclose)
            sums = sums or got
        rows.append(PrecisionRow(mode, rules["global_token"], rules["mean_of_means"],
                                 sums, exact_sums))
    mask = torch.cat([supervised_mask(labels).flatten() for _, labels in every])
    return Precision(rows, Count(n, float(mask.to(torch.bfloat16).sum()),
                                 float(mask.to(torch.float16).sum())))
