"""TRL's real ``GRPOTrainer`` (and ``RLOOTrainer``), one optimizer step on
every rank under torchrun, against what its loss claims across the ranks.

``frameworks.trl_grpo`` calls the loss function alone, on one process: no
rank count can show there. Here the whole trainer runs, as a learner runs
it, on each rank of the course's torchrun job (``jobs.trl_grpo``): a tiny
model built from a config (``models.build``), the course's word-level
tokenizer, prompts of a few words, generation on the CPU by transformers'
``generate`` (no vLLM), a fixed reward (each completion's length, so a group
of completions of different lengths has advantages), ``num_iterations=1``
(the importance ratio is 1), DDP on gloo. The vocabulary holds the pad/EOS
token and three words, so EOS is drawn often and the completions, and each
rank's completion tokens, differ in length.

What each rank was fed is recorded where the Trainer hands it to the loss:
``Trainer.training_step`` calls ``self.compute_loss(model, inputs, ...)``,
and an instance attribute of that name wraps the trainer's own method
(``HOOKED`` finds both lines in the installed code). The gradient is the
one DDP left on every rank at the optimizer step
(``hf.capture_callback``). Rank 0 then rebuilds, in float64 from the
initial weights and every rank's record, the per-token policy terms
-A x ratio (ratio = exp(logp - logp.detach()), as TRL writes them), and the
gradient of each objective of ``OBJECTIVES`` over all of them: the global
token mean, the claim of the loss type (``CLAIMS``), and the others, so the
row says which one the trainer trained.
"""

from __future__ import annotations

import ast
import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_lib.core.reference import flat_grad as reference_flat_grad
from course_lib.core.verdicts import TOLERANCE, Verdict, classify
from course_lib.frameworks import installed
from course_lib.frameworks.evidence import RankResult, TrainerRow
from course_lib.steps import rl_recipes
from course_lib.steps.recipes import RECIPES

# Per component, the trainer's float32 gradient against the float64
# reference: |g - g*| <= ATOL x max|g*| + RTOL x |g*|. Rounding measured
# near 1e-6 of max|g*|; two objectives of the record differ by 1e-2 or more.
RTOL, ATOL = 1e-4, 1e-5
PRECISION = "float32"
GRPO, RLOO = "grpo", "rloo"
FRAMEWORK = {GRPO: "trl_grpo", RLOO: "trl_rloo"}
# A local token mean per rank: not an RL stack's claim (rl_recipes.CLAIMS),
# but what a rank-local count trains when each rank runs one microbatch.
RANK_MEANS = "rank_means"
OBJECTIVES = (*rl_recipes.CLAIMS, RANK_MEANS)
DESCRIPTIONS = {**rl_recipes.CLAIMS,
                RANK_MEANS: "a mean of rank-local token means: each rank's sum A l / N_r, "
                            "averaged over the ranks"}


@dataclass(frozen=True)
class Case:
    """One trainer, one loss type (``""`` for RLOO, which has none)."""

    trainer: str  # GRPO or RLOO
    loss_type: str = ""

    @property
    def name(self) -> str:
        return f"{self.trainer}/{self.loss_type}" if self.loss_type else self.trainer


@dataclass(frozen=True)
class Shape:
    """What every rank runs: GA microbatches of ``batch_size`` completions,
    ``generations`` completions per prompt, one generation per step."""

    microbatches: int = 2  # gradient_accumulation_steps (= steps_per_generation)
    batch_size: int = 2  # per_device_train_batch_size: completions a microbatch
    generations: int = 4  # num_generations
    max_completion_length: int = 8
    prompt_length: int = 4  # words a prompt; every prompt as long: no left padding
    prompts: int = 8
    vocab: int = 4  # <pad> (also EOS) and three words
    model: str = "llama"
    seed: int = 1234


