"""torchrun entry point: ``python -m course_lib.worker --run-file RUN.json``.

The run file (written by ``launch``) holds the resolved config, the backend,
the device and the jobs to run, in order, inside one launch:

  parity                  DDP gradient vs reference, both modes -> parity.json
  exercise                the 12 -> 36 tokens exercise -> exercise.json
  train                   stop / continuous / resume (one window per update)
  ablations               resume-check: full resume vs continuous + ablations
  smoke                   one all_reduce, to check the environment
  bench                   time windows in both modes -> benchmark.json

Every rank appends JSON lines to ``<out>/logs/<job>-rank<R>.jsonl``; rank 0
writes the reports and prints ``@@progress`` lines for the launcher.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import random
import shutil
import signal
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import arithmetic, checkpoint, elastic, errorlog, faults, progress, reports
from .config import Config, from_dict
from .data import Corpus, collate, load_corpus, make_sampler
from .model import build_model
from .normalize import MODES, accumulate_window
from .reference import compare, flat_grad, reference_gradient


@dataclass
class Ctx:
    cfg: Config
    rank: int
    world_size: int
    backend: str
    device: torch.device
    out: Path
    corpus: Corpus
    fault: dict = field(default_factory=dict)
    job: str = "setup"
    step: int | None = None
    _logs: dict = field(default_factory=dict)

    def log_path(self, job: str | None = None) -> Path:
        return self.out / "logs" / f"{job or self.job}-rank{self.rank}.jsonl"

    def log(self, event: str, **fields) -> None:
        path = self.log_path()
        f = self._logs.get(path)
        if f is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._logs[path] = open(path, "a")  # noqa: SIM115 (kept open)
        f.write(json.dumps({"event": event, "job": self.job, "rank": self.rank,
                            "time": time.time(), **fields}) + "\n")
        f.flush()

    def close(self) -> None:
        for f in self._logs.values():
            f.close()
        self._logs.clear()

    def progress(self, task: str, done: int, total: int) -> None:
        if self.rank == 0:
            progress.emit(task, done, total)

    def header(self) -> dict:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "device": self.device.type,
            "dtype": self.cfg.train.dtype,
            "nccl_reference_path": self.backend == "nccl" and self.world_size >= 2,
            "torch": torch.__version__,
        }


# --- set-up ------------------------------------------------------------------


def _die_with_parent() -> None:
    """torchrun starts workers in their own sessions; if torchrun itself is
    SIGKILLed they would outlive it. Ask Linux to kill us with our parent."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def setup(run: dict) -> Ctx:
    _die_with_parent()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = run["backend"]
    if run["device"] == "cuda":
        # NCCL: one GPU per rank. gloo on CUDA may share GPUs between ranks.
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=run.get("collective_timeout", 120)),
        device_id=device if backend == "nccl" else None,
    )
    cfg = from_dict(run["config"])
    corpus = load_corpus(cfg, Path(run["data_dir"]))
    ctx = Ctx(cfg, rank, world_size, backend, device, Path(run["out"]), corpus,
              run.get("fault") or {})
    return ctx


def _wrap(ctx: Ctx, model: torch.nn.Module) -> DDP:
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def _rank_microbatches(ctx: Ctx, cfg: Config, window, rank: int) -> list:
    supervised = rank not in cfg.train.empty_ranks
    return [collate(ctx.corpus, ids, supervised, ctx.device) for ids in window[rank]]


def _gather_ints(value: int, device: torch.device) -> list[int]:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [int(x) for x in out]


class NoSyncProbe:
    """After each microbatch: do all ranks hold bitwise the same gradients?"""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.agree: list[bool] = []

    def __call__(self, index: int) -> None:
        g = flat_grad(self.model)
        everyone = [torch.empty_like(g) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, g)
        self.agree.append(all(torch.equal(everyone[0], x) for x in everyone[1:]))


# --- jobs ----------------------------------------------------------------------


