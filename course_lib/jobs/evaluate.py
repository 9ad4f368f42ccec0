"""The evaluate job: a checkpoint on the test split, on W ranks, as a
learner's evaluation loop runs it -> reports/evaluation.json.

Each rank scores the sequences ``DistributedSampler`` hands it. Three ways
to combine the ranks are reported side by side:

- ``token_weighted``: the ranks' sums and counts all-reduced, the sampler's
  padded repeats dropped first: the mean over all test tokens, equal to the
  single-process evaluation up to float64 round-off;
- ``duplicates_kept``: the same sums with the repeats counted;
- ``mean_of_rank_means``: each rank's own mean over its share, the repeats
  left out, averaged over the ranks (the mean of means again, at
  evaluation; without the repeats, so that it shows that one error alone).

Rank 0 also evaluates in one process, to hold the token-weighted value to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from course_lib.core import checkpoint, paths
from course_lib.core.config import Config
from course_lib.core.data import Corpus, load_corpus, locate
from course_lib.core.evaluate import RTOL, Score, bayes_accuracy, evaluate, score, shard
from course_lib.core.model import build_model
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report
from course_lib.run.runfile import JobSpec


@dataclass(frozen=True)
class EvaluateJob(JobSpec):
    TAG: ClassVar[str] = "evaluate"
    checkpoint: str  # absolute


@dataclass(frozen=True)
class RankShard:
    """What one rank's sampler gave it."""

    sequences: int
    repeats: int  # of them, padded repeats of sequences scored elsewhere
    tokens: int  # duplicates included, as the rank's own loop counts them
    loss_per_token: float  # this rank's own mean, its repeats left out


@dataclass(frozen=True)
class DistributedEvaluation:
    world_size: int
    repeats: int  # sequences DistributedSampler added so that W divides the set
    token_weighted: Score
    duplicates_kept: Score
    mean_of_rank_means: Score
    single_process: Score
    max_abs_diff: float  # token_weighted against single_process, loss or accuracy
    rtol: float
    matches_single_process: bool
    ranks: list[RankShard]


@dataclass(frozen=True)
class EvaluationReport(Report):
    """A checkpoint on the test split, beside the untrained model and the
    entropy floor -> reports/evaluation.json. ``loss_per_token`` and
    ``token_accuracy`` are the token mean over the whole test split: the
    single-process value, or with W ranks the token-weighted one."""

    NAME: ClassVar[str] = "evaluation"
    device: str
    backend: str
    checkpoint: str
    step: int
    test_sequences: int
    test_tokens: int
    loss_per_token: float
    token_accuracy: float
    entropy_floor: float
    bayes_accuracy: float
    untrained: Score
    above_floor_by: float
    world_size: int = 1
    distributed: DistributedEvaluation | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def beats_untrained(self) -> bool:
        """Better by more than round-off: W ranks add in another order."""
        u = self.untrained.loss_per_token
        return self.loss_per_token < u - RTOL * abs(u)


def shown(ckpt: Path, out: Path) -> str:
    """The checkpoint as the report names it: relative to ``out`` when it
    lies inside, absolute otherwise."""
    ckpt, out = Path(ckpt).resolve(), Path(out).resolve()
    return str(ckpt.relative_to(out)) if ckpt.is_relative_to(out) else str(ckpt)


def trained_model(cfg: Config, ckpt: Path) -> torch.nn.Module:
    """The checkpoint's weights in this config's model; one line when they do not fit."""
    model = build_model(cfg)
    try:
        model.load_state_dict(checkpoint.load_params(ckpt))
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)]
        raise checkpoint.CheckpointError(
            f"{Path(ckpt).name}: its weights do not fit this config's model "
            f"({first[0].strip()})") from None
    return model


def report(cfg: Config, corpus: Corpus, model: torch.nn.Module, ckpt: Path, out: Path,
           step: int, header: dict[str, Any], single: dict | None = None,
           distributed: DistributedEvaluation | None = None) -> EvaluationReport:
    """The report, around the trained model's token-weighted score: the
    distributed one when given, else the single-process one."""
    single = single or evaluate(model, corpus)
    trained = distributed.token_weighted if distributed else Score(
        single["loss_per_token"], single["token_accuracy"])
    untrained = evaluate(build_model(cfg), corpus)
    return EvaluationReport(
        device=header["device"], backend=header["backend"], checkpoint=shown(ckpt, out),
        step=step, test_sequences=single["sequences"], test_tokens=single["tokens"],
        loss_per_token=trained.loss_per_token, token_accuracy=trained.token_accuracy,
        entropy_floor=corpus.entropy_floor, bayes_accuracy=bayes_accuracy(corpus),
        untrained=Score(untrained["loss_per_token"], untrained["token_accuracy"]),
        above_floor_by=trained.loss_per_token - corpus.entropy_floor,
        world_size=header.get("world_size", 1), distributed=distributed)


