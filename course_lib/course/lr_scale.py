"""A uniformly scaled gradient is a learning-rate change: SGD feels it, Adam
mostly hides it.

One process, no torchrun: the tiny model (dropout off, float64 so the
numbers do not depend on the CPU) trains on the plan's windows, every rank's
sequences together, with the exact gradient of the window's token mean
multiplied by a factor c. With SGD (and momentum) every update is c times
the exact one: the same as a learning rate c times smaller. Adam divides
each update by a running root-mean-square of the gradients, so c cancels
out, except against Adam's small epsilon.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from course_lib.core.config import Config
from course_lib.core.data import Corpus, collate, make_sampler
from course_lib.core.model import build_model
from course_lib.core.reference import reference_gradient

ADAM_LR = 3e-3
OPTIMIZERS = ("sgd", "adam")
NAMES = {"sgd": "SGD + momentum", "adam": "Adam"}


@dataclass
class ScaledRun:
    optimizer: str
    factor: float
    losses: list[float]  # the window's loss per token before each update
    drift: float | None = None  # ||theta_c - theta_1|| / ||theta_1 - theta_0||
    params: torch.Tensor | None = field(default=None, repr=False)


def _optimizer(name: str, params, cfg: Config) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg.train.lr, momentum=cfg.train.momentum)
    if name == "adam":
        return torch.optim.Adam(params, lr=ADAM_LR)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train_scaled(cfg: Config, windows: list, optimizer: str, factor: float,
                 model: torch.nn.Module | None = None) -> ScaledRun:
    """``len(windows)`` updates with the exact gradient times ``factor``,
    from ``model`` (default: the initial model in float64)."""
    if model is None:
        model = build_model(cfg, dtype=torch.float64).eval()
    opt = _optimizer(optimizer, model.parameters(), cfg)
    losses = []
    for micro in windows:
        _, _, loss = reference_gradient(model, micro)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        opt.step()
        losses.append(loss)
    return ScaledRun(optimizer, factor, losses, params=_flat_params(model))


def simulate(cfg: Config, corpus: Corpus, factors: Sequence[float] = (1.0, 0.5),
             updates: int = 20, optimizers: Sequence[str] = OPTIMIZERS,
             microbatches: int = 1) -> list[ScaledRun]:
    """Each optimizer with each factor; the first factor is the reference.
    Each update uses the first ``microbatches`` of every rank's window."""
    sampler = make_sampler(cfg, corpus, cfg.train.world_size)
    windows = []
    for _ in range(updates):
        layout = sampler.next_window()
        windows.append([collate(corpus, ids) for rank in layout
                        for ids in rank[:microbatches]])
    # Built here, one after the other: build_model seeds torch's global RNG.
    todo = [(name, f, build_model(cfg, dtype=torch.float64).eval())
            for name in optimizers for f in factors]
    start = _flat_params(todo[0][2])  # every run's initial weights, before training
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: intra-op threads only contend for the CPU
    try:
        # The runs are independent and torch's kernels release the GIL: two
        # at a time take 2.6 s instead of 6.6 s on 2 cores, bit for bit the same.
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda job: train_scaled(cfg, windows, *job), todo))
    finally:
        torch.set_num_threads(threads)
    for name in optimizers:
        mine = [r for r in runs if r.optimizer == name]
        base = mine[0].params
        assert base is not None  # every run above keeps its parameters
        for run in mine:
            assert run.params is not None
            run.drift = float((run.params - base).norm() / (base - start).norm())
    return runs


def describe(runs: list[ScaledRun]) -> str:
    """Final loss and drift from the exact run, rounded to digits that hold."""
    lines = [f"{'optimizer':<16} {'factor':>6}  {'last loss':>10}  drift from exact"]
    for r in runs:
        drift = ("-" if not r.drift else
                 "< 0.001" if r.drift < 1e-3 else f"{r.drift:.2f}")
        lines.append(f"{NAMES[r.optimizer]:<16} {r.factor:>6g}  {r.losses[-1]:>10.3f}"
                     f"  {drift}")
    return "\n".join(lines)
