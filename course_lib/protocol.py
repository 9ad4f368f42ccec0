"""The course's protocol as Python calls; the CLI and the notebooks use these.

Run directories: the main trajectory (stop at 50, then resume to 100) lives
in ``<out>``; the continuous control run in ``<out>/continuous``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import checkpoint, jobs, launch, paths, reports
from .config import Config, load
from .data import Corpus, collate, load_corpus, locate, parity_window
from .data import prepare as prepare_data
from .evaluate import bayes_accuracy, evaluate
from .model import build_model
from .reference import reference_gradient


def load_config(path: str | Path | None = None) -> Config:
    return load(path or paths.config_path("minimum"))


def out_dir(cfg: Config, out: str | Path | None = None) -> Path:
    return Path(out) if out else paths.default_out(cfg.name)


def continuous_dir(out: Path) -> Path:
    return Path(out) / "continuous"


def prepare(cfg: Config, data_dir: Path | None = None) -> tuple[Corpus, str]:
    return prepare_data(cfg, data_dir or paths.data_dir())


def corpus(cfg: Config, data_dir: Path | None = None) -> Corpus:
    return load_corpus(cfg, locate(cfg, data_dir or paths.data_dir()))


def reference(cfg: Config, out: Path, data_dir: Path | None = None,
              world_size: int | None = None) -> dict:
    """The single-process reference gradient for the parity window."""
    world_size = world_size or cfg.train.world_size
    cfg = cfg.with_world_size(world_size)
    data = corpus(cfg, data_dir)
    window = parity_window(cfg, data, world_size)
    micro = [collate(data, ids, r not in cfg.train.empty_ranks)
             for r in range(world_size) for ids in window[r]]
    model = build_model(cfg).eval()
    grad, n, loss = reference_gradient(model, micro)
    out = Path(out)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    torch.save(grad, out / "reports" / "reference_grad.pt")
    report = {
        "device": "cpu",
        "backend": "none (single process)",
        "dtype": cfg.train.dtype,
        "step": cfg.parity.step,
        "world_size_of_plan": world_size,
        "global_tokens": n,
        "window_loss_per_token": loss,
        "compared_values": int(grad.numel()),
        "grad_norm": float(grad.norm()),
    }
    reports.write(out, "reference", report)
    return report


def _launch(cfg: Config, out: Path, todo: list[jobs.Job], **kw) -> launch.LaunchResult:
    data_dir = kw.pop("data_dir", None) or paths.data_dir()
    return launch.launch(cfg, out, todo, data_dir=data_dir, **kw)


def train_job(run_dir: Path, label: str, stop: int,
              resume: Path | None = None) -> jobs.TrainJob:
    return jobs.TrainJob(run_dir=str(Path(run_dir).resolve()), label=label, stop=stop,
                         resume=str(Path(resume).resolve()) if resume else None)


def ablation_job(out: Path, cfg: Config) -> jobs.AblationsJob:
    out = Path(out).resolve()
    return jobs.AblationsJob(
        resume_from=str(checkpoint.step_dir(out, cfg.train.stop_at)),
        resumed=str(checkpoint.step_dir(out, cfg.train.updates)),
        continuous=str(checkpoint.step_dir(continuous_dir(out), cfg.train.updates)),
    )


def exercise_job(exercise_cfg: Config) -> jobs.ExerciseJob:
    if exercise_cfg.exercise is None or not exercise_cfg.exercise.scenarios:
        raise ValueError("exercise: this config has no exercise.scenarios")
    return jobs.ExerciseJob(config=exercise_cfg.to_dict())


class ReportElsewhere(Exception):
    """The job succeeded, but global rank 0 (which writes reports) ran on
    another node, with its own ``--out``."""


def parity(cfg: Config, out: Path, **kw) -> reports.ParityReport:
    elsewhere = reports.location_path(out)
    elsewhere.unlink(missing_ok=True)
    _launch(cfg, out, [jobs.ParityJob()], **kw)
    if not reports.report_path(out, "parity").is_file() and elsewhere.is_file():
        where = json.loads(elsewhere.read_text())
        raise ReportElsewhere(f"the parity report is on the node of global rank 0: "
                              f"{where['host']}:{where['out']}/reports/parity.json")
    return reports.load(out, "parity")


def check_resumable(cfg: Config, path: Path, world_size: int | None = None,
                    data_dir: Path | None = None) -> dict:
    """Refuse, before any launch, a checkpoint that does not fit this run."""
    data = corpus(cfg, data_dir)
    return checkpoint.verify(path, cfg=cfg, data_lock=data.lock,
                             world_size=world_size or cfg.train.world_size)


def train(cfg: Config, out: Path, *, stop_at: int | None = None,
          continuous: bool = False, resume: Path | None = None, **kw) -> Path:
    """One training run; returns its run directory."""
    out = Path(out)
    if continuous:
        job = train_job(continuous_dir(out), "continuous", cfg.train.updates)
    elif resume is not None:
        check_resumable(cfg, resume, kw.get("world_size"), kw.get("data_dir"))
        job = train_job(out, "resume", stop_at or cfg.train.updates, resume)
    else:
        job = train_job(out, "stop", stop_at or cfg.train.stop_at)
    _launch(cfg, out, [job], **kw)
    return Path(job.run_dir)


def stop_and_continuous(cfg: Config, out: Path, **kw) -> tuple[Path, Path]:
    """The stopped run and the continuous control, in one launch.

    Both start from scratch (fresh_state), so sharing a process carries
    nothing from one to the other.
    """
    out = Path(out)
    _launch(cfg, out, [train_job(out, "stop", cfg.train.stop_at),
                       train_job(continuous_dir(out), "continuous", cfg.train.updates)], **kw)
    return out, continuous_dir(out)


def resume_check(cfg: Config, out: Path, resume: bool = False,
                 **kw) -> reports.ResumeReport:
    """Compare the resumed run with the continuous one, then the ablations.

    ``resume=True`` first resumes from the stop checkpoint in this same, new
    launch, so nothing but the checkpoint links it to the stopped run.
    """
    out = Path(out)
    job = ablation_job(out, cfg)
    todo: list[jobs.Job] = [job]
    if resume:
        stop = Path(job.resume_from)
        todo.insert(0, train_job(out, "resume", cfg.train.updates, stop))
    checked = ("resume_from", "continuous") if resume else (
        "resume_from", "resumed", "continuous")
    for key in checked:
        check_resumable(cfg, Path(getattr(job, key)), kw.get("world_size"),
                        kw.get("data_dir"))
    _launch(cfg, out, todo, **kw)
    return reports.load(out, "resume")


def exercise(exercise_cfg: Config, out: Path, **kw) -> reports.ExerciseReport:
    _launch(exercise_cfg, out, [exercise_job(exercise_cfg)], **kw)
    return reports.load(out, "exercise")


def evaluate_run(cfg: Config, out: Path, ckpt: Path | None = None,
                 data_dir: Path | None = None) -> reports.EvaluationReport:
    """Evaluate a checkpoint (default: the latest valid one) on the test split."""
    data = corpus(cfg, data_dir)
    out = Path(out)
    if ckpt is None:
        ckpt = checkpoint.latest_valid(out)
        if ckpt is None:
            raise FileNotFoundError(f"no valid checkpoint under {out}/checkpoints")
    trainer = checkpoint.verify(ckpt, data_lock=data.lock)
    trained = build_model(cfg)
    trained.load_state_dict(checkpoint.load_params(ckpt))
    after = evaluate(trained, data)
    before = evaluate(build_model(cfg), data)
    report = {
        "device": "cpu",
        "backend": "none (single process)",
        "checkpoint": str(Path(ckpt).resolve().relative_to(out.resolve())),
        "step": trainer["step"],
        "test_sequences": after["sequences"],
        "test_tokens": after["tokens"],
        "loss_per_token": after["loss_per_token"],
        "token_accuracy": after["token_accuracy"],
        "entropy_floor": data.entropy_floor,
        "bayes_accuracy": bayes_accuracy(data),
        "untrained": {"loss_per_token": before["loss_per_token"],
                      "token_accuracy": before["token_accuracy"]},
        "above_floor_by": after["loss_per_token"] - data.entropy_floor,
    }
    reports.write(out, "evaluation", report)
    return reports.load(out, "evaluation")


def run_all(cfg: Config, out: Path, exercise_cfg: Config | None = None,
            **kw) -> str:
    """The whole protocol, launch by launch as chapters 05, 09 and 07 run it,
    then the summary table: parity; the exercise; stop at K and the
    continuous run; the resume from K in a fresh process, then the ablations.
    """
    out = Path(out)
    data_dir = kw.get("data_dir")
    prepare(cfg, data_dir)
    reference(cfg, out, data_dir, kw.get("world_size"))
    parity(cfg, out, **kw)
    if exercise_cfg is not None:
        exercise(exercise_cfg, out, **kw)
    stop_and_continuous(cfg, out, **kw)
    resume_check(cfg, out, resume=True, **kw)
    evaluate_run(cfg, out, checkpoint.step_dir(out, cfg.train.updates), data_dir)
    return summary(out)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _parity_rows(p: reports.ParityReport) -> list[tuple[str, str, str]]:
    ok, bad = p.correct, p.control_mode
    rows = [("parity, global_token", "PASS" if ok.allclose else "FAIL",
             f"max |err| {_fmt(ok.max_abs_err)}, {ok.violations} violations "
             f"of {p.compared_values:,}")]
    if p.world_size > 1:
        rows.append(("parity, mean_of_means",
                     "FAIL (expected)" if not bad.allclose else "PASS (unexpected)",
                     f"max |err| {_fmt(bad.max_abs_err)}, {bad.violations} violations"))
    return rows


def _resume_rows(r: reports.ResumeReport) -> list[tuple[str, str, str]]:
    rows = [(f"resume at step {r.step}", "IDENTICAL" if r.identical else "DIFFERS",
             f"max |diff| {r.max_abs_param_diff!r} over {r.compared_values:,}")]
    for name, a in r.ablations.items():
        rows.append((f"  ablation {name}", "differs" if a["matters"] else "same",
                     f"max |diff| {_fmt(a['max_abs_param_diff'])}"))
    return rows


def _evaluation_rows(e: reports.EvaluationReport) -> list[tuple[str, str, str]]:
    u = e.untrained
    return [
        ("test loss per token", f"{e.loss_per_token:.4f}",
         f"untrained {u['loss_per_token']:.4f}, entropy floor {e.entropy_floor:.4f}"),
        ("token accuracy", f"{100 * e.token_accuracy:.2f}%",
         f"untrained {100 * u['token_accuracy']:.2f}%, "
         f"{e.test_tokens:,} tokens in {e.test_sequences} sequences"),
    ]


def _exercise_rows(x: reports.ExerciseReport) -> list[tuple[str, str, str]]:
    return [(f"exercise {sc['name']} {sc['tokens']}",
             f"{sc['mean_of_means']:g} vs {sc['global_mean']:g}",
             "mean_of_means grad allclose: "
             f"{sc['gradients']['mean_of_means']['allclose']}")
            for sc in x.scenarios]


def _bugs_rows(b: reports.BugsReport) -> list[tuple[str, str, str]]:
    bugs = [r for r in b.steps.values() if r.kind == "bug"]
    correct = len(b.steps) - len(bugs)
    return [("bug catalog", "ALL CAUGHT" if b.every_bug_caught else "MISSED",
             f"{sum(bool(r.caught_by) for r in bugs)} of {len(bugs)} bugs caught; "
             f"{correct} correct designs, false alarms: {not b.no_false_alarm}")]


def _recipes_rows(r: reports.RecipesReport) -> list[tuple[str, str, str]]:
    exact = [n for n, row in r.recipes.items() if row.verdict == "exact"]
    return [("production recipes", "AS PREDICTED" if r.every_prediction_holds
             else "SURPRISE", f"{len(exact)} of {len(r.recipes)} train the token mean")]


SECTIONS = {
    "parity": (_parity_rows, "run `course-lib parity`"),
    "resume": (_resume_rows, "run `course-lib resume-check`"),
    "evaluation": (_evaluation_rows, "run `course-lib evaluate`"),
    "exercise": (_exercise_rows, "run `course-lib exercise`"),
    "bugs": (_bugs_rows, "run `course-lib bugs`"),
    "recipes": (_recipes_rows, "run `course-lib recipes`"),
}
PROTOCOL = ("parity", "resume", "evaluation", "exercise")  # what run-all produces


def summary(out: Path, sections: tuple[str, ...] = PROTOCOL) -> str:
    """The closing table ("bilan") from whatever reports ``out`` holds."""
    out = Path(out)
    loaded = {}
    for name in dict.fromkeys(("parity", *sections)):
        try:
            loaded[name] = reports.load(out, name)
        except FileNotFoundError:
            pass
    rows = []
    for name in sections:
        make_rows, hint = SECTIONS[name]
        rows += make_rows(loaded[name]) if name in loaded else [(name, "missing", hint)]
    header = "no parity report yet"
    if "parity" in loaded:
        p = loaded["parity"]
        header = f"{p.world_size} ranks, {p.backend} on {p.device}" + (
            "" if p.nccl_reference_path else " (not the NCCL reference path)")
    width = max(len(r[0]) for r in rows)
    lines = [f"Summary: {header}"]
    lines += [f"  {a:<{width}}  {b:<17} {c}" for a, b, c in rows]
    return "\n".join(lines)


def summary_json(out: Path) -> dict:
    found = {}
    for name in ("parity", "resume", "evaluation", "exercise"):
        path = reports.report_path(out, name)
        if path.is_file():
            found[name] = json.loads(path.read_text())
    return found