@dataclass(frozen=True)
class Fed:
    """One microbatch as the trainer handed it to its loss, on one rank."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor  # (B,): one per completion
    num_items_in_batch: int | None  # GRPO's count of the generation batch, all ranks

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.completion_mask.sum(-1)]


@dataclass
class Trained:
    grad: torch.Tensor  # this rank's flat gradient after DDP, at the optimizer step
    fed: list[Fed] = field(default_factory=list)


# --- what the installed TRL offers ----------------------------------------------------


# What ``prepare`` imports beyond the HF Trainer's: the agent server's preload.
MODULES = ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer", "datasets")


def loss_types() -> tuple[str, ...]:
    """Every ``loss_type`` the installed ``GRPOTrainer._compute_loss`` branches
    on (``self.loss_type == "x"`` or ``in [...]``), in order of first
    appearance, read from its source; () without TRL."""
    if installed("trl") is None:
        return ()
    from trl.trainer import grpo_trainer

    text = inspect.getsource(grpo_trainer)
    found: dict[str, None] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "_compute_loss":
            for test in ast.walk(node):
                if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Attribute)
                        and test.left.attr == "loss_type"):
                    for right in test.comparators:
                        values = right.elts if isinstance(right, (ast.List, ast.Tuple)) \
                            else [right]
                        found.update({v.value: None for v in values
                                      if isinstance(v, ast.Constant)
                                      and isinstance(v.value, str)})
            break
    return tuple(found)


def has_rloo() -> bool:
    if installed("trl") is None:
        return False
    import trl

    return hasattr(trl, "RLOOTrainer")


def default_case() -> Case:
    """The GRPOTrainer with the loss type GRPOConfig defaults to (dapo in
    TRL 1.16.0): the case a quick run and its test share."""
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    return Case(GRPO, str(fields["loss_type"].default))


def cases() -> list[Case]:
    """Each loss type of the installed GRPOTrainer, then the RLOOTrainer."""
    return [*(Case(GRPO, t) for t in loss_types()), *([Case(RLOO)] if has_rloo() else [])]


# --- what each loss type claims --------------------------------------------------------

# Loss types the course has no recipe for: the claim in GRPOConfig's help for
# loss_type (TRL 1.16.0), or None where the help states no aggregation.
HELP_CLAIMS: dict[str, tuple[str | None, str]] = {
    "cispo": ("token_mean", "GRPOConfig help: 'normalizing with the number of active "
                            "tokens in the global accumulated batch'"),
    "luspo": ("sequence_sums", "GRPOConfig help: 'scales each sequence's loss by its "
                               "length' (a sequence mean of token means x length)"),
    "sapo": (None, "GRPOConfig help: a soft gate in place of clipping; no aggregation "
                   "stated"),
    "vespo": (None, "GRPOConfig help: Gamma weights on sequence-level ratios; no "
                    "aggregation stated"),
}
RLOO_CLAIM = ("sequence_sums", "the RLOO estimator that rloo_trainer.py cites (Ahmadian "
                               "et al., 2024): (1/k) sum_i A_i grad log pi(y_i), a "
                               "completion's log-prob summed over its tokens")


def claim(case: Case) -> tuple[str | None, str]:
    """(a key of ``rl_recipes.CLAIMS`` or None, where the claim is written):
    the course's recipe of that loss type where it has one (its ``claims``)."""
    if case.trainer == RLOO:
        return RLOO_CLAIM
    recipe = RECIPES.get(f"trl_grpo_{case.loss_type}")
    if recipe is not None:
        return recipe.claims, f"steps/recipes.py RECIPES[{recipe.name!r}].claims"
    return HELP_CLAIMS.get(case.loss_type, (None, f"no claim recorded for "
                                                  f"loss_type {case.loss_type!r}"))


def flags(case: Case, shape: Shape) -> dict[str, Any]:
    """The config's flags beyond the shared ones: the loss type, and what
    TRL requires or recommends for it."""
    found: dict[str, Any] = {"loss_type": case.loss_type} if case.loss_type else {}
    if case.loss_type == "luspo":  # GRPOTrainer refuses luspo at token level
        found["importance_sampling_level"] = "sequence"
    if case.loss_type == "cispo":
        # The help's recommended ε_max: the default (ε = 0.2) caps the ratio 1
        # at 0.2, a uniform x0.2 on the gradient.
        found["epsilon_high"] = 5.0
    if case.trainer == RLOO:
        # RLOOConfig's default beta (0.05) loads a reference model by the
        # policy's name: a download. At the first step its KL is 0 anyway.
        found["beta"] = 0.0
    return found


# --- one rank: the trainer, trained ----------------------------------------------------

# Where the record is taken, found in the installed code (frameworks.source):
# the Trainer's call the wrapper intercepts, and the loss reading what it records.
HOOKED = (("Trainer.training_step", "loss = self.compute_loss("),
          ("GRPOTrainer._compute_loss", 'completion_ids, completion_mask = inputs['),
          ("GRPOTrainer._compute_loss", 'advantages = inputs["advantages"]'))


def hooked() -> list[str]:
    """Where the record is taken: ``file:line in function``, each found
    in the installed code (or "not found")."""
    from course_lib.frameworks import source

    found = []
    for function, fragment in HOOKED:
        line = source.find(source.Wanted(function, (function,), (fragment,)))
        found.append(f"{line.where}: {line.code[0]}" if line else f"{function}: not found")
    return found


def _reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
    """Each completion's length: deterministic, and different within a group."""
    return [float(len(ids)) for ids in completion_ids]


