"""The frameworks' logged losses against the token mean -> reports/frameworks-logging.json.

One launch runs, for each model, the logging of the real frameworks
(``course_lib.frameworks.logged``) on the skewed window of the frameworks
job: the Hugging Face Trainer's logged training loss and ``eval_loss``
(``average_tokens_across_devices`` on and off), accelerate's
``gather_for_metrics`` of scalars and of per-sample rows, and Lightning's
``self.log(..., sync_dist=True)`` on step and on epoch. Every rank reports
the values it logged. Rank 0 then computes, in one process and float64 from
the same initial weights, every row's summed loss S_i and supervised count
N_i, the token mean each logged value should equal, and the other formulas
it might be instead (the mean of rank means, of batch means, ...): the
verdict is the formula within round-off of the logged value, else "other".
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from course_lib import frameworks
from course_lib.core.data import IGNORE_INDEX
from course_lib.core.edition import tr
from course_lib.frameworks import logged, models
from course_lib.frameworks import window as fw_window
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank.context import RankContext
from course_lib.reports.store import Committed, Report, RunHeader
from course_lib.run.runfile import JobSpec

# What a logged value is: the formula it equals, to round-off.
TOKEN_MEAN = "token mean"  # sum S / sum N: every supervised token once
RANK_MEANS = "mean of rank means"  # (1/W) sum_r S_r / N_r
MICRO_MEANS = "mean of microbatch means"  # every microbatch's token mean, equally
BATCH_MEANS = "mean of batch means"  # every fed batch's token mean, duplicates in
SAMPLE_WEIGHTED = "sample-weighted mean of batch means"  # each sample: its batch's mean
# each sample: W S_{r,t} / N_t, its batch's loss times W over its step's tokens
# (the Trainer's eval_loss with the flag on); a step's samples, all kept and as many
# on each rank, average to its token mean S_t / N_t
STEP_MEANS = "sample-weighted mean of step token means"
# sum S / (W floor(N / W)): Lightning's on_epoch mean, synced on gloo, averages
# the integer batch-size total over the ranks into an integer tensor.
FLOORED = "token mean over W floor(N / W) tokens"
# The same formulas with N counted before the causal shift (labels[:, 0] too):
# the Trainer's count for a model whose loss_type it cannot name.
BEFORE_SHIFT = ", N counted before the shift"
OTHER = "other"
_FORMULAS = (TOKEN_MEAN, RANK_MEANS, MICRO_MEANS, BATCH_MEANS, SAMPLE_WEIGHTED, STEP_MEANS)
VERDICTS = (*_FORMULAS, *(f + BEFORE_SHIFT for f in _FORMULAS), FLOORED, OTHER)
# A float32 computation of a loss over ~100 tokens, against float64: relative.
TOLERANCE = 1e-5
# The frameworks whose logging the job can run, in the order it runs them.
FRAMEWORKS = ("hf", "accelerate", "lightning")


@dataclass(frozen=True)
class LoggingJob(JobSpec):
    TAG: ClassVar[str] = "frameworks_logging"
    models: list[str]
    microbatches: int = 2
    batch_size: int = 2
    length: int = 24
    seed: int = 1234
    eval_rows: int = 7  # the window's first rows: W x eval_batch_size does not divide it
    eval_batch_size: int = 2
    # The models' initializer_range: at the usual 0.02 every token's loss is
    # near log V and the formulas agree to 1e-4; sharper weights part them.
    init_range: float = 0.5
    # the frameworks to run (FRAMEWORKS by default): "hf" alone takes a few
    # seconds, as chapter 07 runs it live
    frameworks: list[str] = field(default_factory=lambda: list(FRAMEWORKS))

    def preload(self) -> tuple[str, ...]:
        return frameworks.modules(self.frameworks, self.models)


@dataclass(frozen=True)
class LoggedRow:
    framework: str  # hf, accelerate, lightning
    version: str | None
    model: str
    logged: str  # what is logged: "train loss", "eval_loss", ...
    mode: str  # how: a flag, a reduction
    value: float  # rank 0's logged value
    token_mean: float  # what it should equal: float64, one process
    relative_error: float  # |value - token_mean| / |token_mean|
    verdict: str  # one of VERDICTS, from the numbers
    candidates: dict[str, float]  # every formula's float64 value
    separation: float  # the smallest relative gap between two candidates
    per_rank: list[float | None]  # each rank's logged value
    recipe: str = ""  # the code, when this row is its framework's correct recipe

    @property
    def ranks_agree(self) -> bool:
        return all(v is not None and abs(v - self.value) <= TOLERANCE * abs(self.value)
                   for v in self.per_rank)

    @property
    def said(self) -> str:
        """The verdict (a formula's name) in the learner's language
        (``COURSE_EDITION``): what a chapter prints; ``verdict`` stays English."""
        return tr(self.verdict)


@dataclass(frozen=True)
class LoggingReport(RunHeader, Report):
    NAME: ClassVar[str] = "frameworks-logging"
    window: dict[str, float]  # the job's shape: microbatches, batch_size, ..., init_range
    counts: dict[str, dict[str, Any]]  # per model: N, N_r, eval N
    rows: list[LoggedRow]
    tolerance: float = TOLERANCE
    extra: dict = field(default_factory=dict, repr=False)

    def row(self, framework: str, logged_: str, mode: str, model: str | None = None
            ) -> LoggedRow:
        found = [r for r in self.rows if (r.framework, r.logged, r.mode) ==
                 (framework, logged_, mode) and model in (None, r.model)]
        if not found:
            raise KeyError(f"no row {framework}/{logged_}/{mode}")
        return found[0]

    @property
    def recipes(self) -> list[LoggedRow]:
        return [r for r in self.rows if r.recipe]


@dataclass(frozen=True)
class LoggingData(Committed):
    """The committed measurement, ``data/frameworks-logging.json``: written by
    ``benchmarks/frameworks_logging.py``."""

    NAME: ClassVar[str] = "frameworks-logging"
    date: str
    python: str
    command: str  # what made it
    stack: dict[str, str]  # the frameworks' versions
    run: LoggingReport
    extra: dict = field(default_factory=dict, repr=False)


# --- the formulas, float64 -----------------------------------------------------------


def judge(value: float, candidates: dict[str, float]) -> str:
    """The candidate within round-off of ``value`` (the nearest), else OTHER."""
    name, gap = min(((n, abs(value - c) / abs(c)) for n, c in candidates.items()),
                    key=lambda item: item[1])
    return name if gap <= TOLERANCE else OTHER


def separation(candidates: dict[str, float]) -> float:
    """The smallest relative gap between two distinct candidates: a verdict
    means something only when this is far above the tolerance."""
    values = list(candidates.values())
    gaps = [abs(a - b) / abs(b) for i, a in enumerate(values) for b in values[i + 1:]]
    return min(gaps) if gaps else float("inf")


def row_sums(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, in float64: S_i (summed NLL after the shift), N_i, and the
    count before the shift."""
    with torch.no_grad():
        out = logged.token_sums(model(input_ids=ids, attention_mask=mask).logits.double(),
                                labels)
    return out[:, 0], out[:, 1], labels.ne(IGNORE_INDEX).sum(1).double()


def with_before_shift(right: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """The formulas with the right count, and with the count before the shift."""
    return {**right, **{k + BEFORE_SHIFT: v for k, v in before.items()}}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def window_candidates(s: list[list[float]], n: list[list[float]]) -> dict[str, float]:
    """s[r][m], n[r][m]: a window's formulas."""
    return {TOKEN_MEAN: sum(map(sum, s)) / sum(map(sum, n)),
            RANK_MEANS: mean([sum(sr) / sum(nr) for sr, nr in zip(s, n, strict=True)]),
            MICRO_MEANS: mean([a / b for sr, nr in zip(s, n, strict=True)
                               for a, b in zip(sr, nr, strict=True)])}


def eval_candidates(s: list[float], n: list[float], layout: list[list[list[int]]]
                    ) -> dict[str, float]:
    """An eval set's formulas: s[i], n[i] per sample; layout[step][rank], the
    indices of the samples each rank was fed at each step (the padded
    sampler's duplicates in). The sample-weighted ones keep the first
    len(s) gathered positions, as gather_for_metrics does."""
    def tot(xs: list[float], idx: list[int]) -> float:
        return sum(xs[i] for i in idx)

    w = len(layout[0])
    per_rank = [[i for step in layout for i in step[r]] for r in range(w)]
    by_batch, by_step = [], []
    for step in layout:
        n_step = sum(tot(n, b) for b in step)
        for b in step:
            by_batch += [tot(s, b) / tot(n, b)] * len(b)
            by_step += [w * tot(s, b) / n_step] * len(b)
    return {TOKEN_MEAN: sum(s) / sum(n),
            RANK_MEANS: mean([tot(s, idx) / tot(n, idx) for idx in per_rank]),
            BATCH_MEANS: mean([tot(s, b) / tot(n, b) for step in layout for b in step]),
            SAMPLE_WEIGHTED: mean(by_batch[:len(s)]),
            STEP_MEANS: mean(by_step[:len(s)])}


def eval_set(window: fw_window.Window, rows: int) -> list[dict[str, torch.Tensor]]:
    """The window's first ``rows`` rows, rank 0's short ones first: batches
    of different token counts."""
    flat = [{k: v[i] for k, v in mb.as_dict().items()}
            for rank in window for mb in rank for i in range(mb.input_ids.shape[0])]
    return flat[:rows]


def layout_of(fed: list[logged.Fed], rows: list[dict[str, torch.Tensor]]
              ) -> list[list[list[int]]]:
    """Every rank's fed steps as indices into ``rows``: layout[step][rank]."""
    where = {(tuple(r["input_ids"].tolist()), tuple(r["labels"].tolist())): i
             for i, r in enumerate(rows)}
    if len(where) != len(rows):
        raise RuntimeError("the eval set has two identical rows: its layout is ambiguous")
    per_rank = [[[where[(tuple(ids.tolist()), tuple(lab.tolist()))]
                  for ids, lab in zip(step[0], step[1], strict=True)] for step in steps]
                for steps in fed]
    if len({len(p) for p in per_rank}) != 1:
        raise RuntimeError(f"ranks ran {[len(p) for p in per_rank]} eval steps")
    return [list(step) for step in zip(*per_rank, strict=True)]


# --- in the launch -------------------------------------------------------------------


def _setup(ctx: RankContext, spec: LoggingJob, model_type: str, flags: dict[str, Any],
           framework: str) -> frameworks.Setup:
    shape = fw_window.WindowShape(ctx.world_size, spec.microbatches, spec.batch_size,
                                  spec.length, spec.seed)
    return frameworks.Setup(framework, model_type, flags, shape,
                            Path(tempfile.mkdtemp(prefix=f"course-log-{ctx.rank}-")),
                            ctx.backend, ctx.device, ctx.rank, ctx.world_size)


def _fresh(ctx: RankContext, spec: LoggingJob, model_type: str) -> torch.nn.Module:
    """The initial model: the same weights on every rank, for every framework."""
    return models.build(model_type, fw_window.vocab_size(ctx.corpus.source), spec.seed,
                        {**models.SIZES, "initializer_range": spec.init_range})


def _measure(ctx: RankContext, spec: LoggingJob, model_type: str,
             window: fw_window.Window, rows: list[dict[str, torch.Tensor]]
             ) -> tuple[dict[str, float | None], dict[str, logged.Fed]]:
    """Every framework's logged values on this rank, and the eval rows fed."""
    values: dict[str, float | None] = {}
    fed: dict[str, logged.Fed] = {}
    # (key, average_tokens_across_devices, the model's loss_type set first)
    for key, average, loss_type in (("True", True, None), ("False", False, None),
                                    ("recipe", True, "ForCausalLM")):
        if "hf" not in spec.frameworks:
            break
        setup = _setup(ctx, spec, model_type, {"average_tokens_across_devices": average}, "hf")
        try:
            with frameworks.isolated():
                found, fed[f"hf/{key}"] = logged.hf_run(
                    setup, _fresh(ctx, spec, model_type).to(ctx.device), window, rows,
                    spec.eval_batch_size, loss_type)
        finally:
            shutil.rmtree(setup.workdir, ignore_errors=True)
        values.update({f"hf/{key}/{k}": v for k, v in found.items()})
    if "accelerate" in spec.frameworks:
        with frameworks.isolated():
            found, fed["accelerate"] = logged.accelerate_run(
                _fresh(ctx, spec, model_type).to(ctx.device), rows, spec.eval_batch_size,
                cpu=ctx.device.type == "cpu")
        values.update({f"accelerate/{k}": v for k, v in found.items()})
    if "lightning" not in spec.frameworks:
        return values, fed
    setup = _setup(ctx, spec, model_type, {}, "lightning")
    try:
        with frameworks.isolated():
            got = logged.lightning_run(setup, _fresh(ctx, spec, model_type).to(ctx.device),
                                       window)
    finally:
        shutil.rmtree(setup.workdir, ignore_errors=True)
    values.update({f"lightning/{k}": v for k, v in got.items()})
    return values, fed


# (framework, what is logged, mode, key of the value, candidates' set, recipe)
ROWS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("hf", "train loss", "average_tokens_across_devices=True", "hf/True/train loss",
     "window hf", ""),
    ("hf", "train loss", "average_tokens_across_devices=False", "hf/False/train loss",
     "window hf", ""),
    ("hf", "train loss", "average_tokens_across_devices=True, model.loss_type='ForCausalLM'",
     "hf/recipe/train loss", "window hf", "hf train"),
    ("hf", "eval_loss", "average_tokens_across_devices=True", "hf/True/eval_loss",
     "eval hf/True", ""),
    ("hf", "eval_loss", "average_tokens_across_devices=False", "hf/False/eval_loss",
     "eval hf/False", ""),
    ("hf", "eval_token_mean", "preprocess_logits_for_metrics + compute_metrics",
     "hf/True/eval_token_mean", "eval hf/True", "hf eval"),
    ("accelerate", "eval loss", "gather_for_metrics(loss)", "accelerate/scalar",
     "eval accelerate", ""),
    ("accelerate", "eval loss", "gather_for_metrics(loss.repeat(batch_size))",
     "accelerate/repeat", "eval accelerate", ""),
    ("accelerate", "eval loss", "gather_for_metrics(per-sample [sum, count])",
     "accelerate/rows", "eval accelerate", "accelerate"),
    ("lightning", "train loss, first step", "on_step=True, sync_dist=True",
     "lightning/on_step", "first step", ""),
    ("lightning", "train loss, epoch", "on_epoch=True, sync_dist=True (batch_size inferred)",
     "lightning/on_epoch", "window", ""),
    ("lightning", "train loss, epoch", "on_epoch=True, sync_dist=True, batch_size=<tokens>",
     "lightning/on_epoch_tokens", "window lightning", ""),
    ("lightning", "train loss, epoch", "MeanMetric.update(loss, weight=<tokens>), on_epoch",
     "lightning/mean_metric", "window lightning", "lightning"),
)
PACKAGES = {"hf": "transformers", "accelerate": "accelerate", "lightning": "lightning"}


def stack() -> dict[str, str]:
    """torch's version and each framework's (torchmetrics: Lightning's recipe)."""
    found = {"torch": str(torch.__version__)}
    for package in (*PACKAGES.values(), "torchmetrics"):
        version = frameworks.installed(package)
        if version is not None:
            found[package] = version
    return found


def _rows(ctx: RankContext, spec: LoggingJob, model_type: str, window: fw_window.Window,
          rows: list[dict[str, torch.Tensor]], values: list[dict[str, float | None]],
          fed: list[dict[str, logged.Fed]]) -> tuple[list[LoggedRow], dict[str, Any]]:
    """Rank 0: the float64 reference and every row, judged."""
    reference = _fresh(ctx, spec, model_type).double().eval()
    s: list[list[float]] = []
    n: list[list[float]] = []
    n0: list[list[float]] = []  # counted before the shift
    for rank in window:
        sums = [row_sums(reference, mb.input_ids, mb.attention_mask, mb.labels)
                for mb in rank]
        s.append([float(a.sum()) for a, _, _ in sums])
        n.append([float(b.sum()) for _, b, _ in sums])
        n0.append([float(c.sum()) for _, _, c in sums])
    ids = torch.stack([r["input_ids"] for r in rows])
    es, en, en0 = row_sums(reference, ids, torch.stack([r["attention_mask"] for r in rows]),
                           torch.stack([r["labels"] for r in rows]))
    e_s, e_n, e_n0 = es.tolist(), en.tolist(), en0.tolist()
    w, n_total = len(window), int(sum(map(sum, n)))
    first = window_candidates([[sr[0]] for sr in s], [[nr[0]] for nr in n])
    sets = {"window": window_candidates(s, n),
            "window hf": with_before_shift(window_candidates(s, n), window_candidates(s, n0)),
            # one microbatch per rank: its mean of microbatch means is its mean of rank means
            "first step": {k: v for k, v in first.items() if k != MICRO_MEANS},
            "window lightning": {**window_candidates(s, n),
                                 FLOORED: sum(map(sum, s)) / (w * (n_total // w))}}
    for key in fed[0]:
        layout = layout_of([f[key] for f in fed], rows)
        sets[f"eval {key}"] = eval_candidates(e_s, e_n, layout)
        if key.startswith("hf/"):  # the Trainer's count may include labels[:, 0]
            sets[f"eval {key}"] = with_before_shift(sets[f"eval {key}"],
                                                    eval_candidates(e_s, e_n0, layout))
    found = []
    for framework, what, mode, key, which, recipe in ROWS:
        if framework not in spec.frameworks:
            continue
        value = values[0][key]
        if value is None:
            raise RuntimeError(f"{framework} logged no {what} ({mode}) on rank 0")
        cands = sets[which]
        truth = cands[TOKEN_MEAN]
        found.append(LoggedRow(
            framework=framework, version=frameworks.installed(PACKAGES[framework]),
            model=model_type, logged=what, mode=mode, value=value, token_mean=truth,
            relative_error=abs(value - truth) / abs(truth), verdict=judge(value, cands),
            candidates=cands, separation=separation(cands),
            per_rank=[v[key] for v in values], recipe=logged.RECIPES.get(recipe, "")))
    counts = {"N": int(sum(map(sum, n))), "N_r": [int(sum(nr)) for nr in n],
              "eval_N": int(sum(e_n)), "eval_rows": len(rows)}
    return found, counts


def run_rank(ctx: RankContext, spec: LoggingJob) -> None:
    shape = fw_window.WindowShape(ctx.world_size, spec.microbatches, spec.batch_size,
                                  spec.length, spec.seed)
    window = fw_window.build(shape, ctx.corpus.source)
    rows = eval_set(window, spec.eval_rows)
    found: list[LoggedRow] = []
    counts: dict[str, dict[str, Any]] = {}
    for i, model_type in enumerate(spec.models):
        ctx.state.audited = f"logging/{model_type}"
        ctx.log("frameworks_logging", model=model_type)
        values, fed = _measure(ctx, spec, model_type, window, rows)
        every_value: list[Any] = [None] * ctx.world_size
        every_fed: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(every_value, values)
        dist.all_gather_object(every_fed, fed)
        if ctx.rank == 0:
            more, counts[model_type] = _rows(ctx, spec, model_type, window, rows,
                                             every_value, every_fed)
            found += more
        ctx.progress("frameworks_logging", i + 1, len(spec.models))
    ctx.state.audited = None
    if ctx.rank == 0:
        LoggingReport(**ctx.header().fields(),
                      window={f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                              if f.name not in ("models", "frameworks")},
                      counts=counts, rows=found).save(ctx.out)


KIND = JobKind(LoggingJob, run_rank)


# --- the parent side -----------------------------------------------------------------

QUICK_MODELS = ("llama",)
MODELS = ("gpt2", "llama")


def frameworks_logging(cfg: Any, out: Path, model_types: list[str] | tuple[str, ...] = MODELS,
                       names: list[str] | tuple[str, ...] = FRAMEWORKS,
                       **kw: Any) -> LoggingReport:
    """One launch: the logging of every framework in ``names`` (all three by
    default), per model -> the report."""
    unknown = [n for n in names if n not in FRAMEWORKS]
    if unknown:
        raise frameworks.UnknownFramework(f"no logging for {', '.join(unknown)}: "
                                          f"choose among {', '.join(FRAMEWORKS)}")
    missing = [PACKAGES[n] for n in names if frameworks.installed(PACKAGES[n]) is None]
    if missing:
        raise frameworks.UnknownFramework(f"not installed: {', '.join(missing)} "
                                          f"(pip install {' '.join(missing)})")
    for name in model_types:
        models.config(name, 8)  # UnknownModel: bad input, before any launch
    launch(cfg, out, [LoggingJob(list(model_types), frameworks=list(names))], **kw)
    return LoggingReport.load(out)


def describe(report: LoggingReport) -> str:
    lines = [f"What the frameworks log, against the token mean: {report.world_size} ranks, "
             f"{report.backend} on {report.device}",
             f"  {'framework':<10} {'model':<6} {'logged':<23} {'mode':<66} {'value':>10} "
             f"{'token mean':>10} {'rel. err':>9}  verdict"]
    for r in report.rows:
        lines.append(f"  {r.framework:<10} {r.model:<6} {r.logged:<23} {r.mode:<66} "
                     f"{r.value:>10.6f} {r.token_mean:>10.6f} {r.relative_error:>9.1e}  "
                     f"{r.verdict}{'  (recipe)' if r.recipe else ''}")
    return "\n".join(lines)
