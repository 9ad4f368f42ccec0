"""The course's protocol as Python calls; the CLI and the notebooks use these.

The launches themselves are the job kinds' parent-side calls
(``jobs.parity.parity``, ``jobs.train.train``, ...); this module adds what
runs in the calling process (the single-process reference, the evaluation),
the whole protocol in one call, and the closing table.

Run directories: the main trajectory (stop at 50, then resume to 100) lives
in ``<out>``; the continuous control run in ``<out>/continuous``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib.core import checkpoint, edition, paths
from course_lib.core.config import Config, load
from course_lib.core.data import Corpus, collate, load_corpus, locate, parity_window
from course_lib.core.data import prepare as prepare_data
from course_lib.core.edition import decimal, number, tr
from course_lib.core.model import build_model
from course_lib.core.reference import reference_gradient
from course_lib.core.verdicts import Verdict
from course_lib.jobs.audit import BugsReport
from course_lib.jobs.evaluate import EvaluationReport, evaluate_run
from course_lib.jobs.exercise import ExerciseReport, exercise
from course_lib.jobs.frameworks import FrameworksReport
from course_lib.jobs.parity import ParityReport, parity
from course_lib.jobs.recipes import RecipesReport
from course_lib.jobs.resume import ResumeReport, resume_check
from course_lib.jobs.train import stop_and_continuous
from course_lib.reports.store import Report
from course_lib.run.placement import Placement
from course_lib.steps import BUILTIN


def load_config(path: str | Path | None = None) -> Config:
    return load(path or paths.config_path("minimum"))


def prepare(cfg: Config, data_dir: Path | None = None) -> tuple[Corpus, str]:
    return prepare_data(cfg, data_dir or paths.data_dir())


def corpus(cfg: Config, data_dir: Path | None = None) -> Corpus:
    return load_corpus(cfg, locate(cfg, data_dir or paths.data_dir()))


@dataclass(frozen=True)
class ReferenceReport(Report):
    """The single-process reference of the parity window -> reports/reference.json."""

    NAME: ClassVar[str] = "reference"
    device: str
    backend: str
    dtype: str
    step: int
    world_size_of_plan: int
    global_tokens: int
    window_loss_per_token: float
    compared_values: int
    grad_norm: float
    extra: dict = field(default_factory=dict, repr=False)


def single_process_reference(cfg: Config, out: Path, data_dir: Path | None = None,
                             world_size: int | None = None,
                             device: str = "cpu") -> ReferenceReport:
    """The single-process reference gradient for the parity window, on
    ``device`` ("cpu", or "cuda": the first GPU)."""
    cfg = cfg.with_world_size(world_size)
    world_size = cfg.train.world_size
    data = corpus(cfg, data_dir)
    window = parity_window(cfg, data, world_size)
    where = torch.device(device)
    micro = [collate(data, ids, r not in cfg.train.empty_ranks, where)
             for r in range(world_size) for ids in window[r]]
    model = build_model(cfg).to(where).eval()
    grad, n, loss = reference_gradient(model, micro)
    grad = grad.cpu()
    out = Path(out)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    torch.save(grad, out / "reports" / "reference_grad.pt")
    report = ReferenceReport(
        device=where.type, backend="none (single process)", dtype=cfg.train.dtype,
        step=cfg.parity.step, world_size_of_plan=world_size, global_tokens=n,
        window_loss_per_token=loss, compared_values=int(grad.numel()),
        grad_norm=float(grad.norm()))
    report.save(out)
    return report


def run_all(cfg: Config, out: Path, exercise_cfg: Config | None = None,
            **kw: Any) -> str:
    """The whole protocol, launch by launch as chapters 04 and 06 run it,
    then the summary table: parity; the exercise; stop at K and the
    continuous run; the resume from K in a fresh process, then the ablations.
    """
    out = Path(out)
    data_dir = kw.get("data_dir")
    prepare(cfg, data_dir)
    single_process_reference(cfg, out, data_dir, kw.get("world_size"))
    parity(cfg, out, **kw)
    if exercise_cfg is not None:
        exercise(exercise_cfg, out, **kw)
    stop_and_continuous(cfg, out, **kw)
    resume_check(cfg, out, resume=True, **kw)
    evaluate_run(cfg, out, checkpoint.step_dir(out, cfg.train.updates), data_dir)
    return summary(out)


# --- what a chapter prints from the engine ------------------------------------------


def describe_placement(p: Placement) -> str:
    """``Placement.describe`` in the edition: where the chapter's launches run.
    The run layer's own text stays English (the CLI and the logs print it)."""
    what = tr("1 rank(s), {backend} on {device}") if p.world_size == 1 else tr(
        "{ranks} rank(s), {backend} on {device}")
    what = what.format(ranks=p.world_size, backend=p.backend, device=edition.device(p.device))
    if p.nccl_reference_path:
        return what + tr(" (the NCCL reference path)")
    return what + tr(" (not the NCCL reference path: a CPU/gloo stand-in)")


