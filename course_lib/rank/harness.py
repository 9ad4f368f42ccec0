"""The gradient harness: one window's gradients on every rank, plus the
single-process reference of the same window.

Parity, the exercise, the trajectory and the invariance checks all go through
here. A *layout* is ``layout[rank][micro] -> sequence ids``: a window of the
plan, or the same sequences arranged another way.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.data import Corpus, Packing, collate
from course_lib.core.model import build_model
from course_lib.core.normalize import Microbatch, window_count
from course_lib.core.reference import Comparison, compare, flat_grad, reference_gradient
from course_lib.core.verdicts import TOLERANCE, worst
from course_lib.rank.context import RankContext
from course_lib.steps.registry import StepInfo

Layout = list[list[list[int]]]

def tolerance(cfg, dtype: str | None = None) -> tuple[float, float]:
    """(atol, rtol) for the config's dtype, or for ``dtype`` where given."""
    if (dtype or cfg.train.dtype) == "float64":
        return TOLERANCE.float64_components
    return cfg.parity.atol, cfg.parity.rtol


def packing_of(cfg, width: int) -> Packing:
    """The config's packed rows of ``width`` tokens: their fillers are seeded."""
    return Packing(width, cfg.seed + 40)


def packing(ctx: RankContext) -> Packing | None:
    """The packed rows the audited objective asks for (``document:WIDTH``), or None."""
    width = ctx.objective.packing
    return packing_of(ctx.cfg, width) if width else None


def microbatches(ctx: RankContext, layout: Layout, rank: int,
                 corpus: Corpus | None = None) -> list[Microbatch]:
    supervised = rank not in ctx.cfg.train.empty_ranks
    return [collate(corpus or ctx.corpus, ids, supervised, ctx.device, packing(ctx))
            for ids in layout[rank]]


def wrap(ctx: RankContext, model: torch.nn.Module) -> DDP:
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def fresh_ddp(ctx: RankContext, step: StepInfo) -> DDP:
    """The initial model (dropout off), wrapped, with the step's own set-up."""
    ddp = wrap(ctx, build_model(ctx.cfg).to(ctx.device).eval())
    if step.setup is not None:
        step.setup(ddp, ctx.world_size)
    return ddp


def gather_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every rank's flat gradient, on every rank (float64, CPU)."""
    g = flat_grad(model)
    everyone = [torch.empty_like(g) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, g)
    return [x.double().cpu() for x in everyone]


def _identical(grads: list[torch.Tensor]) -> bool:
    return all(torch.equal(grads[0], g) for g in grads[1:])


def gather_ints(value: int, device: torch.device) -> list[int]:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [int(x) for x in out]


def gather_floats(value: float, device: torch.device) -> list[float]:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x) for x in out]


class SyncProbe:
    """Before every forward after the first, do the ranks hold the same gradients?

    While DDP defers the sync (``no_sync()``) they differ; a forward pre-hook
    sees the gradients between one microbatch's backward and the next.
    """

    def __init__(self, ddp: DDP):
        self.model = ddp.module
        self.forwards = 0
        self.agree: list[bool] = []
        self._handle = ddp.register_forward_pre_hook(self._before_forward)

    def _before_forward(self, module, args) -> None:
        if torch.is_grad_enabled():
            if self.forwards:
                self.agree.append(_identical(gather_grads(self.model)))
            self.forwards += 1

    def remove(self) -> None:
        self._handle.remove()


class StepDesyncError(RuntimeError):
    """Some rank never came out of the step: a hang, or a collective that
    the other ranks skipped (it waits for partners that never come)."""

    def __init__(self, message: str, stuck: list[int]):
        super().__init__(message)
        self.stuck = stuck


def fence(ctx: RankContext, timeout: float) -> None:
    """Every rank marks the end of the step in the job's store, then waits for
    the others. Nothing crosses the process group, so a collective issued by
    one rank alone cannot pair with anything here: the others name it."""
    store = dist.distributed_c10d._get_default_store()
    ctx.state.fences += 1
    keys = [f"course/fence/{ctx.state.fences}/{r}" for r in range(ctx.world_size)]
    store.set(keys[ctx.rank], "done")
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception:  # the store's timeout error type varies between versions
        stuck = [r for r, k in enumerate(keys) if not store.check([k])]
        raise StepDesyncError(
            f"rank {', '.join(map(str, stuck))} did not finish the step within "
            f"{timeout:g} s: a hang, or a collective that the other ranks skipped",
            stuck) from None


@dataclass
class StepOutcome:
    grads: list[torch.Tensor]  # every rank's flat gradient after the step
    agree_after_micro: list[bool]  # before each later microbatch, then at the end
    local_tokens: list[int]