def job_parity(ctx: Ctx) -> None:
    cfg = ctx.cfg
    sampler = make_sampler(cfg, ctx.corpus, ctx.world_size)
    for _ in range(cfg.parity.step + 1):
        window = sampler.next_window()
    model = build_model(cfg).to(ctx.device).eval()  # eval: no dropout masks
    ddp = _wrap(ctx, model)
    micro = _rank_microbatches(ctx, cfg, window, ctx.rank)
    grads, probes, stats = {}, {}, {}
    for i, mode in enumerate(MODES):
        probe = NoSyncProbe(model)
        stats[mode] = accumulate_window(ddp, micro, mode, ctx.world_size,
                                        on_micro_end=probe)
        grads[mode] = flat_grad(model).double().cpu()
        probes[mode] = probe.agree
        ctx.log("mode_done", mode=mode, local_tokens=stats[mode].local_tokens,
                agree_after_micro=probe.agree)
        ctx.progress("parity", i + 1, len(MODES) + 1)
    local_tokens = _gather_ints(stats["global_token"].local_tokens, ctx.device)
    if ctx.rank == 0:
        everything = [
            mb for r in range(ctx.world_size)
            for mb in _rank_microbatches(ctx, cfg, window, r)
        ]
        ref_model = build_model(cfg).to(ctx.device).eval()
        ref, n, loss = reference_gradient(ref_model, everything)
        ref = ref.double().cpu()
        p = cfg.parity
        modes = {m: compare(grads[m].to(ref.dtype), ref, p.atol, p.rtol) for m in MODES}
        single = ctx.world_size == 1
        report = {
            **ctx.header(),
            "compared_values": int(ref.numel()),
            "atol": p.atol,
            "rtol": p.rtol,
            "step": p.step,
            "local_tokens": local_tokens,
            "global_tokens": n,
            "window_loss_per_token": loss,
            "modes": modes,
            "no_sync": {m: {"ranks_agree_after_micro": probes[m]} for m in MODES},
            "control": (
                "not applicable: with one rank the two modes coincide"
                if single else "mean_of_means must fail"
            ),
            "passed": modes["global_token"]["allclose"]
            and (single or not modes["mean_of_means"]["allclose"]),
            "grad_sample": _grad_sample(grads, ref),
        }
        reports.write(ctx.out, "parity", report)
    ctx.progress("parity", len(MODES) + 1, len(MODES) + 1)


def _grad_sample(grads: dict, ref: torch.Tensor, size: int = 2000) -> dict:
    """An evenly spaced subset of components, for the notebook's scatter plot."""
    idx = torch.linspace(0, ref.numel() - 1, min(size, ref.numel())).long()
    return {"index": idx.tolist(), "reference": ref[idx].tolist(),
            **{m: g[idx].tolist() for m, g in grads.items()}}


@dataclass
class TrainState:
    model: torch.nn.Module
    ddp: DDP
    optimizer: torch.optim.Optimizer
    sampler: object
    step: int = 0


def fresh_state(ctx: Ctx) -> TrainState:
    """Exactly what a new process starts from: seeded RNGs, initial weights."""
    cfg = ctx.cfg
    random.seed(cfg.seed + ctx.rank)
    torch.manual_seed(cfg.seed + 1000 * (ctx.rank + 1))  # per-rank dropout masks
    if ctx.device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed + 1000 * (ctx.rank + 1))
    model = build_model(cfg).to(ctx.device).train()
    ddp = _wrap(ctx, model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr,
                          momentum=cfg.train.momentum)
    return TrainState(model, ddp, opt, make_sampler(cfg, ctx.corpus, ctx.world_size))


def resume_state(ctx: Ctx, path: Path, parts=checkpoint.ALL_PARTS) -> TrainState:
    state = fresh_state(ctx)
    trainer = checkpoint.verify(path, cfg=ctx.cfg, data_lock=ctx.corpus.lock,
                                world_size=ctx.world_size)
    checkpoint.load(path, model=state.model, optimizer=state.optimizer,
                    sampler=state.sampler, rank=ctx.rank, device=ctx.device,
                    parts=parts)
    state.step = trainer["step"]
    return state