def run_rank(ctx: RankContext, spec: EvaluateJob) -> None:
    ckpt = Path(spec.checkpoint)
    step = checkpoint.verify(ckpt, data_lock=ctx.corpus.lock)["step"]
    model = trained_model(ctx.cfg, ckpt)
    ids = ctx.corpus.splits["test"]
    positions, repeat = shard(len(ids), ctx.world_size, ctx.rank)
    scores = score(model, ctx.corpus, [ids[p] for p in positions], device=ctx.device)
    mine = torch.stack([scores.totals(~repeat), scores.totals(),
                        torch.tensor([len(positions), int(repeat.sum()), 0.0],
                                     dtype=torch.float64)])
    # The recipe: one all-reduce of [sum, count, correct] after the loop, on
    # every rank (of a copy: all_reduce adds in place). The gather shows the
    # per-rank view the other two use.
    kept = mine[0].to(ctx.device, copy=True)
    dist.all_reduce(kept)
    per_rank = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(per_rank, mine.to(ctx.device))
    ctx.log("evaluate", sequences=len(positions), repeats=int(repeat.sum()),
            local_loss_sum=float(mine[1][0]), local_tokens=int(mine[1][1]))
    if ctx.rank != 0:
        return
    ranks = [r.cpu() for r in per_rank]
    token_weighted = Score.of(kept.cpu())
    single = evaluate(model, ctx.corpus)
    reference = torch.tensor([single["loss_per_token"], single["token_accuracy"]],
                             dtype=torch.float64)
    got = torch.tensor([token_weighted.loss_per_token, token_weighted.token_accuracy],
                       dtype=torch.float64)
    rank_means = [Score.of(r[0]) for r in ranks]  # the repeats left out
    dist_eval = DistributedEvaluation(
        world_size=ctx.world_size, repeats=int(sum(r[2][1] for r in ranks)),
        token_weighted=token_weighted,
        duplicates_kept=Score.of(torch.stack([r[1] for r in ranks]).sum(dim=0)),
        mean_of_rank_means=Score(
            sum(s.loss_per_token for s in rank_means) / ctx.world_size,
            sum(s.token_accuracy for s in rank_means) / ctx.world_size),
        single_process=Score(single["loss_per_token"], single["token_accuracy"]),
        max_abs_diff=float((got - reference).abs().max()), rtol=RTOL,
        matches_single_process=torch.allclose(got, reference, rtol=RTOL, atol=0.0),
        ranks=[RankShard(int(r[2][0]), int(r[2][1]), int(r[1][1]), s.loss_per_token)
               for r, s in zip(ranks, rank_means, strict=True)])
    report(ctx.cfg, ctx.corpus, model, ckpt, ctx.out, step, ctx.header().fields(),
           single, dist_eval).save(ctx.out)


KIND = JobKind(EvaluateJob, run_rank)


def evaluate_run(cfg: Config, out: Path, ckpt: Path | None = None,
                 data_dir: Path | None = None, world_size: int = 1,
                 **kw: Any) -> EvaluationReport:
    """Evaluate a checkpoint (default: the latest valid one under ``out``)
    on the test split: in this process, or with ``world_size`` >= 2 on that
    many ranks of a torchrun launch (``kw``: the launch's options)."""
    out = Path(out)
    corpus = load_corpus(cfg, locate(cfg, data_dir or paths.data_dir()))
    if ckpt is None:
        ckpt = checkpoint.latest_valid(out)
        if ckpt is None:
            raise checkpoint.CheckpointError(f"no valid checkpoint under {out}/checkpoints")
    step = checkpoint.Trainer.of(checkpoint.verify(ckpt, data_lock=corpus.lock)).step
    model = trained_model(cfg, ckpt)  # refused here, before any launch, when it does not fit
    if world_size <= 1:
        header = {"device": "cpu", "backend": "none (single process)", "world_size": 1}
        report(cfg, corpus, model, ckpt, out, step, header).save(out)
    else:
        launch(cfg, out, [EvaluateJob(str(Path(ckpt).resolve()))], data_dir=data_dir,
               world_size=world_size, **kw)
    return EvaluationReport.load(out)
