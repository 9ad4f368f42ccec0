"""``course-lib <command>``: exit 0 on success, 1 on a failed check, 2 on bad input."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch

from course_lib import checks, steps
from course_lib.core import arithmetic, checkpoint, edition, objectives, paths
from course_lib.core.config import Config, ConfigError
from course_lib.core.data import DataLockError, lock_record, make_plan
from course_lib.core.verdicts import Verdict
from course_lib.course import api
from course_lib.frameworks import UnknownFramework
from course_lib.frameworks import options as fw_options
from course_lib.frameworks import sketch as fw_sketch
from course_lib.frameworks.models import UnknownModel
from course_lib.jobs import audit as audits
from course_lib.jobs import capstone
from course_lib.jobs import frameworks as fw_job
from course_lib.jobs import recipes as recipe_audit
from course_lib.jobs.evaluate import evaluate_run
from course_lib.jobs.exercise import exercise
from course_lib.jobs.kind import ReportElsewhere
from course_lib.jobs.kind import launch as launch_jobs
from course_lib.jobs.parity import parity
from course_lib.jobs.resume import resume_check
from course_lib.jobs.smoke import SmokeJob
from course_lib.jobs.train import train
from course_lib.reports.store import report_path
from course_lib.run import elastic, launch, progress
from course_lib.run.launch import BackendError, LaunchError


class BadInput(Exception):
    """Exit 2 with this one-line message."""


class CheckFailed(Exception):
    """Exit 1 with this message."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        raise BadInput(message)


def _config(args: argparse.Namespace) -> Config:
    path = Path(args.config)
    if not path.exists() and not path.is_absolute():
        path = paths.project_root() / path
    # --world-size is resolved here, once: below, cfg.train.world_size is the W.
    return api.load_config(path).with_world_size(getattr(args, "world_size", None))


def _out(args: argparse.Namespace, cfg: Config) -> Path:
    return Path(args.out) if args.out else paths.default_out(cfg.name)


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir) if args.data_dir else paths.data_dir()


def _launch_kw(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"data_dir": _data_dir(args), "timeout": args.timeout,
          "backend": getattr(args, "backend", "auto"),
          "device": getattr(args, "device", "auto"),
          "progress": progress.make(stream=sys.stderr),
          "echo": getattr(args, "verbose", False)}
    if getattr(args, "max_restarts", 0):
        kw["max_restarts"] = args.max_restarts
    if getattr(args, "nnodes", 1) > 1 or getattr(args, "rdzv_endpoint", None):
        if not args.rdzv_endpoint:
            raise BadInput("--rdzv-endpoint: required with --nnodes > 1")
        kw["multinode"] = launch.MultiNode(args.nnodes, args.rdzv_endpoint)
    return kw


def _print(obj: object) -> None:
    print(json.dumps(obj, indent=2))


# --- commands ----------------------------------------------------------------


def cmd_check_env(args: argparse.Namespace) -> int:
    cfg = _config(args)
    world = cfg.train.world_size
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpus": launch.gpu_count(),
        "nccl_available": torch.distributed.is_nccl_available(),
        "gloo_available": torch.distributed.is_gloo_available(),
        "world_size": world,
    }
    try:
        placement = launch.resolve(args.backend, world, args.device)
    except BackendError as exc:
        info["problem"] = str(exc)
        _print(info)
        raise CheckFailed(str(exc)) from None
    info.update(backend=placement.backend, device=placement.device,
                nccl_reference_path=placement.nccl_reference_path,
                plan=placement.describe())
    if args.launch:
        out = _out(args, cfg)
        launch_jobs(cfg, out, [SmokeJob()], **_launch_kw(args))
        info["all_reduce"] = "ok"
    _print(info)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    cfg = _config(args)
    try:
        data, status = api.prepare(cfg, _data_dir(args))
    except DataLockError as exc:
        raise CheckFailed(f"data lock mismatch: {exc}") from None
    world = cfg.train.world_size
    plan = make_plan(cfg, data, world)
    out = _out(args, cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan))
    _print({**lock_record(cfg, data), "status": status,
            "plan": {"updates": len(plan), "world_size": world,
                     "file": str(out / "plan.json")}})
    return 0