def _maybe_fault(ctx: Ctx, step: int) -> None:
    f = ctx.fault
    if not f:
        return
    if f.get("delay"):
        time.sleep(float(f["delay"]))
    faults.inject(f, ctx.rank, step)
    if f.get("kind") == "crash" and f.get("rank") == ctx.rank and f.get("step") == step:
        raise RuntimeError(f"injected fault: rank {ctx.rank} crashes at step {step}")


def train_steps(ctx: Ctx, state: TrainState, stop: int, run_dir: Path | None,
                label: str) -> None:
    cfg, every = ctx.cfg, ctx.cfg.train.checkpoint_every
    while state.step < stop:
        ctx.step = state.step + 1
        _maybe_fault(ctx, ctx.step)
        window = state.sampler.next_window()
        micro = _rank_microbatches(ctx, cfg, window, ctx.rank)
        stats = accumulate_window(state.ddp, micro, "global_token", ctx.world_size)
        state.optimizer.step()
        state.step += 1
        ctx.log("step", run=label, step=state.step, window=state.sampler.position - 1,
                local_tokens=stats.local_tokens, global_tokens=stats.global_tokens,
                local_loss_sum=stats.local_loss_sum)
        ctx.progress(f"train {label}", state.step, stop)
        if run_dir is not None and (state.step % every == 0 or state.step == stop):
            checkpoint.save(run_dir, state.step, model=state.model,
                            optimizer=state.optimizer, sampler=state.sampler,
                            cfg=cfg, data_lock=ctx.corpus.lock, rank=ctx.rank,
                            world_size=ctx.world_size, device=ctx.device,
                            meta={"backend": ctx.backend, "device": ctx.device.type,
                                  "run": label})
            ctx.log("checkpoint", run=label, step=state.step)


def _reset_train_log(ctx: Ctx, resume_step: int | None) -> None:
    """A fresh run starts a new log; a resumed one keeps steps up to its
    checkpoint, so the log always describes one trajectory."""
    path = ctx.log_path("train")
    if path.exists():
        kept = []
        if resume_step is not None:
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec["event"] in ("step", "checkpoint") and rec["step"] <= resume_step:
                    kept.append(line + "\n")
        path.write_text("".join(kept))


def job_train(ctx: Ctx, spec: dict) -> None:
    if spec.get("resume"):
        state = resume_state(ctx, Path(spec["resume"]))
        ctx.log("resumed", run=spec["label"], step=state.step, path=spec["resume"])
    else:
        if ctx.rank == 0:
            # A fresh run owns its run directory's trajectory: checkpoints
            # left by an earlier trajectory must never be resumed from.
            shutil.rmtree(ctx.out / "checkpoints", ignore_errors=True)
        state = fresh_state(ctx)
    train_steps(ctx, state, spec["stop"], ctx.out, spec["label"])


ABLATIONS = {
    "weights_only": (
        {"model"},
        "momentum buffers, sampler position and RNG states all restart",
    ),
    "no_optimizer_state": (
        checkpoint.ALL_PARTS - {"optimizer"},
        "SGD momentum restarts from zero at the resume step",
    ),
    "sampler_from_seed": (
        checkpoint.ALL_PARTS - {"sampler"},
        "the sampler is re-seeded, so it replays windows 1, 2, ... "
        "instead of drawing the windows after the resume step",
    ),
    "no_rng_state": (
        checkpoint.ALL_PARTS - {"rng"},
        "per-rank torch RNGs restart from their seeds, so dropout masks "
        "differ from the continuous run's",
    ),
}