def run_step(ctx: RankContext, step: StepInfo, ddp: DDP,
             micro: list[Microbatch], probe: bool = True) -> StepOutcome:
    """Zero the gradients, run the step once, and collect what it left.
    ``probe``: watch the sync between microbatches (a collective before each
    forward, so only where every rank makes as many microbatches)."""
    ddp.zero_grad(set_to_none=True)
    watch = SyncProbe(ddp) if probe else None
    try:
        step.call(ddp, micro, ctx.world_size, ctx.objective)
    finally:
        if watch is not None:
            watch.remove()
    fence(ctx, ctx.state.step_timeout)
    grads = gather_grads(ddp.module)
    tokens = gather_ints(int(window_count(micro)) if micro else 0, ctx.device)
    return StepOutcome(grads, (watch.agree if watch else []) + [_identical(grads)], tokens)


@dataclass
class Reference:
    grad: torch.Tensor  # float64, CPU
    tokens: int
    loss_per_token: float


def window_reference(ctx: RankContext, layout: Layout, state: dict | None = None,
              corpus: Corpus | None = None) -> Reference:
    """One process, every rank's sequences: the gradient of the token mean,
    or of the objective the job audits (``ctx.objective``)."""
    model = build_model(ctx.cfg).to(ctx.device).eval()
    if state is not None:
        model.load_state_dict(state)
    everything = [mb for r in range(len(layout))
                  for mb in microbatches(ctx, layout, r, corpus)]
    grad, n, loss = reference_gradient(model, everything, ctx.objective)
    return Reference(grad.double().cpu(), n, loss)


def compare_ranks(grads: list[torch.Tensor], ref: torch.Tensor,
                  atol: float, rtol: float) -> Comparison:
    """``compare`` on every rank's gradient; the worst rank decides."""
    results = [compare(g, ref, atol, rtol) for g in grads]
    return Comparison(
        max_abs_err=worst(r.max_abs_err for r in results),
        allclose=all(r.allclose for r in results),
        violations=max(r.violations for r in results),
    )


def parity_reference(ctx: RankContext) -> Reference:
    """Rank 0 only: the reference gradient of the parity window, once per
    context and objective (one launch may audit several objectives)."""
    return ctx.cached(("parity_reference", ctx.objective.spec),
                      lambda: window_reference(ctx, ctx.parity_layout()))


# --- layouts: the same sequences, arranged another way ------------------------------


def _chunks(ids: list[int], parts: int) -> list[list[int]]:
    size = len(ids) // parts
    return [ids[i * size:(i + 1) * size] for i in range(parts)]


def regroup(layout: Layout, accumulation: int) -> Layout:
    """Each rank keeps its sequences, split into ``accumulation`` microbatches."""
    return [_chunks([i for mb in rank for i in mb], accumulation) for rank in layout]


def accumulation_layouts(layout: Layout) -> dict[str, Layout]:
    """e.g. 1x16, 2x8, 4x4, 16x1 for 16 sequences per rank."""
    per_rank = sum(len(mb) for mb in layout[0])
    counts = [a for a in (1, 2, 4, per_rank) if per_rank % a == 0]
    return {f"{a}x{per_rank // a}": regroup(layout, a) for a in dict.fromkeys(counts)}


def permuted_layouts(layout: Layout, corpus: Corpus, seed: int) -> dict[str, Layout]:
    """The window as planned, dealt round-robin by length, and shuffled."""
    world, micro = len(layout), len(layout[0])
    pooled = [i for rank in layout for mb in rank for i in mb]
    by_length = sorted(pooled, key=lambda i: (len(corpus.sequences[i]), i))
    shuffled = list(pooled)
    random.Random(seed).shuffle(shuffled)
    return {
        "as planned": layout,
        "dealt by length": [_chunks(by_length[r::world], micro) for r in range(world)],
        "shuffled": [_chunks(shuffled[r::world], micro) for r in range(world)],
    }


def world_size_layout(ids: list[int], world_size: int, batch_size: int) -> Layout:
    """One fixed set of sequences: contiguous slices per rank, whatever W."""
    per_rank = len(ids) // world_size
    return [_chunks(ids[r * per_rank:(r + 1) * per_rank], per_rank // batch_size)
            for r in range(world_size)]


def token_budget(ids: list[int], corpus: Corpus, max_tokens: int) -> list[list[int]]:
    """Microbatches of at most ``max_tokens`` padded tokens (rows x the
    longest row), filled in order, as fairseq's ``max_tokens`` batches: long
    sequences make more, smaller microbatches. One sequence longer than the
    budget still gets a microbatch of its own."""
    found: list[list[int]] = []
    for i in ids:
        grown = found[-1] + [i] if found else [i]
        if found and len(grown) * max(len(corpus.sequences[j]) for j in grown) <= max_tokens:
            found[-1] = grown
        else:
            found.append([i])
    return found


def uneven_layout(layout: Layout, corpus: Corpus, max_tokens: int) -> Layout:
    """Each rank keeps its sequences, re-batched by a token budget: the ranks
    make different numbers of microbatches in one window."""
    return [token_budget([i for mb in rank for i in mb], corpus, max_tokens)
            for rank in layout]
