"""The train job: stop at K, the continuous control run, and the resume.

One window per update: count, backprop ``W * S_r / N`` under ``no_sync``,
step. Rank 0 saves the whole trajectory state every ``checkpoint_every``
updates (model, optimizer, sampler position, every rank's RNG). Under
``--max-restarts`` a restarted worker resumes from the newest checkpoint
this launch wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core import checkpoint
from course_lib.core.config import Config
from course_lib.core.data import WindowSampler, load_corpus, locate, make_sampler
from course_lib.core.model import build_model
from course_lib.core.normalize import accumulate_window, window_loss
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports import logs
from course_lib.run import elastic, hooks
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class TrainJob(JobSpec):
    TAG: ClassVar[str] = "train"
    run_dir: str
    label: str
    stop: int
    resume: str | None = None

    def writes_to(self) -> str | None:
        return self.run_dir


@dataclass
class TrainState:
    model: torch.nn.Module
    ddp: DDP
    optimizer: torch.optim.Optimizer
    sampler: WindowSampler
    update: int = 0  # updates done


def fresh_state(ctx: RankContext) -> TrainState:
    """Exactly what a new process starts from: seeded RNGs, initial weights."""
    cfg = ctx.cfg
    random.seed(cfg.seed + ctx.rank)
    torch.manual_seed(cfg.seed + 1000 * (ctx.rank + 1))  # per-rank dropout masks
    if ctx.device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed + 1000 * (ctx.rank + 1))
    model = build_model(cfg).to(ctx.device).train()
    ddp = harness.wrap(ctx, model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr,
                          momentum=cfg.train.momentum)
    return TrainState(model, ddp, opt, make_sampler(cfg, ctx.corpus, ctx.world_size))


def resume_state(ctx: RankContext, path: Path,
                 parts: frozenset[str] = checkpoint.ALL_PARTS) -> TrainState:
    state = fresh_state(ctx)
    trainer = checkpoint.verify(path, cfg=ctx.cfg, data_lock=ctx.corpus.lock,
                                world_size=ctx.world_size)
    checkpoint.load(path, model=state.model, optimizer=state.optimizer,
                    sampler=state.sampler, rank=ctx.rank, device=ctx.device,
                    parts=parts)
    state.update = checkpoint.Trainer.of(trainer).step
    return state


def train_steps(ctx: RankContext, state: TrainState, stop: int, run_dir: Path | None,
                label: str, after_update: Callable[[TrainState], None] | None = None,
                ) -> None:
    cfg, every = ctx.cfg, ctx.cfg.train.checkpoint_every
    # a resumed run counts its own updates: "updates 51-100", 50 of 50
    start = state.update
    task = f"train {label}" + (f" (updates {start + 1}-{stop})" if start else "")
    while state.update < stop:
        ctx.state.update = state.update + 1
        hooks.before_update(ctx.fault, ctx.rank, ctx.state.update)
        layout = state.sampler.next_window()
        micro = harness.microbatches(ctx, layout, ctx.rank)
        stats = accumulate_window(state.ddp, micro, "global_token", ctx.world_size)
        loss = window_loss(stats, ctx.device)
        state.optimizer.step()
        state.update += 1
        # Each rank's line: its own S_r (local_loss_sum) and N_r (local_tokens),
        # the window's N, and loss = sum_r S_r / N, the window's token mean
        # (the same on every rank), before this update's optimizer step.
        ctx.log("step", run=label, step=state.update, window=state.sampler.position - 1,
                local_tokens=stats.local_tokens, global_tokens=stats.global_tokens,
                local_loss_sum=stats.local_loss_sum, loss=loss)
        ctx.progress(task, state.update - start, stop - start)
        if after_update is not None:
            after_update(state)
        if run_dir is not None and (state.update % every == 0 or state.update == stop):
            checkpoint.save(run_dir, state.update, model=state.model,
                            optimizer=state.optimizer, sampler=state.sampler,
                            cfg=cfg, data_lock=ctx.corpus.lock, rank=ctx.rank,
                            world_size=ctx.world_size, device=ctx.device,
                            meta={"backend": ctx.backend, "device": ctx.device.type,
                                  "run": label})
            ctx.log("checkpoint", run=label, step=state.update)


def _reset_train_log(ctx: RankContext, resume_step: int | None) -> None:
    """A fresh run starts a new log; a resumed one keeps steps up to its
    checkpoint, so the log always describes one trajectory."""
    path = ctx.log_path("train")
    if path.exists():
        kept = []
        if resume_step is not None:
            for i, line in enumerate(path.read_text().splitlines()):
                ev = logs.parse(json.loads(line), f"{path.name}:{i + 1}")
                if isinstance(ev, (logs.Step, logs.Checkpoint)) and ev.step <= resume_step:
                    kept.append(line + "\n")
        path.write_text("".join(kept))


def resume_after_restart(ctx: RankContext, spec: TrainJob) -> TrainJob:
    """``spec`` itself on a first attempt; on a torchrun restart, pointed at
    the newest checkpoint this launch wrote (when newer than its own start)."""
    attempt = elastic.restart_count()
    if attempt == 0:
        return spec
    run_dir = Path(spec.run_dir)
    since = float(os.environ.get(elastic.LAUNCHED_AT, "0") or 0)
    found = elastic.resume_point(run_dir, spec.stop, since, cfg=ctx.cfg,
                                 data_lock=ctx.corpus.lock, world_size=ctx.world_size)
    start = checkpoint.step_of(Path(spec.resume)) if spec.resume else 0
    if found is not None and checkpoint.step_of(found) > start:
        spec = dataclasses.replace(spec, resume=str(found))
        start = checkpoint.step_of(found)
    if ctx.rank == 0:
        elastic.record_restart(run_dir, attempt, spec.label, start)
    return spec


def prepare(ctx: RankContext, spec: TrainJob) -> TrainJob:
    """Before the job's first log line: where to resume, and a log that
    describes one trajectory."""
    spec = resume_after_restart(ctx, spec)
    _reset_train_log(ctx, checkpoint.step_of(Path(spec.resume)) if spec.resume else None)
    return spec


def run_rank(ctx: RankContext, spec: TrainJob) -> None:
    if spec.resume:
        state = resume_state(ctx, Path(spec.resume))
        ctx.log("resumed", run=spec.label, step=state.update, path=spec.resume)
    else:
        if ctx.rank == 0:
            # A fresh run owns its run directory's trajectory: checkpoints
            # left by an earlier trajectory must never be resumed from.
            shutil.rmtree(ctx.out / "checkpoints", ignore_errors=True)
        state = fresh_state(ctx)
    train_steps(ctx, state, spec.stop, ctx.out, spec.label)


KIND = JobKind(TrainJob, run_rank, prepare)


# --- the parent side -------------------------------------------------------------


def continuous_dir(out: Path) -> Path:
    """The continuous control run lives beside the main trajectory."""
    return Path(out) / "continuous"


def train_job(run_dir: Path, label: str, stop: int, resume: Path | None = None) -> TrainJob:
    return TrainJob(run_dir=str(Path(run_dir).resolve()), label=label, stop=stop,
                    resume=str(Path(resume).resolve()) if resume else None)


def check_resumable(cfg: Config, path: Path, world_size: int | None = None,
                    data_dir: Path | None = None) -> checkpoint.Trainer:
    """Refuse, before any launch, a checkpoint that does not fit this run."""
    from course_lib.core import paths

    where = locate(cfg, data_dir or paths.data_dir())
    return checkpoint.Trainer.of(checkpoint.verify(
        path, cfg=cfg, data_lock=load_corpus(cfg, where).lock,
        world_size=cfg.with_world_size(world_size).train.world_size))


def train(cfg: Config, out: Path, *, stop_at: int | None = None,
          continuous: bool = False, resume: Path | None = None, **kw: Any) -> Path:
    """One training run; returns its run directory."""
    out = Path(out)
    if continuous:
        job = train_job(continuous_dir(out), "continuous", cfg.train.updates)
    elif resume is not None:
        check_resumable(cfg, resume, kw.get("world_size"), kw.get("data_dir"))
        job = train_job(out, "resume", stop_at or cfg.train.updates, resume)
    else:
        job = train_job(out, "stop", stop_at or cfg.train.stop_at)
    launch(cfg, out, [job], **kw)
    return Path(job.run_dir)


def stop_and_continuous(cfg: Config, out: Path, **kw: Any) -> tuple[Path, Path]:
    """The stopped run and the continuous control, in one launch.

    Both start from scratch (fresh_state), so sharing a process carries
    nothing from one to the other.
    """
    out = Path(out)
    launch(cfg, out, [train_job(out, "stop", cfg.train.stop_at),
                      train_job(continuous_dir(out), "continuous", cfg.train.updates)], **kw)
    return out, continuous_dir(out)