def job_ablations(ctx: Ctx, spec: dict) -> None:
    """resume-check: the full resume, then each ablation, vs the continuous run."""
    cfg = ctx.cfg
    resume_from = Path(spec["resume_from"])
    continuous = Path(spec["continuous"])
    resumed = Path(spec["resumed"])
    target = checkpoint.load_params(continuous)
    results = {}
    for name, (parts, why) in ABLATIONS.items():
        state = resume_state(ctx, resume_from, parts)
        start, drawn_before = state.step, state.sampler.position
        train_steps(ctx, state, cfg.train.updates, None, f"ablation:{name}")
        if ctx.rank == 0:
            params = {k: v.detach().cpu() for k, v in state.model.state_dict().items()}
            cmp = checkpoint.compare_params(params, target)
            results[name] = {
                "restored": sorted(parts),
                "max_abs_param_diff": cmp["max_abs_param_diff"],
                "identical": cmp["identical"],
                "matters": not cmp["identical"],
                "why": why,
                "first_window_after_resume": drawn_before + 1,
                "window_expected_after_resume": start + 1,
            }
    if ctx.rank == 0:
        full = checkpoint.compare_params(checkpoint.load_params(resumed), target)
        report = {
            **ctx.header(),
            "step": cfg.train.updates,
            "resumed_from_step": int(resume_from.name.split("-")[1]),
            "compared_values": full["compared_values"],
            "max_abs_param_diff": full["max_abs_param_diff"],
            "identical": full["identical"],
            "resumed": str(resumed.relative_to(ctx.out)),
            "continuous": str(continuous.relative_to(ctx.out)),
            "ablations": results,
            "every_ablation_matters": all(r["matters"] for r in results.values()),
        }
        reports.write(ctx.out, "resume", report)


def _exercise_sequences(cfg: Config, corpus: Corpus, tokens) -> list[list[int]]:
    """Rank r's sequence: a prefix of one fixed draw, so rank 0 keeps its 12
    tokens and rank 1's 36-token sequence extends its 12-token one."""
    longest = max(tokens) + 1
    seqs = []
    for r, n in enumerate(tokens):
        rng = random.Random(cfg.seed + 100 + r)
        seqs.append(corpus.source.sample(rng, longest)[: n + 1])
    return seqs


def job_exercise(ctx: Ctx, spec: dict) -> None:
    cfg = from_dict(spec["config"])
    ex = cfg.exercise
    results = []
    for i, sc in enumerate(ex.scenarios):
        seqs = _exercise_sequences(cfg, ctx.corpus, sc.tokens)
        scratch = Corpus(tuple(tuple(s) for s in seqs), {}, ctx.corpus.source, "")
        micro = [collate(scratch, [ctx.rank], True, ctx.device)]
        model = build_model(cfg).to(ctx.device).eval()
        ddp = _wrap(ctx, model)
        grads = {}
        for mode in MODES:
            stats = accumulate_window(ddp, micro, mode, ctx.world_size)
            grads[mode] = flat_grad(model).double().cpu()
        loss_sums = _gather_floats(stats.local_loss_sum, ctx.device)
        if ctx.rank == 0:
            everything = [collate(scratch, [r], True, ctx.device)
                          for r in range(ctx.world_size)]
            ref, n, model_global = reference_gradient(
                build_model(cfg).to(ctx.device).eval(), everything)
            ref = ref.double().cpu()
            sums = [n_r * loss for n_r, loss in
                    zip(sc.tokens, ex.per_token_loss, strict=True)]
            results.append({
                "name": sc.name,
                "tokens": list(sc.tokens),
                "per_token_loss": list(ex.per_token_loss),
                "loss_sums": sums,
                "mean_of_means": arithmetic.mean_of_means(sums, sc.tokens),
                "global_mean": arithmetic.global_mean(sums, sc.tokens),
                "model": {
                    "local_loss_sums": loss_sums,
                    "mean_of_means": arithmetic.mean_of_means(loss_sums, sc.tokens),
                    "global_mean": model_global,
                },
                "gradients": {
                    "compared_values": int(ref.numel()),
                    **{m: compare(grads[m], ref, cfg.parity.atol, cfg.parity.rtol)
                       for m in MODES},
                },
            })
        ctx.progress("exercise", i + 1, len(ex.scenarios))
    if ctx.rank == 0:
        reports.write(ctx.out, "exercise", {**ctx.header(), "scenarios": results,
                                            "atol": cfg.parity.atol,
                                            "rtol": cfg.parity.rtol})


def _gather_floats(value: float, device: torch.device) -> list[float]:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x) for x in out]


