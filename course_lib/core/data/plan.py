"""The rank plan: ``plan[step][rank][micro] -> sequence ids``.

One contiguous band of lengths per rank (short sequences on rank 0, long
ones on rank 1), a seeded sampler that draws each window, and the parity
window every check compares.
"""

from __future__ import annotations

import random
from pathlib import Path

from course_lib.core.config import Config, ConfigError
from course_lib.core.data.corpus import Corpus, load_corpus


def rank_bands(cfg: Config, world_size: int) -> list[tuple[int, int]]:
    """One contiguous length band per rank; W=2 uses the configured split."""
    d = cfg.data
    if len(d.rank_length_bands) == world_size:
        return [(int(lo), int(hi)) for lo, hi in d.rank_length_bands]
    span = d.max_length - d.min_length + 1
    if span < world_size:
        raise ValueError(f"cannot split lengths into {world_size} bands")
    edges = [d.min_length + (span * k) // world_size for k in range(world_size + 1)]
    return [(edges[k], edges[k + 1] - 1) for k in range(world_size)]


def rank_pools(corpus: Corpus, bands: list[tuple[int, int]]) -> list[list[int]]:
    """Disjoint pools of train ids, one per rank, by length band."""
    return [
        [i for i in corpus.splits["train"] if lo <= len(corpus.sequences[i]) <= hi]
        for lo, hi in bands
    ]


class WindowSampler:
    """Draws one accumulation window per update from a stateful RNG.

    ``next_window()`` returns ``window[rank][micro] -> ids``: per rank, the
    ids are drawn without replacement inside the window; across windows an id
    may come back. The RNG state advances with every window, so a resumed run
    must restore it (``state_dict``) rather than re-seed.
    """

    def __init__(self, pools: list[list[int]], accumulation: int,
                 batch_size: int, seed: int):
        need = accumulation * batch_size
        for rank, pool in enumerate(pools):
            if len(pool) < need:
                raise ValueError(
                    f"rank {rank}'s pool holds {len(pool)} sequences; a window "
                    f"needs {need}"
                )
        self.pools = pools
        self.accumulation = accumulation
        self.batch_size = batch_size
        self.seed = seed
        self.rng = random.Random(seed)
        self.history: list[list[list[list[int]]]] = []

    @property
    def position(self) -> int:
        return len(self.history)

    def next_window(self) -> list[list[list[int]]]:
        b = self.batch_size
        window = []
        for pool in self.pools:
            ids = self.rng.sample(pool, self.accumulation * b)
            window.append([ids[i : i + b] for i in range(0, len(ids), b)])
        self.history.append(window)
        return window

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "seed": self.seed,
            "position": self.position,
            "rng_state": [version, list(internal), gauss],
            "history": self.history,
        }

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng_state"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.history = [list(w) for w in state["history"]]


def make_sampler(cfg: Config, corpus: Corpus, world_size: int) -> WindowSampler:
    t = cfg.train
    try:
        pools = rank_pools(corpus, rank_bands(cfg, world_size))
        return WindowSampler(pools, t.accumulation, t.batch_size_per_rank, cfg.seed + 10)
    except ValueError as exc:
        raise ConfigError(f"train (world size {world_size}): {exc}") from None


def check_plan(cfg: Config, data_dir: Path, world_size: int) -> None:
    """Before a launch: the corpus matches its lock and every rank's pool can
    fill a window (ConfigError / DataLockError, one line)."""
    make_sampler(cfg, load_corpus(cfg, data_dir), world_size)


def parity_window(cfg: Config, corpus: Corpus, world_size: int) -> list[list[list[int]]]:
    """The plan's window at ``parity.step`` for ``world_size`` ranks, as a
    fresh sampler draws it: the window every parity check compares."""
    sampler = make_sampler(cfg.with_world_size(world_size), corpus, world_size)
    for _ in range(cfg.parity.step + 1):
        window = sampler.next_window()
    return window


def make_plan(cfg: Config, corpus: Corpus, world_size: int) -> list:
    """``plan[step][rank][micro] -> ids`` for a whole run, as a fresh sampler
    would draw it."""
    sampler = make_sampler(cfg, corpus, world_size)
    return [sampler.next_window() for _ in range(cfg.train.updates)]


def sampler_plan(cfg: Config, corpus: Corpus, world_size: int) -> list:
    """What a usual DDP loader deals instead of the plan, in the plan's shape:
    ``DistributedSampler`` over the whole train split, shuffled (a new shuffle
    per epoch, ``set_epoch``), each rank's stream cut into windows, for as
    many steps as the plan."""
    from torch.utils.data import DistributedSampler

    t = cfg.train
    b, share = t.batch_size_per_rank, t.accumulation * t.batch_size_per_rank
    train = corpus.splits["train"]  # each sampler deals positions in it
    samplers: list[DistributedSampler[int]] = [
        DistributedSampler(train, num_replicas=world_size, rank=r,  # type: ignore[arg-type]
                           shuffle=True, seed=cfg.seed)
        for r in range(world_size)]
    windows: list = []
    epoch = 0
    while len(windows) < t.updates:
        streams = []  # each rank's ids for this epoch
        for sampler in samplers:
            sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
            streams.append([train[i] for i in sampler])
        for k in range(0, len(streams[0]) - share + 1, share):  # one window
            windows.append([[ids[m : m + b] for m in range(k, k + share, b)]
                            for ids in streams])
        epoch += 1
    return windows[: t.updates]


# --- padding -----------------------------------------------------------------


