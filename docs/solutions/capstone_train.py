"""The capstone, solved: examples/capstone/train.py with its bugs fixed.

For instructors. No chapter imports this file; the grader passes it:

    course-lib capstone check docs/solutions/capstone_train.py --out runs/capstone-solution

Each fix carries a ``# fixed:`` comment that names the mistake it replaces
(the course's names). Run it as the exercise's docstring says, from the
repository root:

    PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \\
        print(s.getsockname()[1])")
    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 \\
        --master-port=$PORT docs/solutions/capstone_train.py --updates 20
"""

import argparse
import contextlib
import gc
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.config import load as load_config
from course_lib.core.data import collate, load_corpus, locate, make_sampler
from course_lib.core.model import build_model, loss_sum, supervised_mask
from course_lib.core.paths import config_path, data_dir


def step(model, microbatches, world_size):
    """One accumulation window on this rank: forward and backward on every
    microbatch, no optimizer step. DDP averages the ranks' gradients."""
    # fixed (padding counted): a token is a supervised label, never a padded slot.
    local = torch.stack([supervised_mask(labels).sum() for _, labels in microbatches]).sum()
    n = local.clone()
    dist.all_reduce(n)  # N: the window's tokens over every rank, on every rank
    for i, (inputs, labels) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        # no_sync() holds the forward AND the backward; the last microbatch syncs.
        with contextlib.nullcontext() if last else model.no_sync():
            # fixed (mean of means; extra division by the accumulation steps):
            # W * S_r / N, once per window; DDP's mean over W leaves sum_r S_r / N.
            loss = loss_sum(model(inputs), labels) * world_size / n
            loss.backward()


def save(path, model, optimizer, sampler, update):
    """Every rank calls it after ``update`` updates. Rank 0 writes what the
    ranks share; each rank writes its own RNG state (its dropout masks)."""
    path = Path(path)
    rank = dist.get_rank()
    # fixed (a checkpoint written in place): every rank writes into a staging
    # folder, and rank 0 renames it to ``path`` once every rank's file is in it
    # (chapter 06). A rename is atomic on one filesystem: a job killed during
    # the save leaves step-NNNN.tmp, which no resume takes for a checkpoint.
    tmp = path.with_name(path.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # what an earlier killed save left
        tmp.mkdir(parents=True)
    dist.barrier()  # the staging folder exists before any rank writes into it
    if rank == 0:
        # fixed (the sampler forgotten): its state says which windows come next.
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "sampler": sampler.state_dict(), "update": update}, tmp / "state.pt")
    # fixed (one RNG state for every rank): each rank draws its own dropout masks.
    torch.save({"torch": torch.get_rng_state()}, tmp / f"rank-{rank}.pt")
    dist.barrier()  # every rank's file is in the staging folder
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)  # the same step saved again
        tmp.rename(path)  # the whole checkpoint appears at once, or none of it
    dist.barrier()  # no rank goes on before the checkpoint is in place


def load(path, model, optimizer, sampler):
    """Every rank calls it; returns the number of updates already done."""
    path = Path(path)
    state = torch.load(path / "state.pt", weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    own = torch.load(path / f"rank-{dist.get_rank()}.pt", weights_only=True)
    torch.set_rng_state(own["torch"])
    return state["update"]


@torch.no_grad()
def evaluate(model, corpus, device):
    """Loss per token and token accuracy on the test split, the same on
    every rank. ``model`` is the plain module, not the DDP wrapper: DDP's
    forward may run collectives of its own (it broadcasts a model's buffers),
    which would hang as soon as the ranks score unequal numbers of batches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model.eval()
    # fixed (padded duplicates): each test sequence once, on one rank.
    ids = list(corpus.splits["test"])[rank::world]
    # the sums of the loss, the tokens and the hits (correct predictions)
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for start in range(0, len(ids), 64):
        inputs, labels = collate(corpus, ids[start:start + 64], device=device)
        logits = model(inputs)
        mask = supervised_mask(labels)
        hits = ((logits.argmax(-1) == labels) & mask).sum()
        totals += torch.stack([loss_sum(logits, labels).double(),
                               mask.sum().double(), hits.double()])
    # fixed (a mean of rank means): sum the sums, then divide once.
    dist.all_reduce(totals)
    loss, tokens, correct = totals.tolist()
    return {"loss_per_token": loss / tokens, "token_accuracy": correct / tokens}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(config_path("minimum")))
    parser.add_argument("--out", default="runs/capstone")
    parser.add_argument("--updates", type=int, default=None, help="default: the config's")
    parser.add_argument("--save-every", type=int, default=None, help="default: the config's")
    parser.add_argument("--resume", default=None, metavar="CKPT_DIR")
    args = parser.parse_args()

    # torchrun set RANK, WORLD_SIZE and MASTER_*; gloo on the CPU, a core per rank.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    device = torch.device("cpu")
    cfg = load_config(args.config)
    corpus = load_corpus(cfg, locate(cfg, data_dir()))
    updates = args.updates or cfg.train.updates
    every = args.save_every or cfg.train.checkpoint_every

    torch.manual_seed(cfg.seed + 1000 * (rank + 1))  # each rank its own dropout masks
    # the same initial weights everywhere: build_model seeds from cfg.seed (and
    # DDP broadcasts rank 0's weights anyway)
    model = DDP(build_model(cfg).to(device).train())
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.train.lr,
                                momentum=cfg.train.momentum)
    sampler = make_sampler(cfg, corpus, world)  # one seeded sampler, the same on every rank
    done = load(args.resume, model, optimizer, sampler) if args.resume else 0

    for update in range(done + 1, updates + 1):
        window = sampler.next_window()  # window[rank][micro] -> sequence ids
        micro = [collate(corpus, ids, device=device) for ids in window[rank]]
        optimizer.zero_grad(set_to_none=True)
        step(model, micro, world)
        optimizer.step()
        if update % every == 0 or update == updates:
            where = Path(args.out) / f"step-{update:04d}"
            save(where, model, optimizer, sampler, update)
            if rank == 0:
                print(f"update {update}/{updates}: checkpoint {where}")

    result = evaluate(model.module, corpus, device)
    if rank == 0:
        print(f"test: {result['loss_per_token']:.4f} nats per token, "
              f"token accuracy {result['token_accuracy']:.4f} "
              f"(entropy floor {corpus.entropy_floor:.4f})")
    # Leave together, the DDP model first (see examples/ddp_by_hand.py).
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
