"""Chapter 00's three collectives, made for real: two processes, gloo, CPU.

``on_rank`` is what each rank runs; ``run`` starts the two processes, lets
them join one process group and returns what each rank holds after each
call. Chapter 00 prints it beside its simulation in plain lists; a last
``all_reduce`` of each tensor divided by W answers its second prediction.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HELD = {0: [2.0, 5.0], 1: [7.0, 1.0]}  # what rank 0 and rank 1 hold
WORLD_SIZE = len(HELD)


def on_rank(rank: int) -> dict[str, list]:
    """One rank's side: the three calls, each on a copy of its own tensor,
    then an all_reduce of the tensor divided by W."""
    mine = torch.tensor(HELD[rank])
    total = mine.clone()
    dist.all_reduce(total)  # in place: the sum over the ranks
    everyone = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
    dist.all_gather(everyone, mine)  # fills the list: one tensor per rank
    sent = mine.clone()
    dist.broadcast(sent, src=0)  # in place: rank 0's tensor
    share = mine / WORLD_SIZE
    dist.all_reduce(share)  # each rank's tensor / W, then the sum
    return {"all_reduce": total.tolist(),
            "all_gather": [t.tolist() for t in everyone],
            "broadcast": sent.tolist(),
            "divided_then_summed": share.tolist()}


def _worker(rank: int, store: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD_SIZE, timeout=timedelta(seconds=60))
    try:
        results.put((rank, on_rank(rank)))
    finally:
        dist.destroy_process_group()


def run() -> dict[int, dict[str, list]]:
    """Start two processes, run ``on_rank`` on each; rank -> what it holds."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(str(Path(tmp) / "store"), results),
                           nprocs=WORLD_SIZE, join=True, start_method="spawn")
    found = dict(results.get() for _ in range(WORLD_SIZE))
    return {rank: found[rank] for rank in sorted(found)}
