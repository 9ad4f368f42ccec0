"""The torchrun worker. torchrun forks it from its agent and runs
``worker_entry.py --run-file RUN.json``; ``python -m course_lib.worker
--run-file RUN.json`` is the same worker in an interpreter of its own.

The run file (``jobs.RunFile``, written by ``launch``) holds the resolved
config, the backend, the device and the jobs to run, in order, inside one
launch. Each job type has one function here or in ``checks``:

  ParityJob      DDP gradient vs reference, both modes -> parity.json
  AuditJob       steps x checks -> audit-<step>.json      (checks.job_audit)
  WorldSizeJob   one step's gradient at this W            (checks.job_world_size)
  RecipesJob     the frameworks' recipes, 3 windows -> recipes.json (recipe_audit)
  ExerciseJob    the 12 -> 36 tokens exercise -> exercise.json
  TrainJob       stop / continuous / resume (one window per update)
  AblationsJob   resume-check: full resume vs continuous + ablations
  SmokeJob       one all_reduce, to check the environment
  BenchJob       time windows in both modes -> benchmark.json

Every rank appends JSON lines to ``<out>/logs/<job>-rank<R>.jsonl``; rank 0
writes the reports and prints ``@@progress`` lines for the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import shutil
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import (
    arithmetic,
    checkpoint,
    checks,
    elastic,
    errorlog,
    faults,
    jobs,
    progress,
    recipe_audit,
    reports,
    window,
)
from .config import Config, from_dict
from .data import Corpus, load_corpus, make_sampler, parity_window
from .model import build_model, loss_sum
from .normalize import MODES, accumulate_window
from .prctl import die_with_parent, name_worker
from .steps import BUILTIN


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
    audited: str | None = None  # the step function under audit
    check: str | None = None
    step_timeout: float = 60.0  # seconds a rank waits for the others after a step
    fences: int = 0
    _logs: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)

    def describe(self) -> str:
        """The job, plus the audited step and check when there is one."""
        parts = [f"step {self.audited}" if self.audited else "",
                 f"check {self.check}" if self.check else ""]
        inner = ", ".join(p for p in parts if p)
        return f"{self.job} ({inner})" if inner else self.job

    def parity_layout(self) -> window.Layout:
        """The plan's window at ``parity.step``, for this launch's world size."""
        if "parity_layout" not in self._cache:
            self._cache["parity_layout"] = parity_window(self.cfg, self.corpus,
                                                         self.world_size)
        return self._cache["parity_layout"]

    def parity_reference(self) -> window.Reference:
        """Rank 0 only: the reference gradient of the parity window."""
        if "parity_reference" not in self._cache:
            self._cache["parity_reference"] = window.reference(self, self.parity_layout())
        return self._cache["parity_reference"]

    def log_path(self, job: str | None = None) -> Path:
        return self.out / "logs" / f"{job or self.job}-rank{self.rank}.jsonl"

    def log(self, event: str, **fields) -> None:
        path = self.log_path()
        f = self._logs.get(path)
        if f is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._logs[path] = open(path, "a")  # noqa: SIM115 (kept open)
        where = {"where": self.describe()} if self.audited or self.check else {}
        f.write(json.dumps({"event": event, "job": self.job, "rank": self.rank,
                            "time": time.time(), **where, **fields}) + "\n")
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


def setup(run: jobs.RunFile) -> Ctx:
    die_with_parent()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    name_worker(rank)
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = run.backend
    if run.device == "cuda":
        # NCCL: one GPU per rank. gloo on CUDA may share GPUs between ranks.
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=run.collective_timeout),
        device_id=device if backend == "nccl" else None,
    )
    cfg = from_dict(run.config)
    corpus = load_corpus(cfg, Path(run.data_dir))
    return Ctx(cfg, rank, world_size, backend, device, Path(run.out), corpus,
               run.fault or {})


# --- jobs ----------------------------------------------------------------------


def job_parity(ctx: Ctx, spec: jobs.ParityJob) -> None:
    """global_token and mean_of_means on the parity window: parity + no_sync."""
    found, outcomes = {}, {}
    for i, mode in enumerate(MODES):
        ctx.audited = mode
        auditor = checks.Auditor(ctx, BUILTIN[mode])
        found[mode] = auditor.run(("parity", "no_sync"))
        outcomes[mode] = auditor.base()
        ctx.log("mode_done", mode=mode, local_tokens=outcomes[mode].local_tokens,
                agree_after_micro=outcomes[mode].agree_after_micro)
        ctx.progress("parity", i + 1, len(MODES) + 1)
    ctx.audited = None
    if ctx.rank == 0:
        ref = ctx.parity_reference()
        atol, rtol = window.tolerance(ctx.cfg)
        modes = {m: reports.ModeResult(**window.compare_ranks(
            outcomes[m].grads, ref.grad, atol, rtol)) for m in MODES}
        single = ctx.world_size == 1
        reports.save(ctx.out, "parity", reports.ParityReport(
            **ctx.header(),
            compared_values=int(ref.grad.numel()), atol=atol, rtol=rtol,
            step=ctx.cfg.parity.step,
            local_tokens=outcomes["global_token"].local_tokens,
            global_tokens=ref.tokens, window_loss_per_token=ref.loss_per_token,
            modes=modes,
            no_sync={m: {"ranks_agree_after_micro": outcomes[m].agree_after_micro}
                     for m in MODES},
            grad_sample=_grad_sample({m: o.grads[0] for m, o in outcomes.items()},
                                     ref.grad),
            passed=modes["global_token"].allclose
            and (single or not modes["mean_of_means"].allclose),
            control=("not applicable: with one rank the two modes coincide"
                     if single else "mean_of_means must fail"),
        ))
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
    ddp = window.wrap(ctx, model)
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
        layout = state.sampler.next_window()
        micro = window.microbatches(ctx, layout, ctx.rank)
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


def job_train(ctx: Ctx, spec: jobs.TrainJob) -> None:
    if spec.resume:
        state = resume_state(ctx, Path(spec.resume))
        ctx.log("resumed", run=spec.label, step=state.step, path=spec.resume)
    else:
        if ctx.rank == 0:
            # A fresh run owns its run directory's trajectory: checkpoints
            # left by an earlier trajectory must never be resumed from.
            shutil.rmtree(ctx.out / "checkpoints", ignore_errors=True)
        state = fresh_state(ctx)
    train_steps(ctx, state, spec.stop, ctx.out, spec.label)


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


def job_ablations(ctx: Ctx, spec: jobs.AblationsJob) -> None:
    """resume-check: the full resume, then each ablation, vs the continuous run."""
    cfg = ctx.cfg
    resume_from = Path(spec.resume_from)
    continuous = Path(spec.continuous)
    resumed = Path(spec.resumed)
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


def job_exercise(ctx: Ctx, spec: jobs.ExerciseJob) -> None:
    cfg = from_dict(spec.config)
    ex, atol, rtol = cfg.exercise, *window.tolerance(cfg)
    ex_ctx = dataclasses.replace(ctx, cfg=cfg)
    layout = [[[r]] for r in range(ctx.world_size)]  # rank r: sequence r
    results = []
    for i, sc in enumerate(ex.scenarios):
        seqs = _exercise_sequences(cfg, ctx.corpus, sc.tokens)
        scratch = Corpus(tuple(tuple(s) for s in seqs), {}, ctx.corpus.source, "")
        micro = window.microbatches(ex_ctx, layout, ctx.rank, scratch)
        grads = {}
        for mode in MODES:
            step = BUILTIN[mode]
            ddp = window.fresh_ddp(ex_ctx, step)
            grads[mode] = window.run_step(ex_ctx, step, ddp, micro).grads
        with torch.no_grad():
            (inputs, labels), = micro
            model = build_model(cfg).to(ctx.device).eval()
            loss_sums = window.gather_floats(float(loss_sum(model(inputs), labels)),
                                             ctx.device)
        if ctx.rank == 0:
            ref = window.reference(ex_ctx, layout, corpus=scratch)
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
                    "global_mean": ref.loss_per_token,
                },
                "gradients": {
                    "compared_values": int(ref.grad.numel()),
                    **{m: window.compare_ranks(grads[m], ref.grad, atol, rtol)
                       for m in MODES},
                },
            })
        ctx.progress("exercise", i + 1, len(ex.scenarios))
    if ctx.rank == 0:
        reports.write(ctx.out, "exercise", {**ctx.header(), "scenarios": results,
                                            "atol": atol, "rtol": rtol})


def job_smoke(ctx: Ctx, spec: jobs.SmokeJob) -> None:
    t = torch.tensor([ctx.rank + 1], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    expected = ctx.world_size * (ctx.world_size + 1) // 2
    if int(t) != expected:
        raise RuntimeError(f"all_reduce gave {int(t)}, expected {expected}")
    ctx.log("smoke", device=str(ctx.device), all_reduce=int(t))
    if ctx.rank == 0:
        reports.write(ctx.out, "environment", {**ctx.header(), "all_reduce": int(t)})
    ctx.progress("smoke", 1, 1)


def job_bench(ctx: Ctx, spec: jobs.BenchJob) -> None:
    """Time whole windows (forward, backward, DDP sync) in both modes.

    Modes alternate window by window over the same windows, so drift and
    warm-up hit both alike. With ``spec.alone``, each round then times every
    rank's share of that window alone: rank 0 runs the shares one after the
    other on a plain model (no DDP, no collective), while the other ranks
    wait at a barrier. The machine's speed drifts within seconds, so the
    floor is timed between the windows it is the floor of. Rank 0 writes the
    medians to benchmark.json.
    """
    cfg = ctx.cfg
    model = build_model(cfg).to(ctx.device).train()
    ddp = window.wrap(ctx, model)
    sampler = make_sampler(cfg, ctx.corpus, ctx.world_size)
    layouts = [sampler.next_window() for _ in range(spec.windows)]
    windows = [window.microbatches(ctx, layout, ctx.rank) for layout in layouts]
    # Every rank's share of every window, for rank 0 to time alone.
    shares = [[window.microbatches(ctx, layout, r) for r in range(ctx.world_size)]
              for layout in layouts] if spec.alone and ctx.rank == 0 else []
    # Not `model`: DDP's hooks sit on its parameters.
    plain = build_model(cfg).to(ctx.device).train() if shares else None
    times: dict[str, list[float]] = {m: [] for m in MODES}
    alone: list[list[float]] = [[] for _ in range(ctx.world_size)]
    for i in range(spec.warmup + spec.repeats):
        timed = i >= spec.warmup
        for mode in (MODES if i % 2 else MODES[::-1]):
            dist.barrier()
            seconds = _window_seconds(ctx, ddp, windows[i % len(windows)], mode)
            if timed:
                times[mode].append(seconds)
        if spec.alone:
            dist.barrier()
            # The local mean keeps the window's arithmetic without its count
            # all_reduce, which the waiting ranks would never join.
            for rank, micro in enumerate(shares[i % len(shares)] if shares else []):
                seconds = _window_seconds(ctx, plain, micro, "mean_of_means")
                if timed:
                    alone[rank].append(seconds)
            dist.barrier()
        ctx.progress("bench", i + 1, spec.warmup + spec.repeats)
    if ctx.rank == 0:
        med = {m: statistics.median(t) for m, t in times.items()}
        # Round by round, so a reader can pair each window with its floor.
        extra = {"alone_seconds": alone, "global_token_seconds": times["global_token"]
                 } if spec.alone else {}
        reports.write(ctx.out, "benchmark", {
            **ctx.header(),
            "windows_timed_per_mode": spec.repeats,
            "median_seconds": med,
            "ratio_global_over_mean_of_means": med["global_token"] / med["mean_of_means"],
            **extra,
        })


def _window_seconds(ctx: Ctx, model: torch.nn.Module, micro, mode: str) -> float:
    started = time.perf_counter()
    accumulate_window(model, micro, mode, ctx.world_size)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return time.perf_counter() - started


JOBS = {
    jobs.ParityJob: job_parity,
    jobs.AuditJob: checks.job_audit,
    jobs.WorldSizeJob: checks.job_world_size,
    jobs.RecipesJob: recipe_audit.job_recipes,
    jobs.ExerciseJob: job_exercise,
    jobs.TrainJob: job_train,
    jobs.AblationsJob: job_ablations,
    jobs.SmokeJob: job_smoke,
    jobs.BenchJob: job_bench,
}


def run_jobs(ctx: Ctx, specs: list[jobs.Job]) -> None:
    base_out = ctx.out
    for spec in specs:
        spec = elastic.resume_after_restart(ctx, spec)
        ctx.out = Path(jobs.run_dir_of(spec) or base_out)
        ctx.job, ctx.step = jobs.tag(spec), None
        if isinstance(spec, jobs.TrainJob):
            _reset_train_log(ctx, int(Path(spec.resume).name[5:]) if spec.resume else None)
        ctx.log("start", spec=jobs.job_to_dict(spec))
        JOBS[type(spec)](ctx, spec)
        ctx.log("done")
    _tell_where_reports_went(ctx, base_out)
    # Leave together: a rank that tears down while another still writes its
    # report can make the job fail after every job succeeded.
    dist.barrier()


def _tell_where_reports_went(ctx: Ctx, out: Path) -> None:
    """Nodes need not share a filesystem: each node's first worker notes where
    global rank 0 wrote the reports, unless that is this node's own --out."""
    where = [{"host": socket.gethostname(), "out": str(out)}]
    dist.broadcast_object_list(where, src=0)  # rank 0's entry reaches everyone
    here = {"host": socket.gethostname(), "out": str(out)}
    if ctx.rank != 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0 and where[0] != here:
        path = reports.location_path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(where[0]))


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
    parser = argparse.ArgumentParser(prog="course_lib.worker")
    parser.add_argument("--run-file", required=True)
    args = parser.parse_args(argv)
    run = jobs.RunFile.read(Path(args.run_file))
    ctx = None
    try:
        ctx = setup(run)
        ctx.log("ready", process_started=psutil.Process().create_time())
        run_jobs(ctx, run.jobs)
        return 0
    except Exception as exc:
        traceback.print_exc()
        if ctx is not None:
            ctx.log("error", job=ctx.describe(), step=ctx.step,
                    message=f"{type(exc).__name__}: {exc}",
                    stuck=getattr(exc, "stuck", None),
                    traceback=traceback.format_exc())
            where = f" at step {ctx.step}" if ctx.step is not None else ""
            print(f"rank {ctx.rank} failed in {ctx.describe()}{where}: "
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
