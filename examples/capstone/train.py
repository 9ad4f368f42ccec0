"""The capstone: train the course's tiny model with DDP, in plain torch, one file.

Run it from the repository root, two processes on this machine (a free port,
as in examples/ddp_by_hand.py):

    PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \\
        print(s.getsockname()[1])")
    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 \\
        --master-port=$PORT examples/capstone/train.py --updates 20
    # later, from the checkpoint it wrote (a new --master-port each time):
    torchrun ... examples/capstone/train.py --resume runs/capstone/step-0020 --updates 40

Each update draws one accumulation window from the course's sampler (rank 0
the short sequences, rank 1 the long ones), runs ``step`` on this rank's
microbatches and takes one SGD step. Every ``--save-every`` updates ``save``
writes a checkpoint, and ``--resume`` continues from one with ``load``; at
the end ``evaluate`` scores the test split and rank 0 prints it. gloo, CPU.

This script has bugs, each one a mistake the course names. Find them, fix
them, and grade your file (it exits 0 when every property holds):

    course-lib capstone check examples/capstone/train.py --out runs/capstone-check

The grader imports the file (``main`` runs only as a script) and calls the
four functions as ``main`` does (``model`` the DDP model, except in
``evaluate``; ``microbatches`` this rank's (inputs, labels) pairs):

    step(model, microbatches, world_size)          one window on one rank, as
                                                   `course-lib audit --step` takes it
    save(path, model, optimizer, sampler, update)  every rank calls it
    load(path, model, optimizer, sampler) -> the number of updates done
    evaluate(model, corpus, device) -> {"loss_per_token": .., "token_accuracy": ..}
"""

import argparse
import contextlib
import gc
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.core.config import load as load_config
from course_lib.core.data import collate, load_corpus, locate, make_sampler
from course_lib.core.model import build_model, loss_sum, supervised_mask
from course_lib.core.paths import config_path, data_dir


def step(model, microbatches, world_size):
    """One accumulation window on this rank: forward and backward on every
    microbatch, no optimizer step. DDP averages the ranks' gradients."""
    n = sum(labels.numel() for _, labels in microbatches)  # the window's tokens
    for i, (inputs, labels) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        # no_sync() holds the forward AND the backward; the last microbatch syncs.
        with contextlib.nullcontext() if last else model.no_sync():
            loss = loss_sum(model(inputs), labels) / n
            (loss / len(microbatches)).backward()  # average over the accumulation steps


def save(path, model, optimizer, sampler, update):
    """Every rank calls it after ``update`` updates; rank 0 writes the
    checkpoint (DDP keeps every replica identical)."""
    path = Path(path)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "rng": torch.get_rng_state(), "update": update}, path / "state.pt")
    dist.barrier()  # every rank waits for rank 0's write


def load(path, model, optimizer, sampler):
    """Every rank calls it; returns the number of updates already done."""
    path = Path(path)
    state = torch.load(path / "state.pt", weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return state["update"]


@torch.no_grad()
def evaluate(model, corpus, device):
    """Loss per token and token accuracy on the test split, the same on
    every rank. ``model`` is the plain module, not the DDP wrapper: DDP's
    forward may run collectives of its own (it broadcasts a model's buffers),
    which would hang as soon as the ranks score unequal numbers of batches."""
    world = dist.get_world_size()
    model.eval()
    test = corpus.splits["test"]
    ids = [test[i] for i in DistributedSampler(test, shuffle=False)]  # this rank's share
    # the sums of the loss, the tokens and the hits (correct predictions)
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for start in range(0, len(ids), 64):
        inputs, labels = collate(corpus, ids[start:start + 64], device=device)
        logits = model(inputs)
        mask = supervised_mask(labels)
        hits = ((logits.argmax(-1) == labels) & mask).sum()
        totals += torch.stack([loss_sum(logits, labels).double(),
                               mask.sum().double(), hits.double()])
    loss, tokens, correct = totals.tolist()
    means = torch.tensor([loss / tokens, correct / tokens], dtype=torch.float64,
                         device=device)
    dist.all_reduce(means)
    means /= world  # every rank's mean, averaged
    return {"loss_per_token": float(means[0]), "token_accuracy": float(means[1])}


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
