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

from course_lib.core import checkpoint, paths
from course_lib.core.config import Config, load
from course_lib.core.data import Corpus, collate, load_corpus, locate, parity_window
from course_lib.core.data import prepare as prepare_data
from course_lib.core.model import build_model
from course_lib.core.reference import reference_gradient
from course_lib.core.verdicts import Verdict
from course_lib.course.edition import tr
from course_lib.jobs.audit import BugsReport
from course_lib.jobs.evaluate import EvaluationReport, evaluate_run
from course_lib.jobs.exercise import ExerciseReport, exercise
from course_lib.jobs.frameworks import FrameworksReport
from course_lib.jobs.parity import ParityReport, parity
from course_lib.jobs.recipes import RecipesReport
from course_lib.jobs.resume import ResumeReport, resume_check
from course_lib.jobs.train import stop_and_continuous
from course_lib.reports.numbers import short
from course_lib.reports.store import Report


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


# --- the closing table ---------------------------------------------------------------

Row = tuple[str, str, str]


def _parity_rows(p: ParityReport) -> list[Row]:
    ok, bad = p.correct, p.control_mode
    rows = [("parity, global_token", tr("PASS") if ok.allclose else tr("FAIL"),
             f"max |err| {short(ok.max_abs_err)}, {ok.violations} violations "
             f"of {p.compared_values:,}")]
    if p.world_size > 1:
        rows.append(("parity, mean_of_means",
                     tr("FAIL (expected)") if not bad.allclose
                     else tr("PASS (unexpected)"),
                     f"max |err| {short(bad.max_abs_err)}, {bad.violations} violations"))
    return rows


def _resume_rows(r: ResumeReport) -> list[Row]:
    rows = [(f"resume at step {r.step}", tr("IDENTICAL") if r.identical else tr("DIFFERS"),
             f"max |diff| {r.max_abs_param_diff!r} over {r.compared_values:,}")]
    for name, a in r.ablations.items():
        rows.append((f"  ablation {name}", tr("differs") if a.matters else tr("same"),
                     f"max |diff| {short(a.max_abs_param_diff)}"))
    return rows


def _evaluation_rows(e: EvaluationReport) -> list[Row]:
    u = e.untrained
    return [
        ("test loss per token", f"{e.loss_per_token:.4f}",
         f"untrained {u.loss_per_token:.4f}, entropy floor {e.entropy_floor:.4f}"),
        ("token accuracy", f"{100 * e.token_accuracy:.2f}%",
         f"untrained {100 * u.token_accuracy:.2f}%, "
         f"{e.test_tokens:,} tokens in {e.test_sequences} sequences"),
    ]


def _exercise_rows(x: ExerciseReport) -> list[Row]:
    return [(f"exercise {sc.name} {sc.tokens}",
             f"{sc.mean_of_means:g} vs {sc.global_mean:g}",
             f"mean_of_means grad allclose: {sc.gradients.mean_of_means.allclose}")
            for sc in x.scenarios]


def _bugs_rows(b: BugsReport) -> list[Row]:
    bugs = [r for r in b.steps.values() if r.kind == "bug"]
    correct = len(b.steps) - len(bugs)
    return [("bug catalog", tr("ALL CAUGHT") if b.every_bug_caught else tr("MISSED"),
             f"{sum(bool(r.caught_by) for r in bugs)} of {len(bugs)} bugs caught; "
             f"{correct} correct designs, false alarms: {not b.no_false_alarm}")]


def _recipes_rows(r: RecipesReport) -> list[Row]:
    exact = [n for n, row in r.recipes.items() if row.verdict == Verdict.EXACT]
    return [("production recipes", tr("AS PREDICTED") if r.every_prediction_holds
             else tr("SURPRISE"), f"{len(exact)} of {len(r.recipes)} train the token mean")]


def _frameworks_rows(f: FrameworksReport) -> list[Row]:
    measured = [r for r in f.rows if r.verdict != Verdict.NOT_RUN]
    exact = [r for r in measured if r.verdict == Verdict.EXACT]
    names = ", ".join(dict.fromkeys(f"{r.framework} {r.version}" for r in measured))
    return [("frameworks, audited", tr("MEASURED") if f.every_verdict_measured
             else tr("NOT RUN"),
             f"{len(exact)} of {len(measured)} train the token mean ({names})")]


@dataclass(frozen=True)
class Section:
    report: type[Report]
    rows: Callable[[Any], list[Row]]
    hint: str


SECTIONS: dict[str, Section] = {
    "parity": Section(ParityReport, _parity_rows, "run `course-lib parity`"),
    "resume": Section(ResumeReport, _resume_rows, "run `course-lib resume-check`"),
    "evaluation": Section(EvaluationReport, _evaluation_rows, "run `course-lib evaluate`"),
    "exercise": Section(ExerciseReport, _exercise_rows, "run `course-lib exercise`"),
    "bugs": Section(BugsReport, _bugs_rows, "run `course-lib bugs`"),
    "recipes": Section(RecipesReport, _recipes_rows, "run `course-lib recipes`"),
    "frameworks": Section(FrameworksReport, _frameworks_rows,
                          "run `course-lib frameworks`"),
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
            (name, tr("missing"), section.hint)]
    header = "no parity report yet"
    p = loaded.get("parity")
    if isinstance(p, ParityReport):
        header = f"{p.world_size} ranks, {p.backend} on {p.device}" + (
            "" if p.nccl_reference_path else " (not the NCCL reference path)")
    width = max(len(r[0]) for r in rows)
    lines = [f"Summary: {header}"]
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

