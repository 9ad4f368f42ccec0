"""TRL GRPO's real loss function, on one process, against the recipes'
re-implementation (``steps.rl_recipes.trl_grpo_loss``).

Not a training loop: ``GRPOTrainer._compute_loss`` of the installed TRL is
called on a trainer object built without ``__init__`` (no model download,
no generation, no vLLM), holding only the attributes the loss reads, and
handed the per-token log-probs of the course's model (float64) in place of
its own forward (``_get_per_token_logps_and_entropies`` in 1.x,
``_get_per_token_logps`` in 0.19). The inputs are one microbatch of the
parity window: completion mask = the supervised labels, one synthetic
advantage per completion (``rl_recipes.completion_advantages``), old
log-probs = the current ones (ratio 1, nothing clipped), beta 0.

TRL 0.19 divides by GA outside ``_compute_loss`` (``Trainer.training_step``,
``model_accepts_loss_kwargs`` False; accelerate gets num_steps 1): that
division is applied after the call, and the row says so. TRL is imported
inside the functions, like every adapter here. The whole trainer, on every
rank under torchrun, is ``trl_grpo_trainer``'s.
"""

from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from course_lib.core.verdicts import Verdict
from course_lib.frameworks.evidence import NO_LOSS_TYPE, LossRun

WORLD = 2  # accelerator.num_processes: the dapo normalizer divides by it
RTOL, ATOL = 1e-10, 1e-12  # float64 on both sides


class _Accelerator:
    """What the loss asks of accelerate on one process: the identity."""

    num_processes = WORLD
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    gather_for_metrics = gather


def _trainer(cls: type, loss_type: str, ga: int, spg: int, logps: torch.Tensor,
             max_completion_length: int) -> Any:
    t: Any = object.__new__(cls)
    t.__dict__.update(
        loss_type=loss_type, beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
        max_completion_length=max_completion_length, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token",
        use_vllm=False, vllm_importance_sampling_correction=False, use_liger_loss=False,
        aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=ga, accelerator=_Accelerator(),
        model=torch.nn.Module().train(),  # "train" mode: GA and spg apply
        _metrics={"train": collections.defaultdict(list),
                  "eval": collections.defaultdict(list)},
        args=types.SimpleNamespace(delta=None, steps_per_generation=spg,
                                   use_bias_correction_kl=False,
                                   gradient_accumulation_steps=ga))
    entropies = torch.zeros_like(logps)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    t._get_per_token_logps = lambda *a, **k: logps
    return t


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])  # type: ignore[union-attr]


def compare_all(cases: dict[str, tuple[str, int, int]],
                aggregate: Callable[..., torch.Tensor] | None = None) -> list[LossRun]:
    """Each case (key suffix -> loss_type, GA, steps_per_generation) against
    the installed TRL, one ``LossRun`` each. ``aggregate``
    replaces the re-implementation (a test passes a wrong one)."""
    import trl
    from packaging.version import Version
    from trl.trainer.grpo_trainer import GRPOTrainer

    from course_lib.core import paths
    from course_lib.core.config import load
    from course_lib.core.data import collate, load_corpus, locate, parity_window
    from course_lib.core.model import build_model, supervised_mask
    from course_lib.steps import rl_recipes as rl

    aggregate = aggregate or rl.trl_grpo_loss
    torch.manual_seed(0)
    cfg = load(paths.config_path("minimum"))
    corpus = load_corpus(cfg, locate(cfg, paths.data_dir()))
    window = [collate(corpus, ids) for rank in parity_window(cfg, corpus, WORLD)
              for ids in rank]
    inputs, labels = window[-1]  # long sequences of uneven lengths
    tokens = torch.tensor(sum(int(supervised_mask(lb).sum()) for _, lb in window))
    model = build_model(cfg, dtype=torch.float64).eval()
    version = trl.__version__
    new = Version(version) >= Version("1.0")
    source = Path(sys.modules[GRPOTrainer.__module__].__file__ or "").read_text()
    mask = supervised_mask(labels)
    adv = rl.completion_advantages(labels)  # (B,), as TRL's inputs hold them
    rows: list[LossRun] = []
    for suffix, (loss_type, ga, spg) in cases.items():
        row: dict[str, Any] = dict(
            key=f"trl-{version}/{suffix}", entry=f"trl-{version}", loss_type=loss_type,
            accumulation=ga, steps_per_generation=spg, world_size=WORLD, version=version)
        if f'"{loss_type}"' not in source:
            rows.append(LossRun(**row, status=Verdict.NOT_RUN.value,
                                reason=NO_LOSS_TYPE.format(version=version,
                                                           loss_type=loss_type)))
            continue
        model.zero_grad(set_to_none=True)
        logps = torch.log_softmax(model(inputs), -1).gather(
            -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        batch = {"prompt_ids": inputs[:, :0], "prompt_mask": mask[:, :0].long(),
                 "completion_ids": labels.clamp(min=0), "completion_mask": mask.long(),
                 "advantages": adv, "old_per_token_logps": None,
                 "num_items_in_batch": tokens}
        trainer = _trainer(GRPOTrainer, loss_type, ga, spg, logps, rl.MAX_COMPLETION_LENGTH)
        loss = GRPOTrainer._compute_loss(trainer, model, batch)
        applied = f"trl {version} GRPOTrainer._compute_loss"
        if not new:
            loss = loss / ga
            applied += ", then / GA (Trainer.training_step)"
        loss.backward()
        g_trl = _grads(model)
        kw: dict[str, Any] = dict(generation_steps=spg, generation_tokens=tokens,
                                  world_size=WORLD)
        # The value, on TRL's per-token terms: -A x ratio, ratio = exp(logp - logp.detach()).
        terms = -adv.unsqueeze(1) * torch.exp(logps - logps.detach())
        value = aggregate(loss_type, terms.detach(), mask.double(), ga, **kw)
        # The gradient, as the recipe backprops it: A-weighted cross-entropy.
        model.zero_grad(set_to_none=True)
        aggregate(loss_type, *rl.policy_terms(model(inputs), labels), ga, **kw).backward()
        g_mine = _grads(model)
        rows.append(LossRun(
            **row, status="run", entry_point=applied, loss_trl=float(loss.detach()),
            loss_mine=float(value),
            loss_allclose=bool(torch.allclose(loss.detach(), value.detach(),
                                              rtol=RTOL, atol=ATOL)),
            grad_max_abs_diff=float((g_trl - g_mine).abs().max()),
            grad_allclose=bool(torch.allclose(g_trl, g_mine, rtol=RTOL, atol=ATOL))))
    return rows
