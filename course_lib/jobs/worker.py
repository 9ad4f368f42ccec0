"""The torchrun worker: every rank of every launch runs ``main`` here.

torchrun forks it from its agent (``worker_entry.py``, the fork server's
path) or starts it with ``python -m course_lib.jobs.worker`` (the plain
path); either way it gets ``--run-file RUN.json``. The run file
(``run.runfile.RunFile``, written by ``run.launch``) holds the resolved
config, the backend, the device and the jobs to run, in order, inside one
launch. Each job's kind (``course_lib.jobs.KINDS``) says what to do.

Every rank appends JSON lines to ``<out>/logs/<job>-rank<R>.jsonl``; rank 0
writes the reports and prints ``@@progress`` lines for the launcher.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import traceback
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from course_lib.core.config import from_dict
from course_lib.core.data import load_corpus
from course_lib.jobs import KINDS, SPECS
from course_lib.rank.context import JobState, RankContext
from course_lib.reports.store import Elsewhere
from course_lib.run import errorlog, processes
from course_lib.run.runfile import RunFile, job_to_dict


def setup(run: RunFile) -> RankContext:
    processes.die_with_parent()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    cfg = from_dict(run.config)
    # One source inside the worker: the run file's config, which the
    # launcher resolved; torchrun's WORLD_SIZE must agree with it.
    world_size = cfg.train.world_size
    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise RuntimeError(f"torchrun started {os.environ['WORLD_SIZE']} ranks for a "
                           f"run file of {world_size}")
    processes.title_worker(rank, world_size, "setup", run.out)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if run.device == "cuda":
        # NCCL: one GPU per rank. gloo on CUDA may share GPUs between ranks.
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        run.backend, timeout=datetime.timedelta(seconds=run.collective_timeout),
        device_id=device if run.backend == "nccl" else None,
    )
    corpus = load_corpus(cfg, Path(run.data_dir))
    return RankContext(cfg, rank, world_size, run.backend, device, corpus,
                       JobState(out=Path(run.out)), run.fault or {})


def run_jobs(ctx: RankContext, run: RunFile) -> None:
    base_out = Path(run.out)
    for spec in run.jobs:
        kind = KINDS[spec.TAG]
        ctx.state.out = Path(spec.writes_to() or base_out)
        ctx.state.job, ctx.state.update = spec.TAG, None
        processes.title_worker(ctx.rank, ctx.world_size, spec.TAG, str(ctx.out))
        if kind.prepare is not None:
            spec = kind.prepare(ctx, spec)
        ctx.log("start", spec=job_to_dict(spec))
        kind.run(ctx, spec)
        ctx.log("done")
    _tell_where_reports_went(ctx, base_out)
    # Leave together: a rank that tears down while another still writes its
    # report can make the job fail after every job succeeded.
    dist.barrier()


def _tell_where_reports_went(ctx: RankContext, out: Path) -> None:
    """Nodes need not share a filesystem: each node's first worker notes where
    global rank 0 wrote the reports, unless that is this node's own --out."""
    here = Elsewhere(host=socket.gethostname(), out=str(out))
    where = [here]
    dist.broadcast_object_list(where, src=0)  # rank 0's entry reaches everyone
    if ctx.rank != 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0 and where[0] != here:
        where[0].write(out)


def _shutdown() -> None:
    """Leave the process group. Both ways out end in ``os._exit`` (torchrun's
    forked workers through multiprocessing, ``python -m`` below), so DDP's
    reducer and gloo's threads are never torn down by interpreter
    finalization, where gloo aborts ("terminate called without an active
    exception"). No garbage collection is needed first: that took 0.35 s of
    every launch."""
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course_lib.jobs.worker")
    parser.add_argument("--run-file", required=True)
    args = parser.parse_args(argv)
    run = RunFile.read(Path(args.run_file), SPECS)
    ctx = None
    try:
        ctx = setup(run)
        ctx.log("ready", process_started=psutil.Process().create_time())
        run_jobs(ctx, run)
        return 0
    except Exception as exc:
        traceback.print_exc()
        if ctx is not None:
            ctx.log("error", job=ctx.describe(), step=ctx.state.update,
                    message=f"{type(exc).__name__}: {exc}",
                    stuck=getattr(exc, "stuck", None),
                    traceback=traceback.format_exc())
            where = f" at step {ctx.state.update}" if ctx.state.update is not None else ""
            print(f"rank {ctx.rank} failed in {ctx.describe()}{where}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        else:
            errorlog.record_setup_error(Path(args.run_file).parent, exc)
        return 1
    finally:
        if ctx is not None:
            ctx.logs.close()
        _shutdown()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter finalization: nothing is left to clean up