def step_table() -> str:
    """Chapter 05's table of the built-in step functions, as Markdown: the
    course's designs, and the others under test until the audit runs."""
    rows = [f"| `{name}` | {tr('the course') if info.kind == 'correct' else tr('under test')}"
            f" | {tr(info.description)} |" for name, info in BUILTIN.items()]
    head = "| {} | {} | {} |".format(tr("step function"), tr("status"), tr("what it does"))
    return "\n".join([head, "|---|---|---|", *rows])


def unset(name: str) -> str:
    """What a cell prints while the learner's ``name`` is still None."""
    return tr("set {name} above, then run the cell again").format(name=name)


# --- the closing table ---------------------------------------------------------------

Row = tuple[str, str, str]


def _short(x: float | None) -> str:
    """``short`` in the edition's numbers: three significant digits, or n/a."""
    return tr("n/a") if x is None else number(x, ".3g")


def _flag(value: bool) -> str:
    """True or False as the edition writes a yes or a no."""
    return tr("True") if value else tr("False")


def _parity_rows(p: ParityReport) -> list[Row]:
    ok, bad = p.correct, p.control_mode
    rows = [(tr("parity, {mode}").format(mode="global_token"),
             tr("PASS") if ok.allclose else tr("FAIL"),
             tr("max |err| {err}, {violations} violations of {values}").format(
                 err=_short(ok.max_abs_err), violations=number(ok.violations, "d"),
                 values=number(p.compared_values)))]
    if p.world_size > 1:
        rows.append((tr("parity, {mode}").format(mode="mean_of_means"),
                     tr("FAIL (expected)") if not bad.allclose
                     else tr("PASS (unexpected)"),
                     tr("max |err| {err}, {violations} violations").format(
                         err=_short(bad.max_abs_err), violations=number(bad.violations, "d"))))
    return rows


def _resume_rows(r: ResumeReport) -> list[Row]:
    rows = [(tr("resume at step {step}").format(step=r.step),
             tr("IDENTICAL") if r.identical else tr("DIFFERS"),
             tr("max |diff| {diff} over {values}").format(
                 diff=number(r.max_abs_param_diff, ""), values=number(r.compared_values)))]
    for name, a in r.ablations.items():
        rows.append((tr("  ablation {name}").format(name=name),
                     tr("differs") if a.matters else tr("same"),
                     f"max |diff| {_short(a.max_abs_param_diff)}"))
    return rows


def _evaluation_rows(e: EvaluationReport) -> list[Row]:
    u = e.untrained
    return [
        (tr("test loss per token"), decimal(e.loss_per_token),
         tr("untrained {untrained}, entropy floor {floor}").format(
             untrained=decimal(u.loss_per_token), floor=decimal(e.entropy_floor))),
        (tr("token accuracy"), number(e.token_accuracy, ".2%"),
         tr("untrained {accuracy}, {tokens} tokens in {sequences} sequences").format(
             accuracy=number(u.token_accuracy, ".2%"), tokens=number(e.test_tokens),
             sequences=number(e.test_sequences, "d"))),
    ]


def _exercise_rows(x: ExerciseReport) -> list[Row]:
    return [(tr("exercise {name} {tokens}").format(name=sc.name, tokens=sc.tokens),
             tr("{mean_of_means} vs {global_mean}").format(
                 mean_of_means=number(sc.mean_of_means, "g"),
                 global_mean=number(sc.global_mean, "g")),
             tr("mean_of_means grad allclose: {allclose}").format(
                 allclose=_flag(sc.gradients.mean_of_means.allclose)))
            for sc in x.scenarios]