def prompts(shape: Shape) -> list[str]:
    """Distinct prompts of ``prompt_length`` words each (no padding)."""
    words = shape.vocab - 1
    return [" ".join(str(1 + (i + j * (i + 1)) % words) for j in range(shape.prompt_length))
            for i in range(shape.prompts)]


def config_kwargs(case: Case, shape: Shape, workdir: Path, backend: str) -> dict[str, Any]:
    """One optimizer step, plain SGD, no clipping, no logging, float32."""
    return dict(
        output_dir=str(workdir), per_device_train_batch_size=shape.batch_size,
        gradient_accumulation_steps=shape.microbatches, num_generations=shape.generations,
        max_completion_length=shape.max_completion_length, num_iterations=1, max_steps=1,
        learning_rate=0.1, lr_scheduler_type="constant", optim="sgd", max_grad_norm=0.0,
        use_cpu=True, ddp_backend=backend, bf16=False, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        seed=shape.seed, **flags(case, shape))


def prepare(case: Case, shape: Shape, workdir: Path, backend: str = "gloo"
            ) -> tuple[Callable[[], Trained], torch.nn.Module]:
    """Build the trainer on this rank (a refused configuration raises here,
    before any collective); returns the training call and a copy of the
    initial model."""
    from datasets import Dataset

    from course_lib.frameworks import models
    from course_lib.frameworks.hf import capture_callback
    from course_lib.frameworks.tokenizer import word_level

    if case.trainer == GRPO:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config  # type: ignore[assignment]
        from trl import RLOOTrainer as Trainer  # type: ignore[assignment]
    model: Any = models.build(shape.model, shape.vocab, shape.seed)  # a PreTrainedModel
    initial = copy.deepcopy(model)
    capture = capture_callback(model)
    reward: Any = _reward
    trainer: Any = Trainer(model=model, reward_funcs=reward,
                      args=Config(**config_kwargs(case, shape, workdir, backend)),
                      train_dataset=Dataset.from_dict({"prompt": prompts(shape)}),
                      processing_class=word_level(shape.vocab), callbacks=[capture])
    trained = Trained(torch.empty(0))
    own = trainer.compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any], *args: Any, **kw: Any) -> Any:
        if model.training:
            count = inputs.get("num_items_in_batch")
            kept = {k: inputs[k].detach().cpu().clone() for k in (
                "prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
            trained.fed.append(Fed(**kept,
                                   num_items_in_batch=None if count is None else int(count)))
        return own(model, inputs, *args, **kw)

    trainer.compute_loss = compute_loss

    def run() -> Trained:
        trainer.train()
        if capture.grad is None:
            raise RuntimeError(f"TRL's {case.name} trainer never reached its optimizer step")
        trained.grad = capture.grad
        return trained
    return run, initial


# --- rank 0: the references, from every rank's record ---------------------------------


def terms(model: torch.nn.Module, fed: Fed) -> tuple[torch.Tensor, torch.Tensor]:
    """(-A x ratio per completion token, the completion mask), float64, as
    TRL's loss writes them at ratio 1: prompt and completion in one forward,
    the completion's log-probs from the logits one position earlier."""
    ids = torch.cat([fed.prompt_ids, fed.completion_ids], dim=1)
    mask = torch.cat([fed.prompt_mask, fed.completion_mask], dim=1)
    width = fed.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1:-1]
    logp = torch.log_softmax(logits.double(), -1).gather(
        -1, fed.completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    return (-fed.advantages.double().unsqueeze(1) * ratio,
            fed.completion_mask.double())


Record = Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]  # [rank][micro] -> terms


def _sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(parts)).sum()


def objective(name: str, record: Record, max_length: int) -> torch.Tensor:
    """One objective over every rank's terms (``DESCRIPTIONS[name]``)."""
    flat = [tm for rank in record for tm in rank]
    total = _sum([(t * m).sum() for t, m in flat])
    if name == "token_mean":
        return total / _sum([m.sum() for _, m in flat])
    if name == RANK_MEANS:
        return _sum([_sum([(t * m).sum() for t, m in rank]) / _sum([m.sum() for _, m in rank])
                     for rank in record]) / len(record)
    if name == "microbatch_means":
        return _sum([(t * m).sum() / m.sum() for t, m in flat]) / len(flat)
    rows = sum(m.shape[0] for _, m in flat)
    if name == "sequence_means":
        return _sum([((t * m).sum(-1) / m.sum(-1).clamp(min=1)).sum() for t, m in flat]) / rows
    if name == "sequence_sums":
        return total / rows
    if name == "constant":
        return total / (rows * max_length)
    raise ValueError(f"unknown objective {name!r}")