def cmd_check_loss(args: argparse.Namespace) -> int:
    ex = arithmetic.counter_example()
    _print(ex)
    if (ex["mean_of_means"], ex["global_mean"]) != (2.0, 2.5):
        raise CheckFailed("the counter-example no longer gives 2 versus 2.5")
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.device == "cuda" and not launch.gpu_count():
        raise BadInput("--device cuda: no GPU is visible")
    report = api.single_process_reference(cfg, _out(args, cfg), _data_dir(args),
                                          device=args.device)
    _print(report.to_dict())
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    try:
        report = parity(cfg, out, **_launch_kw(args))
    except ReportElsewhere as where:
        print(f"parity: the job succeeded; {where}")
        return 0
    print(api.summary(out, sections=("parity",)))
    if not report.passed:
        raise CheckFailed("parity: global_token must pass and mean_of_means must fail")
    return 0


OBJECTIVE_HELP = ("the unit the reference averages over: " + ", ".join(
    f"{n}:{objectives.VALUED[n][1]}" if n in objectives.VALUED else n
    for n in objectives.NAMES) + f" (default {objectives.DEFAULT})")
EXACT_COMPARE_HELP = (
    "compare the gradients whole, however large: by default, gradients of more than "
    f"{fw_sketch.WHOLE_UP_TO:,} components are compared through a sketch of "
    f"{fw_sketch.ROWS * fw_sketch.COLS:,} numbers each, which misses an error 10 times "
    f"the tolerance with a probability of at most {fw_sketch.miss_bound(10, 1):.1e}")


