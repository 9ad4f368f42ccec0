"""DDP by hand: the course's rule in plain torch, one file, top to bottom.

Run it from the repository root, two processes on this machine:

    PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \\
        print(s.getsockname()[1])")
    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 \\
        --master-port=$PORT examples/ddp_by_hand.py [--json FILE]

Why a free port rather than torchrun's default 29500: the first agent of the
job opens its rendezvous store on that port, and any other job on this host
that already holds it (a notebook, a test, a colleague's run) makes the
launch fail with "address already in use". Binding port 0 asks the operating
system for one that nobody holds. (torchrun also warns that it sets
OMP_NUM_THREADS=1 for every rank; set it yourself to silence the warning.)

Every rank takes its share of the course's parity window (rank 0 the short
sequences, rank 1 the long ones), then runs one accumulation window twice
from the same initial weights: with the course's rule (backprop W * S_r / N)
and with the mean of means (backprop S_r / N_r, which DDP averages). Rank 0
computes the single-process reference itself and prints, for example:

    N = 2283 tokens, per rank [721, 1562]; 112480 gradient components
    global_token   PASS  max |err| < 1e-7  (atol 1e-06, rtol 0.0001)
    mean_of_means  FAIL  max |err| 6.43e-03  (atol 1e-06, rtol 0.0001)

The exit code is 0 when the token rule passes and the mean of means fails
(with one rank the two coincide, and the token rule alone decides).
``--json FILE`` (or the environment variable BY_HAND_JSON) also writes these
numbers as JSON. With a GPU per rank it runs NCCL, otherwise gloo on the CPU.
"""

import argparse
import contextlib
import gc
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.config import load
from course_lib.core.data import collate, load_corpus, locate, parity_window
from course_lib.core.model import build_model
from course_lib.core.paths import config_path, data_dir

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--config", default=str(config_path("minimum")))
parser.add_argument("--json", default=os.environ.get("BY_HAND_JSON"))
args = parser.parse_args()

# --- join the job: torchrun set RANK, WORLD_SIZE, LOCAL_*, MASTER_* --------
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
nccl = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
device = torch.device("cuda", local_rank) if nccl else torch.device("cpu")
if nccl:
    torch.cuda.set_device(device)
# env:// reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; never LOCAL_*
dist.init_process_group("nccl" if nccl else "gloo")
torch.set_num_threads(1)  # one core per rank

# --- data: this rank's share of the parity window, as (inputs, labels) -------
cfg = load(args.config)
corpus = load_corpus(cfg, locate(cfg, data_dir()))
window = parity_window(cfg, corpus, world)  # window[rank][micro] -> seq ids
micro = [collate(corpus, ids, device=device) for ids in window[rank]]


def loss_sum(model, inputs, labels):
    """S: the SUM of the token losses; label -100 (padding) is no token."""
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                           ignore_index=-100, reduction="sum")


def flat_grad(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


# --- the rank's loop, once per mode, each from the same initial weights ------
grads = {}
for mode in ("global_token", "mean_of_means"):
    model = DDP(build_model(cfg).to(device).eval())  # eval: no dropout
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    # Count first: N_r, this rank's supervised tokens over the whole window.
    local = torch.stack([(labels != -100).sum() for _, labels in micro]).sum()
    n = local.clone()
    # all_reduce leaves the SUM on EVERY rank (there is no chief): each rank
    # now holds N, the window's tokens over all ranks, before any backward.
    dist.all_reduce(n, op=dist.ReduceOp.SUM)
    for i, (inputs, labels) in enumerate(micro):
        last = i == len(micro) - 1
        # no_sync() must hold the forward AND the backward: DDP prepares its
        # gradient all-reduce in the forward. The last microbatch syncs.
        with contextlib.nullcontext() if last else model.no_sync():
            s = loss_sum(model, inputs, labels)
            if mode == "global_token":
                loss = s * world / n  # W * S_r / N; DDP divides by W
            else:
                loss = s / local  # S_r / N_r; DDP averages the ranks' means
            loss.backward()
    grads[mode] = flat_grad(model.module).detach().clone()
    opt.step()  # a training loop steps here: every rank holds the same grads
    opt.zero_grad(set_to_none=True)

counts = [torch.zeros_like(local) for _ in range(world)]
dist.all_gather(counts, local)

# --- rank 0: the single-process reference, and the comparison ----------------
ok = True
if rank == 0:
    ref_model = build_model(cfg).to(device).eval()
    everything = [collate(corpus, ids, device=device)
                  for share in window for ids in share]  # every rank's
    total = sum(int((labels != -100).sum()) for _, labels in everything)
    loss = sum(loss_sum(ref_model, x, y) for x, y in everything) / total
    loss.backward()  # the gradient of (sum of every token loss) / N
    ref = flat_grad(ref_model)
    atol, rtol = cfg.parity.atol, cfg.parity.rtol
    print(f"N = {int(n)} tokens, per rank {[int(c) for c in counts]}; "
          f"{ref.numel()} gradient components")
    result = {"world_size": world, "backend": dist.get_backend(),
              "global_tokens": int(n), "local_tokens": [int(c) for c in counts],
              "reference_tokens": total, "compared_values": ref.numel(),
              "atol": atol, "rtol": rtol, "modes": {}}
    for mode, g in grads.items():
        close = torch.allclose(g, ref, atol=atol, rtol=rtol)  # every component
        err = float((g.double() - ref.double()).abs().max())
        result["modes"][mode] = {"allclose": close, "max_abs_err": err}
        # below 1e-7 the digits are float32 rounding, which the hardware's
        # order of additions decides: say only that it is rounding
        shown = "< 1e-7" if err < 1e-7 else f"{err:.2e}"
        print(f"{mode:<14} {'PASS' if close else 'FAIL'}  max |err| {shown}  "
              f"(atol {atol:g}, rtol {rtol:g})")
    ok = result["modes"]["global_token"]["allclose"] and (
        world == 1 or not result["modes"]["mean_of_means"]["allclose"])
    result["passed"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

# Leave together, the DDP model first: it holds reference cycles, and a
# reducer freed at interpreter exit, after its process group, can abort
# gloo's threads ("terminate called without an active exception").
del model, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