def recipe_loss(loss_type: str, record: Record, max_length: int) -> torch.Tensor | None:
    """The course's re-implementation of TRL's aggregation
    (``rl_recipes.trl_grpo_loss``), summed over each rank's microbatches and
    averaged over the ranks, as DDP does; None for a loss type it lacks."""
    tokens = _sum([m.sum() for rank in record for _, m in rank])
    try:
        return _sum([rl_recipes.trl_grpo_loss(
            loss_type, t, m, len(rank), generation_steps=len(rank), generation_tokens=tokens,
            world_size=len(record), max_completion_length=max_length)
            for rank in record for t, m in rank]) / len(record)
    except ValueError:
        return None


def references(initial: torch.nn.Module, fed: Sequence[Sequence[Fed]], case: Case,
               shape: Shape) -> dict[str, torch.Tensor]:
    """Each objective's gradient (and "recipe"'s, where the course has one)
    at the initial weights, over every rank's record, float64."""
    model = copy.deepcopy(initial).double().train()
    grads = {}
    for name in (*OBJECTIVES, *(["recipe"] if case.trainer == GRPO else [])):
        model.zero_grad(set_to_none=True)
        record = [[terms(model, f) for f in rank] for rank in fed]
        loss = (recipe_loss(case.loss_type, record, shape.max_completion_length)
                if name == "recipe" else objective(name, record, shape.max_completion_length))
        if loss is None:
            continue
        loss.backward()
        grads[name] = reference_flat_grad(model).detach().clone()
    return grads


def agrees(g: torch.Tensor, ref: torch.Tensor) -> bool:
    """torch.allclose per component, at the float32 trainer's rounding."""
    return bool(torch.allclose(g.double(), ref, rtol=RTOL,
                               atol=ATOL * float(ref.abs().max())))


def max_error(grads: Sequence[torch.Tensor], ref: torch.Tensor) -> float:
    """max over ranks and components of |g - g*|, relative to max |g*|."""
    scale = float(ref.abs().max()) or 1.0
    return max(float((g.double() - ref).abs().max()) for g in grads) / scale


def verdict(grads: Sequence[torch.Tensor], ref: torch.Tensor) -> Verdict:
    """Exact when every rank's gradient is allclose to ``ref``; otherwise
    uniformly scaled (collinear: ``classify``) or biased."""
    if all(agrees(g, ref) for g in grads):
        return Verdict.EXACT
    seen = classify(grads[0], ref, TOLERANCE.of(PRECISION))
    return Verdict.SCALED if seen.verdict == Verdict.SCALED else Verdict.BIASED


def row(case: Case, shape: Shape, version: str | None, initial: torch.nn.Module,
        fed: Sequence[Sequence[Fed]], grads: Sequence[torch.Tensor],
        notes: Sequence[str] = ()) -> TrainerRow:
    """The row of one case, from every rank's record and gradient."""
    refs = references(initial, fed, case, shape)
    token = refs["token_mean"]
    key, where = claim(case)
    apart = any(not agrees(g, grads[0].double()) for g in grads[1:])
    first = classify(grads[0], token, TOLERANCE.of(PRECISION))
    mean = Verdict.RANKS_DISAGREE if apart else verdict(grads, token)
    trains = [n for n in OBJECTIVES if all(agrees(g, refs[n]) for g in grads)]
    tokens = [[int(f.completion_mask.sum()) for f in rank] for rank in fed]
    counts = sorted({f.num_items_in_batch for rank in fed for f in rank
                     if f.num_items_in_batch is not None})
    more = [*notes]
    if counts:
        more.append(f"TRL's num_items_in_batch: {', '.join(map(str, counts))} "
                    f"(the ranks' completion tokens: {sum(map(sum, tokens))})")
    if len({sum(t) for t in tokens}) == 1:
        more.append("every rank was fed as many completion tokens: a local count "
                    "cannot show")
    return TrainerRow(
        framework=FRAMEWORK[case.trainer], version=version, model=shape.model,
        flags=flags(case, shape), verdict=mean, precision=PRECISION, notes=more,
        factor=first.factor if mean == Verdict.SCALED else None,
        matches=trains[0] if trains else None, relative_error=first.relative_error,
        ranks=[RankResult(r, m.relative_error, m.scale) for r, m in enumerate(
            classify(g, token, TOLERANCE.of(PRECISION)) for g in grads)],
        trainer=case.trainer, loss_type=case.loss_type, claim=key, claim_source=where,
        claim_verdict=None if key is None else verdict(grads, refs[key]),
        max_err=max_error(grads, token),
        claim_max_err=None if key is None else max_error(grads, refs[key]),
        trains=trains,
        recipe=None if "recipe" not in refs else verdict(grads, refs["recipe"]),
        tokens=tokens, lengths=[[f.lengths for f in rank] for rank in fed],
        advantages=[[[round(float(a), 6) for a in f.advantages] for f in rank]
                    for rank in fed])