def cmd_audit(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    if (args.step is None) == (args.trainer is None):
        raise BadInput("audit: give --step SPEC or --trainer SPEC (one of them)")
    if args.trainer is not None:
        if args.objective is not None:
            raise BadInput("audit: --objective applies to --step; a --trainer is "
                           "audited against the token mean")
        return _audit_trainer(args, cfg, out)
    if args.uses is not None:
        raise BadInput("audit: --with applies to --trainer, not to --step")
    if args.exact_compare:
        raise BadInput("audit: --exact-compare applies to --trainer: a --step's "
                       "gradients are always compared whole")
    names = audits.parse_checks(args.checks)
    found = audits.audit(cfg, out, [args.step], names, dtype=args.dtype,
                         objective=args.objective, **_launch_kw(args))
    (report,) = found.values()
    print(audits.describe(report))
    print(f"report: {report_path(out, audits.AuditReport.file_name(report.step))}")
    if not report.passed:
        failed = [c for c, r in report.checks.items() if not r.passed]
        raise CheckFailed(f"{report.step} fails {', '.join(failed)}")
    return 0


def _audit_trainer(args: argparse.Namespace, cfg: Config, out: Path) -> int:
    uses = fw_options.parse(args.uses, ["trainer"])
    found = fw_job.audit_trainer(cfg, out, args.trainer, args.model or "llama", uses,
                                 compare=_compare(args), **_launch_kw(args))
    print(fw_job.describe(found))
    print(f"report: {report_path(out, fw_job.trainer_report_name(args.trainer))}")
    for row in found.rows:
        if row.bad_input:
            raise BadInput(row.reason.split(": ", 1)[1])  # it returned no Trainer
    for row in found.rows:
        if row.verdict != Verdict.EXACT:
            raise CheckFailed(f"{args.trainer}{_with(row.uses)}: {row.verdict}, "
                              f"nearest formula: {row.matches or row.reason}")
    return 0


def _compare(args: argparse.Namespace) -> str:
    return "exact" if args.exact_compare else "auto"


def _with(uses: dict[str, Any]) -> str:
    return "".join(f" --with {name}" for name in uses)


def cmd_capstone(args: argparse.Namespace) -> int:
    if args.world_size is not None:
        worlds = sorted({*capstone.EVALUATION_WORLDS, *capstone.STEP_WORLDS})
        raise BadInput("capstone: the grader picks its world sizes "
                       f"({', '.join(map(str, worlds))})")
    cfg = _config(args)
    out = _out(args, cfg)
    report = capstone.check(cfg, out, Path(args.file), **_launch_kw(args))
    print(capstone.describe(report))
    print(f"report: {report_path(out, capstone.CapstoneReport.NAME)}")
    if not report.passed:
        raise CheckFailed(f"{args.file} fails {', '.join(report.failed)}")
    return 0


def cmd_bugs(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    report = audits.bugs(cfg, out, objective=args.objective, dtype=args.dtype,
                         **_launch_kw(args))
    print(audits.describe_bugs(report))
    print(f"report: {report_path(out, audits.BugsReport.NAME)}")
    if not (report.every_bug_caught and report.no_false_alarm):
        raise CheckFailed("a bug went uncaught or a correct design was flagged")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    names = audits.parse_checks(args.checks)
    report = recipe_audit.run(cfg, out, names, dtype=args.dtype, **_launch_kw(args))
    print(recipe_audit.describe(report))
    print(f"report: {report_path(out, recipe_audit.RecipesReport.NAME)}")
    if not report.every_prediction_holds:  # token mean and claim, every window
        raise CheckFailed(f"not as predicted: {', '.join(recipe_audit.mismatches(report))}")
    return 0


def cmd_frameworks(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    names = fw_job.parse_names(args.framework, fw_job.DEFAULT_FRAMEWORKS, "framework")
    model_types = fw_job.parse_names(args.model, fw_job.DEFAULT_MODELS, "model")
    uses = fw_options.parse(args.uses, names)
    report = fw_job.audit_frameworks(cfg, out, names, model_types, uses=uses,
                                     compare=_compare(args), **_launch_kw(args))
    print(fw_job.describe(report))
    print(f"report: {report_path(out, fw_job.FrameworksReport.NAME)}")
    failed = sorted({f"{r.framework}{_with(r.uses)}: {r.reason}" for r in report.rows
                     if r.verdict == Verdict.FAILED})
    missing = sorted({r.reason for r in report.rows if r.verdict == Verdict.NOT_RUN})
    if failed or missing:
        raise CheckFailed("; ".join([*(f"failed: {f}" for f in failed),
                                     *(["not run: " + "; ".join(missing)] if missing
                                       else [])]))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    run_dir = train(cfg, out, stop_at=args.stop_at, continuous=args.continuous,
                    resume=Path(args.resume) if args.resume else None,
                    **_launch_kw(args))
    latest = checkpoint.latest_valid(run_dir)
    restarts = [{"restart": r.restart, "resumed_from_step": r.resumed_from_step}
                for r in elastic.read_restarts([run_dir])]
    _print({"run_dir": str(run_dir), "latest_checkpoint": str(latest),
            "restarts": restarts})
    return 0


def cmd_resume_check(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    r = resume_check(cfg, out, **_launch_kw(args))
    _print({"step": r.step, "identical": r.identical,
            "max_abs_param_diff": r.max_abs_param_diff,
            "compared_values": r.compared_values,
            "ablations": {k: v.max_abs_param_diff for k, v in r.ablations.items()}})
    if not r.identical:
        raise CheckFailed("resume differs from the continuous run")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    kw = _launch_kw(args)
    if "multinode" in kw:
        raise BadInput("evaluate: runs on one node (--nnodes 1)")
    if args.world_size:  # the evaluation runs in this process unless it is given
        kw["world_size"] = args.world_size
    e = evaluate_run(cfg, out, ckpt, **kw)
    shown = {"world_size": e.world_size, "backend": e.backend,
             "test_sequences": e.test_sequences, "test_tokens": e.test_tokens,
             "loss_per_token": e.loss_per_token, "token_accuracy": e.token_accuracy,
             "entropy_floor": e.entropy_floor, "untrained": asdict(e.untrained)}
    d = e.distributed
    if d is not None:
        shown.update(repeats=d.repeats, duplicates_kept=asdict(d.duplicates_kept),
                     mean_of_rank_means=asdict(d.mean_of_rank_means),
                     single_process=asdict(d.single_process), max_abs_diff=d.max_abs_diff,
                     matches_single_process=d.matches_single_process)
    _print(shown)
    if d is not None and not d.matches_single_process:
        raise CheckFailed("the token-weighted evaluation differs from the single-process one")
    if not e.beats_untrained():
        raise CheckFailed("the trained model is no better than the untrained one")
    return 0


def cmd_exercise(args: argparse.Namespace) -> int:
    cfg = _config(args)
    x = exercise(cfg, _out(args, cfg), **_launch_kw(args))
    for sc in x.scenarios:
        g = sc.gradients
        print(f"{sc.name}: tokens {sc.tokens}  mean of means "
              f"{sc.mean_of_means:g}  global mean {sc.global_mean:g}  "
              f"grad allclose: global_token={g.global_token.allclose} "
              f"mean_of_means={g.mean_of_means.allclose}")
    if not all(sc.gradients.global_token.allclose for sc in x.scenarios):
        raise CheckFailed("exercise: the global_token gradient left the tolerance")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    for p in (args.ckpt_a, args.ckpt_b):
        checkpoint.verify(Path(p))
    result = checkpoint.compare_params(checkpoint.load_params(Path(args.ckpt_a)),
                                       checkpoint.load_params(Path(args.ckpt_b)))
    _print(result)
    return 0


def cmd_check_checkpoints(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = _out(args, cfg)
    found = checkpoint.list_checkpoints(out)
    bad = []
    for path in found:
        try:
            checkpoint.verify(path)
            print(f"ok   {path.relative_to(out)}")
        except checkpoint.CheckpointError as exc:
            print(f"BAD  {path.relative_to(out)}: {exc}")
            bad.append(str(exc))
    leftovers = [p for p in out.rglob("step-*.tmp") if p.is_dir()]
    for p in leftovers:
        print(f"skip {p.relative_to(out)} (an interrupted write, never loaded)")
    if not found:
        print(f"no checkpoint under {out}")
    if bad:
        raise CheckFailed(f"{len(bad)} bad checkpoint(s); first: {bad[0]}")
    return 0


def generated_paths(root: Path) -> list[Path]:
    """What the course generates: never data/, configs/ or notebook sources."""
    found = [root / "runs"]
    for pattern in ("**/__pycache__", "**/.ipynb_checkpoints", ".pytest_cache",
                    ".ruff_cache", ".mypy_cache", ".import_linter_cache", "*.egg-info"):
        found += [p for p in root.glob(pattern) if ".venv" not in p.parts]
    protected = [root / "data", root / "configs"]
    return sorted(p for p in set(found) if p.exists()
                  and not any(p == q or q in p.parents for q in protected))


def cmd_clean(args: argparse.Namespace) -> int:
    if args.scope != "generated":
        raise BadInput(f"--scope: only 'generated' is supported, got {args.scope!r}")
    root = paths.project_root()
    targets = generated_paths(root)
    for p in targets:
        print(("would remove " if args.dry_run else "removing ") + str(p.relative_to(root)))
        if not args.dry_run:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if not targets:
        print("nothing to clean")
    return 0


def cmd_run_all(args: argparse.Namespace) -> int:
    cfg = _config(args)
    ex_path = Path(args.exercise_config)
    if not ex_path.exists() and not ex_path.is_absolute():
        ex_path = paths.project_root() / ex_path
    ex_cfg = api.load_config(ex_path).with_world_size(args.world_size)
    out = _out(args, cfg)
    table = api.run_all(cfg, out, ex_cfg, **_launch_kw(args))
    print(table)
    if not api.protocol_holds(out):
        raise CheckFailed("run-all: at least one check above did not hold")
    return 0


# --- parser ------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="course-lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
            launches: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--config", default="configs/minimum.yaml")
        p.add_argument("--out", default=None, help="default: runs/<config name>")
        p.add_argument("--data-dir", default=None, help="default: data/")
        p.add_argument("--world-size", type=int, default=None)
        if launches:
            p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
            p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                           help="gloo only: cuda runs gloo ranks on GPUs")
            p.add_argument("--timeout", type=float, default=900.0,
                           help="seconds before the whole job is killed")
            p.add_argument("--nnodes", type=int, default=1)
            p.add_argument("--node-rank", type=int, default=0,
                           help="accepted, not passed on: the c10d rendezvous "
                           "numbers the nodes itself")
            p.add_argument("--rdzv-endpoint", default=None, help="host:port")
            p.add_argument("--verbose", action="store_true",
                           help="print each launch's torchrun command (to run it by "
                           "hand) and torchrun's output on stderr")
        return p

    p = add("check-env", cmd_check_env, "which backend and device will run", True)
    p.add_argument("--launch", action="store_true", help="also run one all_reduce")
    add("prepare", cmd_prepare, "write or verify the corpus; print the data lock")
    add("check-loss", cmd_check_loss, "the 12/36 counter-example as JSON")
    p = add("reference", cmd_reference, "single-process reference gradient")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add("parity", cmd_parity, "DDP vs reference gradients -> reports/parity.json", True)
    p = add("train", cmd_train, "stop at K (default), continuous, or resume; a fresh "
            "run replaces the checkpoints of any earlier trajectory in its run dir", True)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--continuous", action="store_true")
    mode.add_argument("--resume", default=None, metavar="CKPT_DIR")
    p.add_argument("--stop-at", type=int, default=None)
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="torchrun restarts all workers up to N times after a failure; "
                   "they resume from the newest valid checkpoint")
    add("resume-check", cmd_resume_check, "resumed vs continuous -> resume.json", True)
    p = add("evaluate", cmd_evaluate, "test loss and accuracy -> evaluation.json; in one "
            "process, or on --world-size W ranks (token-weighted)", True)
    p.add_argument("--checkpoint", default=None)
    add("exercise", cmd_exercise, "the 12 -> 36 tokens exercise", True)
    p = add("compare", cmd_compare, "max |param diff| between two checkpoints")
    p.add_argument("ckpt_a")
    p.add_argument("ckpt_b")
    add("check-checkpoints", cmd_check_checkpoints, "verify every checkpoint in --out")
    p = add("clean", cmd_clean, "remove generated files only")
    p.add_argument("--scope", required=True)
    p.add_argument("--dry-run", action="store_true")
    p = add("audit", cmd_audit, "audit a step function by named checks -> "
            "reports/audit-<step>.json", True)
    p.add_argument("--step", default=None, metavar="SPEC",
                   help="a built-in name, package.module:function or file.py:function")
    p.add_argument("--trainer", default=None, metavar="SPEC",
                   help="file.py:make_trainer or module:function: make_trainer(model, "
                   "train_dataset) returns your transformers.Trainer")
    p.add_argument("--model", default=None, metavar="MODEL_TYPE",
                   help="with --trainer: the model class, a transformers model_type "
                   "(default llama)")
    p.add_argument("--with", dest="uses", default=None, metavar="a,b,...",
                   help="with --trainer: configurations on top of it, a row each: "
                   + ", ".join(n for n, o in fw_options.OPTIONS.items()
                               if "trainer" in o.frameworks))
    p.add_argument("--checks", default=None, metavar="a,b,...",
                   help="default: all of " + ", ".join(checks.NAMES))
    p.add_argument("--dtype", default=None, choices=["float32", "float64"])
    p.add_argument("--objective", default=None, metavar="UNIT", help=OBJECTIVE_HELP)
    p.add_argument("--exact-compare", action="store_true",
                   help="with --trainer: " + EXACT_COMPARE_HELP)
    p = add("capstone", cmd_capstone, "grade a training script (examples/capstone/"
            "train.py): its step, its resume, its evaluation -> reports/capstone.json", True)
    p.add_argument("action", choices=["check"], help="check: grade FILE")
    p.add_argument("file", metavar="FILE", help="your train.py")
    p = add("bugs", cmd_bugs, "every built-in step through every check -> "
            "reports/bugs.json", True)
    p.add_argument("--dtype", default=None, choices=["float32", "float64"])
    p.add_argument("--objective", default=None, metavar="UNIT", help=OBJECTIVE_HELP)
    p = add("recipes", cmd_recipes, "the frameworks' recipes: verdicts on a balanced, "
            "a skewed and an empty window -> reports/recipes.json", True)
    p.add_argument("--checks", default=None, metavar="a,b,...",
                   help="default: all of " + ", ".join(checks.NAMES))
    p.add_argument("--dtype", default=None, choices=["float32", "float64"])
    p = add("frameworks", cmd_frameworks, "the real training loops of the installed "
            "frameworks, audited -> reports/frameworks.json", True)
    p.add_argument("--framework", default=None, metavar="a,b,...",
                   help="default: " + ",".join(fw_job.DEFAULT_FRAMEWORKS))
    p.add_argument("--model", default=None, metavar="a,b,...",
                   help="transformers model_types; default: " + ",".join(fw_job.DEFAULT_MODELS))
    p.add_argument("--with", dest="uses", default=None, metavar="a,b,...",
                   help="the configurations people train with, each state a row, instead "
                   "of the plain rows: " + "; ".join(
                       # argparse formats help with %: a summary's own % is text
                       f"{n} ({o.summary})".replace("%", "%%")
                       for n, o in fw_options.OPTIONS.items()))
    p.add_argument("--exact-compare", action="store_true", help=EXACT_COMPARE_HELP)
    p = add("run-all", cmd_run_all, "the whole protocol, then the summary", True)
    p.add_argument("--exercise-config", default="configs/exercise.yaml")
    return parser


def _validate(args: argparse.Namespace) -> None:
    if args.world_size is not None and args.world_size < 1:
        raise BadInput("--world-size: must be at least 1")
    stop_at = getattr(args, "stop_at", None)
    if stop_at is not None and stop_at < 1:
        raise BadInput("--stop-at: must be at least 1")
    if getattr(args, "timeout", 1) <= 0:
        raise BadInput("--timeout: must be positive")
    if getattr(args, "max_restarts", 0) < 0:
        raise BadInput("--max-restarts: must be at least 0")


def main(argv: list[str] | None = None) -> int:
    # What the CLI prints is a contract (DESIGN.md): English, whatever edition
    # the shell or a French chapter's kernel asks for (the describes read it).
    os.environ[edition.ENV] = edition.DEFAULT
    try:
        args = build_parser().parse_args(argv)
        _validate(args)
        code: int = args.func(args)
        return code
    except (BadInput, ConfigError, BackendError, checkpoint.CheckpointError,
            DataLockError, steps.StepSpecError, audits.AuditInputError,
            capstone.CapstoneInputError, UnknownFramework, UnknownModel,
            fw_options.UnknownOption) as exc:
        print(f"course-lib: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. --out not writable, disk full, run dir in use
        print(f"course-lib: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"course-lib: job failed: {exc}", file=sys.stderr)
        return 130 if exc.interrupted else 1
    except CheckFailed as exc:
        print(f"course-lib: check failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("course-lib: interrupted", file=sys.stderr)
        return 130
