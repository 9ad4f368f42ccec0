"""The frameworks job: the real training loops, audited -> reports/frameworks.json.

One launch runs every configuration (framework x model x flags) in turn.
Every rank builds the same window and the same initial model, hands both to
the framework's own loop (``course_lib.frameworks``), and keeps the
gradient the framework holds just before its first optimizer step. Each
rank then computes, from the initial weights and the microbatches it was
really fed, every microbatch's summed-loss gradient; the reference is the
global token mean, and the candidate formulas say which objective the
framework trained instead. All of it is judged from inner products: of the
whole gradients, or, above ``sketch.WHOLE_UP_TO`` components, of their
sketches (``frameworks/sketch.py``; ``--exact-compare`` keeps them whole).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from course_lib import frameworks
from course_lib.core import edition
from course_lib.core.edition import tr
from course_lib.core.verdicts import NOT_FINITE, TOLERANCE, Verdict
from course_lib.frameworks import candidates, models, options, sketch
from course_lib.frameworks import reference as fw_reference
from course_lib.frameworks import window as fw_window
from course_lib.frameworks.evidence import (
    UNMEASURED,
    FrameworkRow,
    RankResult,
    WindowCounts,
    nearest,
)
from course_lib.jobs.kind import JobKind, launch
from course_lib.rank.context import RankContext
from course_lib.reports.store import Report, RunHeader
from course_lib.run import progress
from course_lib.run.placement import resolve
from course_lib.run.runfile import JobSpec
from course_lib.steps.base import StepSpecError


@dataclass(frozen=True)
class Configuration:
    framework: str
    model: str
    flags: dict[str, Any] = field(default_factory=dict)
    # --with: the configuration on top (frameworks/options.py), name -> state
    uses: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameworksJob(JobSpec):
    TAG: ClassVar[str] = "frameworks"
    configurations: list[Configuration]
    microbatches: int = 2
    batch_size: int = 2
    length: int = 24
    seed: int = 1234
    report: str = "frameworks"  # the report's file name
    sizes: str = "tiny"  # models.SIZE_PRESETS: "tiny", "gpt2-small" (124M), "gpt2-medium"
    timing: bool = False  # also time each configuration alone (the benchmark)
    # How the gradients are compared: "auto" (whole up to sketch.WHOLE_UP_TO
    # components, else through a sketch), "exact" (whole: --exact-compare)
    # or "sketch".
    compare: str = "auto"
    # Only build each configuration, and keep the rows of the ones refused
    # as bad input (audit_trainer's check of a learner's function).
    build_only: bool = False

    def preload(self) -> tuple[str, ...]:
        confs = self.configurations
        return frameworks.modules({c.framework for c in confs}, {c.model for c in confs},
                                  {options.OPTIONS[o].package for c in confs for o in c.uses})


@dataclass(frozen=True)
class FrameworksReport(RunHeader, Report):
    NAME: ClassVar[str] = "frameworks"
    window: dict[str, int]  # microbatches, batch_size, length
    rows: list[FrameworkRow]
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def every_verdict_measured(self) -> bool:
        return all(r.verdict not in UNMEASURED for r in self.rows)


# --- in the launch -------------------------------------------------------------------


class FailedOnSomeRanks(RuntimeError):
    """A framework refused or failed what it ran (``name``: a configuration,
    a trainer's case) on some ranks only; ``stuck`` names them, for the
    launcher's diagnosis."""

    def __init__(self, name: str, failures: list[str]):
        self.stuck = [r for r, f in enumerate(failures) if f]
        super().__init__(f"{name} failed on rank(s) {', '.join(map(str, self.stuck))} "
                         "only: " + "; ".join(f for f in failures if f))


def why(exc: BaseException) -> str:
    """One line: the innermost cause (an import error behind a lazy import)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# What ``why`` says of a package that is not there (the framework's lazy import).
MISSING = ("ImportError:", "ModuleNotFoundError:", "PackageNotFoundError:")


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return everyone


def _inner_products(mine: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """(W K, W K) float64 inner products of every rank's K vectors, ordered
    (rank, index), on every rank. Rank r computes its own block and, as
    rank s > r broadcasts its vectors, the block (r, s); one all_reduce
    adds the blocks up. Broadcasts, not gathers: gloo's all_gather of a
    124M-component vector is many times slower than its broadcast."""
    w, rank, k = dist.get_world_size(), dist.get_rank(), len(mine)
    found = torch.zeros((w * k, w * k), dtype=torch.float64)
    here = slice(rank * k, (rank + 1) * k)
    found[here, here] = candidates.pairs(mine)
    for s in range(1, w):
        theirs = [v.to(device) if s == rank else torch.empty(v.numel(), device=device)
                  for v in mine]
        for v in theirs:
            dist.broadcast(v, src=s)
        if rank < s:
            there = slice(s * k, (s + 1) * k)
            found[here, there] = candidates.pairs(mine, [v.cpu() for v in theirs])
            found[there, here] = found[here, there].T
        del theirs
    found = found.to(device)
    dist.all_reduce(found)
    return found.cpu()


def _judged(counts: fw_window.Counts, everything: torch.Tensor, micro: list[int],
            captured: list[int]) -> list[candidates.Against]:
    """Each rank's captured gradient seen from the microbatch gradients, by
    their indices in ``everything`` (a matrix of inner products)."""
    gram = candidates.Gram(counts, everything[micro][:, micro])
    return [candidates.Against(gram, everything[c, micro], float(everything[c, c]))
            for c in captured]


def stack() -> dict[str, str]:
    """The installed versions of torch, of every audited framework's
    package (an entry of the matrix may pin its own torch), and of the
    packages the --with configurations run."""
    found = {"torch": str(torch.__version__)}
    packages = [frameworks.adapter(name).package for name in frameworks.ADAPTERS]
    for package in [*packages, *(o.package for o in options.OPTIONS.values() if o.package)]:
        version = frameworks.installed(package)
        if version is not None:
            found[package] = version
    return found


def _judge(finite: bool, seen: candidates.Against, tol: float) -> tuple[Verdict, RankResult]:
    """Exact, uniformly scaled (collinear with g*) or biased: ``classify``'s
    judgement, from inner products; non-finite when a component is not finite."""
    m = seen.measured(candidates.EXACT, tol) if finite else NOT_FINITE
    return m.verdict, RankResult(-1, m.relative_error, m.scale)


def _row(conf: Configuration, version: str | None, counts: fw_window.Counts,
         seen: list[candidates.Against], finite: list[bool], apart: list[float],
         precision: str, notes: list[str] | None = None) -> FrameworkRow:
    """The row, from each rank's captured gradient seen from the microbatch
    gradients (``seen``), whether it is finite, and its distance to rank 0's
    (``apart``)."""
    tol = TOLERANCE.exact[precision]
    judged = [_judge(f, a, tol) for f, a in zip(finite, seen, strict=True)]
    ranks = [dataclasses.replace(res, rank=r) for r, (_, res) in enumerate(judged)]
    first, first_result = judged[0]
    gram = seen[0].gram
    ref_norm = gram.coefficients(candidates.EXACT)
    ref_norm = float(ref_norm @ gram.pairs @ ref_norm) ** 0.5
    disagree = any(d > tol * ref_norm for d in apart[1:])
    match = seen[0].best()
    verdict = (Verdict.RANKS_DISAGREE if disagree
               else Verdict.BIASED if first == Verdict.NON_FINITE else first)
    return FrameworkRow(
        framework=conf.framework, version=version, model=conf.model, flags=conf.flags,
        uses=conf.uses, verdict=verdict, precision=precision,
        factor=first_result.scale if verdict == Verdict.SCALED else None,
        matches=match.name, residual=match.residual,
        relative_error=first_result.relative_error,
        counts=WindowCounts(counts.N, counts.N_r, counts.R), ranks=ranks, stack=stack(),
        notes=list(notes or []))


def _build(ctx: RankContext, conf: Configuration, spec: FrameworksJob,
           window: fw_window.Window, keep: bool = True
           ) -> tuple[Any, torch.nn.Module, Any, Path, bool]:
    """The configuration's model and framework, on every rank: (prepared
    training or None, a copy of the untrained model (``keep``, else the
    model itself), the rank's failure or "", scratch directory, whether the
    failure is bad input: a learner's function that is no step spec)."""
    shape = window_shape(ctx, spec)
    source = ctx.corpus.source
    adapter = frameworks.adapter(conf.framework)
    frameworks.load_first(adapter)
    model = models.build(conf.model, fw_window.vocab_size(source), spec.seed,
                         models.SIZE_PRESETS[spec.sizes]).to(ctx.device)
    workdir = Path(tempfile.mkdtemp(prefix=f"course-fw-{ctx.rank}-"))
    setup = frameworks.Setup(
        conf.framework, conf.model, conf.flags, shape, workdir, ctx.backend,
        ctx.device, ctx.rank, ctx.world_size,
        rebuild=lambda b, m: fw_window.build(dataclasses.replace(
            shape, batch_size=b, microbatches=m), source), uses=conf.uses)
    initial = model
    try:
        # --with lora: the model as the configuration trains it (no collective).
        model = options.wrap(conf.uses, model)
        # The reference starts from these weights: copied before the framework
        # sees the model (cheaper than building and initialising it again).
        initial = copy.deepcopy(model) if keep else model
        return adapter.prepare(setup, model, window), initial, "", workdir, False
    except Exception as exc:  # noqa: BLE001 - reported by the caller, if every rank agrees
        failure = why(exc)
        ctx.log("framework_failed", message=failure)
        return None, initial, failure, workdir, isinstance(exc, StepSpecError)


def window_shape(ctx: RankContext, spec: FrameworksJob) -> fw_window.WindowShape:
    return fw_window.WindowShape(ctx.world_size, spec.microbatches, spec.batch_size,
                                 spec.length, spec.seed)


def _audit_one(ctx: RankContext, conf: Configuration, spec: FrameworksJob,
               window: fw_window.Window) -> FrameworkRow | None:
    """One configuration, on every rank; its row on rank 0."""
    adapter = frameworks.adapter(conf.framework)
    train, initial, failure, workdir, bad_input = _build(ctx, conf, spec, window)
    # The framework is built, and nothing has crossed the process group
    # yet. One that refuses the configuration refuses it on every rank: the
    # row is "not run", with the reason. A rank that failed alone fails the
    # job, and the error names it.
    failures: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(failures, failure)
    if any(failures):
        shutil.rmtree(workdir, ignore_errors=True)
        if not all(failures):
            raise FailedOnSomeRanks(f"{conf.framework}/{conf.model}", failures)
        if ctx.rank != 0:
            return None
        return dataclasses.replace(
            not_run(conf, failures[0], frameworks.installed(adapter.package)),
            bad_input=bad_input)
    captured, failure, dropped = None, "", ""
    try:
        captured = train()
        # --with fsdp on the CPU: trained, but not as asked (no shard).
        dropped = options.unmet(conf.uses, captured)
    except Exception as exc:  # noqa: BLE001 - a finding when every rank raised it
        failure = why(exc)
        ctx.log("framework_failed", message=failure)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # A configuration that raises while it trains (gradient checkpointing
    # under DDP...) raises on every rank: its row is "failed", with the error;
    # "not run" where what failed is an import (a package the framework
    # loads only when it trains: liger-kernel), or where the framework ran
    # something else than the configuration.
    outcomes: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(outcomes, (failure, dropped))
    for found, kind in ((o[0] for o in outcomes), "failed"), ((o[1] for o in outcomes), ""):
        failures = list(found)
        if not any(failures):
            continue
        if not all(failures):
            raise FailedOnSomeRanks(f"{conf.framework}/{conf.model}", failures)
        if ctx.rank != 0:
            return None
        row = not_run(conf, failures[0], frameworks.installed(adapter.package))
        return row if not kind or failures[0].startswith(MISSING) else dataclasses.replace(
            row, verdict=Verdict.FAILED)
    assert captured is not None
    seen: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(seen, captured.seen)
    fed = [list(s) if s else rank for s, rank in zip(seen, window, strict=True)]
    finite: list[Any] = [None] * ctx.world_size
    # Its smallest and largest components (NaN propagates): one pass and no
    # mask of D booleans, which costs a large model half a second.
    dist.all_gather_object(finite, bool(torch.stack(torch.aminmax(captured.grad))
                                        .isfinite().all()))
    version, counts = frameworks.installed(adapter.package), fw_window.counts(fed)
    w = ctx.world_size
    through = sketch.chosen(spec.compare, captured.grad.numel())
    if through is not None:
        # Each rank sketches its own microbatch gradients and its captured
        # one; k numbers per vector cross the process group, not D.
        sketched = torch.stack([*map(through.of_parts,
                                     fw_reference.each_grad(initial, fed[ctx.rank])),
                                through.of_parts([captured.grad])])
        sketches: list[Any] = [None] * w
        dist.all_gather_object(sketches, sketched)
        if ctx.rank != 0:
            return None
        ends = list(itertools.accumulate(len(s) for s in sketches))
        grads = [e - 1 for e in ends]
        micro = [i for i in range(ends[-1]) if i not in grads]
        stacked = torch.cat(sketches)
        everything = stacked @ stacked.T
    elif len({len(f) for f in fed}) == 1:
        # Each rank takes the summed-loss gradient of its own microbatches,
        # from the initial weights, as it ran them in the framework; the
        # ranks share the inner products (a block of them each).
        mine = fw_reference.microbatch_grads(initial, [fed[ctx.rank]])[0]
        everything = _inner_products([*mine, captured.grad], ctx.device)
        k = len(mine) + 1
        micro = [r * k + m for r in range(w) for m in range(k - 1)]
        grads = [r * k + k - 1 for r in range(w)]
    else:  # ranks ran different numbers of microbatches: rank 0 takes them all
        gathered = _gather(captured.grad.to(ctx.device))
        if ctx.rank != 0:
            return None
        flat = [g for row in fw_reference.microbatch_grads(initial, fed) for g in row]
        everything = candidates.pairs([*flat, *(g.cpu() for g in gathered)])
        micro, grads = list(range(len(flat))), list(range(len(flat), len(flat) + w))
    if ctx.rank != 0:
        return None
    seen_from = _judged(counts, everything, micro, grads)
    g0 = grads[0]
    apart = [max(float(everything[c, c] - 2 * everything[c, g0] + everything[g0, g0]), 0.0)
             ** 0.5 for c in grads]
    row = _row(conf, version, counts, seen_from, finite, apart, captured.precision,
               [*options.notes(conf.uses, initial), *captured.notes])
    return row if through is None else dataclasses.replace(row, sketch=through.size)


def _timed(run: Any, *args: Any) -> tuple[Any, float]:
    """``run(*args)`` between two barriers: every rank's wall time of it."""
    dist.barrier()
    started = time.perf_counter()
    result = run(*args)
    dist.barrier()
    return result, time.perf_counter() - started


def _alone(ctx: RankContext, conf: Configuration, spec: FrameworksJob,
           window: fw_window.Window) -> None:
    """The framework running the window by itself: its own loop, nothing of
    the audit after it (the benchmark's baseline)."""
    train, _, failure, workdir, _ = _build(ctx, conf, spec, window, keep=False)
    try:
        if not failure:
            train()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _refused_input(ctx: RankContext, conf: Configuration, spec: FrameworksJob,
                   window: fw_window.Window) -> list[FrameworkRow]:
    """The configuration built, not trained: its not-run row when its
    learner's function is bad input, else nothing."""
    _, _, failure, workdir, bad_input = _build(ctx, conf, spec, window, keep=False)
    shutil.rmtree(workdir, ignore_errors=True)
    return [dataclasses.replace(not_run(conf, failure), bad_input=True)] if bad_input else []


def run_rank(ctx: RankContext, spec: FrameworksJob) -> None:
    window = fw_window.build(window_shape(ctx, spec), ctx.corpus.source)
    rows = []
    confs = spec.configurations
    warm: set[str] = set()
    for i, conf in enumerate(confs):
        ctx.state.audited = f"{conf.framework}/{conf.model}"
        ctx.log("framework", framework=conf.framework, model=conf.model, flags=conf.flags)
        if spec.build_only:
            with frameworks.isolated():
                rows += _refused_input(ctx, conf, spec, window)
            continue
        seconds: dict[str, float] = {}
        if spec.timing:  # alone first: the audited run then finds the same warm caches
            if conf.framework not in warm:
                # Untimed: a framework's first window pays its lazy imports,
                # and an "alone" of 20 s against 2 s audited is no ratio; the
                # first audit, its first reference pass (the budget is warm).
                warm.add(conf.framework)
                with frameworks.isolated():
                    _alone(ctx, conf, spec, window)
                with frameworks.isolated():
                    _audit_one(ctx, conf, spec, window)
            with frameworks.isolated():
                _, seconds["alone"] = _timed(_alone, ctx, conf, spec, window)
        with frameworks.isolated():
            row, seconds["audited"] = _timed(_audit_one, ctx, conf, spec, window)
        peaks: list[Any] = [None] * ctx.world_size
        if spec.timing:
            dist.all_gather_object(peaks, _peak_mb())
        if row is not None:
            rows.append(dataclasses.replace(row, seconds=seconds, peak_rss_mb=max(peaks))
                        if spec.timing else row)
        ctx.progress("frameworks", i + 1, len(confs))
    ctx.state.audited = None
    if ctx.rank == 0:
        FrameworksReport(**ctx.header().fields(),
                         window={"microbatches": spec.microbatches,
                                 "batch_size": spec.batch_size, "length": spec.length},
                         rows=rows).save(ctx.out, spec.report)


def _peak_mb() -> float:
    """This rank's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


KIND = JobKind(FrameworksJob, run_rank)


# --- the parent side -----------------------------------------------------------------


def trainer_report_name(spec: str) -> str:
    """``audit-trainer-<function>``: the report of ``audit --trainer SPEC``."""
    return f"audit-trainer-{spec.rpartition(':')[2]}"


def audit_trainer(cfg: Any, out: Path, spec: str, model_type: str = "llama",
                  uses: list[str] | None = None, compare: str = "auto",
                  **kw: Any) -> FrameworksReport:
    """A learner's ``make_trainer(model, dataset)``, on the skewed window:
    ``reports/audit-trainer-<function>.json``. Bad input (no file, no
    function, no Trainer) is StepSpecError, before the audit's launch: the
    function runs in a one-rank launch of its own first, since a learner's
    TrainingArguments may set up distribution (ddp_backend=...). ``uses``:
    the --with configurations, a row for each state (else the plain row)."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        spec = f"{Path(where).resolve()}:{name}"
    conf = Configuration("trainer", model_type, {"spec": spec})
    # Does it load and build a Trainer? One rank, a launch of its own (the
    # parent never runs a learner's code), in a scratch directory and
    # silent: bad input is one line, before the audit's launch.
    with tempfile.TemporaryDirectory(prefix="course-trainer-check-") as scratch:
        launch(cfg, Path(scratch), [FrameworksJob([conf], report="check", build_only=True)],
               **{**kw, "world_size": 1, "multinode": None,
                  "progress": progress.Progress()})
        refused = FrameworksReport.load(Path(scratch), "check").rows
    if refused:
        raise StepSpecError(refused[0].reason.split(": ", 1)[1])
    report_name = trainer_report_name(spec)
    confs = [Configuration("trainer", model_type, {"spec": spec}, {name: dict(state)})
             for name in uses or () for state in options.OPTIONS[name].states] or [conf]
    launch(cfg, out, [FrameworksJob(confs, report=report_name, compare=compare)], **kw)
    return FrameworksReport.load(out, report_name)


def predicted(row: FrameworkRow) -> str | None:
    """The formula that the reading of the sources (``frameworks/expected.py``)
    names for this row's versions, model and flags, or None."""
    from course_lib.frameworks.expected import expected

    if row.version is None:
        return None
    want = expected(row.framework, row.version, row.model, row.flags, row.stack)
    if row.counts is not None and row.counts.R == 0:
        # No row's first label supervised (packed rows: each sequence's first
        # label is the separator): counted before the shift is the same count.
        want = COINCIDE.get(want or "", want)
    return want


# Formulas that name the same gradient when R = 0.
COINCIDE = {"counted before the shift": candidates.EXACT.name,
            "mean of rank means counted before the shift": "mean of rank means"}


def describe(report: FrameworksReport) -> str:
    """One line per configuration: the verdict, the formula it matches (in
    the learner's language: ``COURSE_EDITION``; the flags, a row's reason
    and its notes are the report's, English)."""
    rows = []
    for r in report.rows:
        flags = ", ".join([*(f"with {k}({_state(v)})" for k, v in r.uses.items()),
                           *(f"{k}={_shown(k, v)}" for k, v in r.flags.items()
                             if k not in _set_by(r.uses))]) or "-"
        unmeasured = r.verdict in UNMEASURED
        tail = r.reason if unmeasured else (tr(r.matches) if r.matches else "")
        if (not unmeasured and r.residual is not None
                and r.residual > TOLERANCE.of(r.precision)):
            tail += nearest(r.residual)
        rows.append((r, flags, r.said, tail))
    # the columns as wide as their words in this edition (English: as they were)
    head = (tr("framework"), tr("version"), tr("model"), tr("flags"), tr("verdict"))
    widths = [max(w, len(h)) for w, h in zip((11, 9, 7, 36, 17), head, strict=True)]
    widths[-1] = max([widths[-1], *(len(said) for _, _, said, _ in rows)])
    widths[3] = max([widths[3], *(len(flags) + 1 for _, flags, _, _ in rows)])  # a long spec
    lines = [tr("Frameworks, audited: {ranks} ranks, {backend} on {device}; the gradient of "
                "the first optimizer step vs the token mean").format(
        ranks=report.world_size, backend=report.backend, device=edition.device(report.device)),
             "  " + " ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
             + " " + tr("matches")]
    for r, flags, said, tail in rows:
        cells = (r.framework, r.version or "-", r.model, flags, said)
        lines.append("  " + " ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                     + f" {tail}")
        lines += ["    " + tr("note: {note}").format(note=note) for note in r.notes]
    return "\n".join(lines)


def _state(state: Any) -> str:
    """An option's state in a few words: ``use_reentrant=False``."""
    if isinstance(state, dict):
        return ",".join(f"{k}={v}" for k, v in state.items())
    return str(state)


def _set_by(uses: dict[str, Any]) -> set[str]:
    """The flags the row's --with options set themselves (shown by the option)."""
    return {k for name, state in uses.items() if name in options.OPTIONS
            for k in options.OPTIONS[name].flags(state)}


def _shown(flag: str, value: Any) -> Any:
    """A learner's Trainer spec by its file's name: the rest of the path is theirs."""
    if flag == "spec" and isinstance(value, str):
        where, _, name = value.rpartition(":")
        return f"{Path(where).name}:{name}" if where else value
    return value


def configurations(names: list[str], model_types: list[str], uses: list[str] | None = None
                   ) -> tuple[list[Configuration], list[tuple[Configuration, str]]]:
    """Every framework's flag sets on every model, and those the installed
    version cannot take, with the reason. A version that takes none of them
    is audited with its own defaults (no flag). With ``uses`` (--with), each
    of those options' states on top of them, on the frameworks it applies to,
    instead of the plain rows."""
    found: list[Configuration] = []
    refused: list[tuple[Configuration, str]] = []
    for name in names:
        adapter = frameworks.adapter(name)
        version = frameworks.installed(adapter.package)
        variants = list(adapter.variants)
        if version is not None:
            taken = [v for v in variants if adapter.supports(v)]
            for v in variants:
                if v not in taken:
                    why = f"{adapter.package} {version} has no flag {', '.join(sorted(v))}"
                    refused += [(Configuration(name, model, dict(v)), why)
                                for model in model_types]
            variants = taken or [{}]
        tops: list[tuple[dict[str, Any], dict[str, Any]]] = [
            ({}, {})] if not uses else [
            (options.OPTIONS[o].flags(state), {o: dict(state)}) for o in uses
            if name in options.OPTIONS[o].frameworks for state in options.OPTIONS[o].states]
        for model in model_types:
            for top, use in tops:
                for flags in variants:
                    conf = Configuration(name, model, {**flags, **top}, use)
                    if top and version is not None and not adapter.supports(conf.flags):
                        why = (f"{adapter.package} {version} has no flag "
                               f"{', '.join(sorted(top))}")
                        refused.append((conf, why))
                    else:
                        found.append(conf)
    return found, refused


def not_run(conf: Configuration, reason: str, version: str | None = None) -> FrameworkRow:
    return FrameworkRow(framework=conf.framework, version=version, model=conf.model,
                        flags=conf.flags, uses=conf.uses, verdict=Verdict.NOT_RUN,
                        reason=reason, stack=stack())


DEFAULT_FRAMEWORKS = ("hf", "accelerate", "lightning", "trl")
DEFAULT_MODELS = ("gpt2", "llama")


def parse_names(text: str | None, default: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()] or list(default)
    if what == "framework":
        for name in names:
            if frameworks.exclusive(frameworks.adapter(name)) and len(set(names)) > 1:
                raise frameworks.UnknownFramework(
                    f"--framework: {name} patches transformers and TRL for its whole "
                    f"process: audit it alone (--framework {name})")
    elif frameworks.installed("transformers") is not None:
        for name in names:
            models.config(name, 8)  # UnknownModel: bad input
    return list(dict.fromkeys(names))


def window_counts(cfg: Any, world_size: int, length: int = 24,
                  data_dir: Path | None = None) -> WindowCounts:
    """The counts of the skewed window that ``audit_frameworks`` feeds every
    framework on ``world_size`` ranks (N, each N_r, R), computed in this
    process before any launch: the window is a function of its shape alone."""
    from course_lib.core import paths
    from course_lib.core.data import load_corpus, locate

    spec = FrameworksJob([], length=length)
    shape = fw_window.WindowShape(world_size, spec.microbatches, spec.batch_size,
                                  spec.length, spec.seed)
    corpus = load_corpus(cfg, locate(cfg, data_dir or paths.data_dir()))
    found = fw_window.counts(fw_window.build(shape, corpus.source))
    return WindowCounts(found.N, found.N_r, found.R)


def audit_frameworks(cfg: Any, out: Path, names: list[str], model_types: list[str],
                     *, sizes: str = "tiny", length: int = 24, timing: bool = False,
                     uses: list[str] | None = None, compare: str = "auto",
                     **kw: Any) -> FrameworksReport:
    """Audit whatever is installed; a framework that is not is ``not run``.
    ``sizes``, ``length``, ``timing``, ``compare``: see FrameworksJob;
    ``uses``: the --with configurations (``frameworks/options.py``)."""
    confs, refused = configurations(names, model_types, uses)
    missing = {}
    for name in names:
        package = frameworks.adapter(name).package
        if frameworks.installed(package) is None:
            missing[name] = f"{package} is not installed: pip install {package}"
    todo = [c for c in confs if c.framework not in missing]
    if todo:
        launch(cfg, out, [FrameworksJob(todo, length=length, sizes=sizes, timing=timing,
                                        compare=compare)], **kw)
        report = FrameworksReport.load(out)
    else:
        p = resolve(kw.get("backend", "auto"),
                    cfg.with_world_size(kw.get("world_size")).train.world_size)
        report = FrameworksReport(world_size=p.world_size, backend=p.backend,
                                  device=p.device, dtype=cfg.train.dtype,
                                  nccl_reference_path=p.nccl_reference_path,
                                  torch=torch.__version__, window={}, rows=[])
    rows = list(report.rows) + [not_run(c, missing[c.framework]) for c in confs
                                if c.framework in missing]
    rows += [not_run(c, why, frameworks.installed(frameworks.adapter(c.framework).package))
             for c, why in refused]
    report = dataclasses.replace(report, rows=rows)
    report.save(out)
    return report