def job_smoke(ctx: Ctx) -> None:
    t = torch.tensor([ctx.rank + 1], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    expected = ctx.world_size * (ctx.world_size + 1) // 2
    if int(t) != expected:
        raise RuntimeError(f"all_reduce gave {int(t)}, expected {expected}")
    ctx.log("smoke", device=str(ctx.device), all_reduce=int(t))
    if ctx.rank == 0:
        reports.write(ctx.out, "environment", {**ctx.header(), "all_reduce": int(t)})
    ctx.progress("smoke", 1, 1)


def job_bench(ctx: Ctx, spec: dict) -> None:
    """Time whole windows (forward, backward, DDP sync) in both modes.

    Modes alternate window by window over the same windows, so drift and
    warm-up hit both alike. Rank 0 writes the medians to benchmark.json.
    """
    cfg = ctx.cfg
    model = build_model(cfg).to(ctx.device).train()
    ddp = _wrap(ctx, model)
    sampler = make_sampler(cfg, ctx.corpus, ctx.world_size)
    windows = [_rank_microbatches(ctx, cfg, sampler.next_window(), ctx.rank)
               for _ in range(spec["windows"])]
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(spec["warmup"] + spec["repeats"]):
        micro = windows[i % len(windows)]
        for mode in (MODES if i % 2 else MODES[::-1]):
            dist.barrier()
            started = time.perf_counter()
            accumulate_window(ddp, micro, mode, ctx.world_size)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            if i >= spec["warmup"]:
                times[mode].append(time.perf_counter() - started)
        ctx.progress("bench", i + 1, spec["warmup"] + spec["repeats"])
    if ctx.rank == 0:
        med = {m: statistics.median(t) for m, t in times.items()}
        reports.write(ctx.out, "benchmark", {
            **ctx.header(),
            "windows_timed_per_mode": spec["repeats"],
            "median_seconds": med,
            "ratio_global_over_mean_of_means": med["global_token"] / med["mean_of_means"],
        })


def run_jobs(ctx: Ctx, jobs: list[dict]) -> None:
    base_out = ctx.out
    for spec in jobs:
        spec = elastic.resume_after_restart(ctx, spec)
        ctx.out = Path(spec.get("run_dir", base_out))
        ctx.job, ctx.step = spec["job"], None
        if spec["job"] == "train":
            resume = spec.get("resume")
            _reset_train_log(ctx, int(Path(resume).name[5:]) if resume else None)
        ctx.log("start", spec=spec)
        if spec["job"] == "parity":
            job_parity(ctx)
        elif spec["job"] == "train":
            job_train(ctx, spec)
        elif spec["job"] == "ablations":
            job_ablations(ctx, spec)
        elif spec["job"] == "exercise":
            job_exercise(ctx, spec)
        elif spec["job"] == "smoke":
            job_smoke(ctx)
        elif spec["job"] == "bench":
            job_bench(ctx, spec)
        else:
            raise ValueError(f"unknown job {spec['job']!r}")
        ctx.log("done")
    # Leave together: a rank that tears down while another still writes its
    # report can make the job fail after every job succeeded.
    dist.barrier()


def _shutdown() -> None:
    """Tear the process group down while the interpreter is fully alive.

    DDP's reducer keeps the gloo group alive; if it is only collected during
    interpreter finalization, gloo's threads die with "terminate called
    without an active exception" (SIGABRT) after every job succeeded.
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course_lib.worker")
    parser.add_argument("--run-file", required=True)
    args = parser.parse_args(argv)
    run = json.loads(Path(args.run_file).read_text())
    ctx = None
    try:
        ctx = setup(run)
        run_jobs(ctx, run["jobs"])
        return 0
    except Exception as exc:
        traceback.print_exc()
        if ctx is not None:
            ctx.log("error", step=ctx.step, message=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc())
            where = f" at step {ctx.step}" if ctx.step is not None else ""
            print(f"rank {ctx.rank} failed in {ctx.job}{where}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        else:
            errorlog.record_setup_error(Path(args.run_file).parent, exc)
        return 1
    finally:
        if ctx is not None:
            ctx.close()
        _shutdown()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter finalization: nothing is left to clean up