def _bugs_rows(b: BugsReport) -> list[Row]:
    bugs = [r for r in b.steps.values() if r.kind == "bug"]
    correct = len(b.steps) - len(bugs)
    return [(tr("bug catalog"), tr("ALL CAUGHT") if b.every_bug_caught else tr("MISSED"),
             tr("{caught} of {bugs} bugs caught; {correct} correct designs, "
                "false alarms: {alarms}").format(
                 caught=sum(bool(r.caught_by) for r in bugs), bugs=len(bugs),
                 correct=correct, alarms=_flag(not b.no_false_alarm)))]


def _recipes_rows(r: RecipesReport) -> list[Row]:
    exact = [n for n, row in r.recipes.items() if row.verdict == Verdict.EXACT]
    return [(tr("production recipes"), tr("AS PREDICTED") if r.every_prediction_holds
             else tr("SURPRISE"), tr("{exact} of {all} train the token mean").format(
                 exact=len(exact), all=len(r.recipes)))]


def _frameworks_rows(f: FrameworksReport) -> list[Row]:
    measured = [r for r in f.rows if r.verdict != Verdict.NOT_RUN]
    exact = [r for r in measured if r.verdict == Verdict.EXACT]
    names = ", ".join(dict.fromkeys(f"{r.framework} {r.version}" for r in measured))
    return [(tr("frameworks, audited"), tr("MEASURED") if f.every_verdict_measured
             else tr("NOT RUN"),
             tr("{exact} of {all} train the token mean ({names})").format(
                 exact=len(exact), all=len(measured), names=names))]


@dataclass(frozen=True)
class Section:
    report: type[Report]
    rows: Callable[[Any], list[Row]]
    command: str  # what writes the report: the summary names it when it is missing


SECTIONS: dict[str, Section] = {
    "parity": Section(ParityReport, _parity_rows, "course-lib parity"),
    "resume": Section(ResumeReport, _resume_rows, "course-lib resume-check"),
    "evaluation": Section(EvaluationReport, _evaluation_rows, "course-lib evaluate"),
    "exercise": Section(ExerciseReport, _exercise_rows, "course-lib exercise"),
    "bugs": Section(BugsReport, _bugs_rows, "course-lib bugs"),
    "recipes": Section(RecipesReport, _recipes_rows, "course-lib recipes"),
    "frameworks": Section(FrameworksReport, _frameworks_rows, "course-lib frameworks"),
}
PROTOCOL = ("parity", "resume", "evaluation", "exercise")  # what run-all produces


def load_reports(out: Path, sections: tuple[str, ...] = PROTOCOL) -> dict[str, Report]:
    """The sections' reports that ``out`` holds, as their classes."""
    found = {}
    for name in dict.fromkeys(sections):
        section = SECTIONS[name]
        if section.report.exists(out):
            found[name] = section.report.load(out)
    return found


def summary(out: Path, sections: tuple[str, ...] = PROTOCOL) -> str:
    """The closing table ("bilan") from whatever reports ``out`` holds."""
    out = Path(out)
    loaded = load_reports(out, ("parity", *sections))
    rows: list[Row] = []
    for name in sections:
        section = SECTIONS[name]
        rows += section.rows(loaded[name]) if name in loaded else [
            (name, tr("missing"), tr("run `{command}`").format(command=section.command))]
    header = tr("no parity report yet")
    p = loaded.get("parity")
    if isinstance(p, ParityReport):
        header = tr("{ranks} ranks, {backend} on {device}").format(
            ranks=p.world_size, backend=p.backend, device=edition.device(p.device)) + (
            "" if p.nccl_reference_path else tr(" (not the NCCL reference path)"))
    width = max(len(r[0]) for r in rows)
    lines = [tr("Summary: {header}").format(header=header)]
    lines += [f"  {a:<{width}}  {b:<17} {c}" for a, b, c in rows]
    return "\n".join(lines)


def protocol_holds(out: Path) -> bool:
    """run-all's verdict: parity passes, the resume is identical while every
    ablation differs, and the trained loss lies between the floor and the
    untrained model's."""
    found = load_reports(out)
    p, r, e = (found.get(n) for n in ("parity", "resume", "evaluation"))
    return (isinstance(p, ParityReport) and p.passed
            and isinstance(r, ResumeReport) and r.identical and r.every_ablation_matters
            and isinstance(e, EvaluationReport) and e.beats_untrained()
            and e.entropy_floor < e.loss_per_token)

