"""One-shot GPU check (``make gpu-check``): the course's CUDA paths, end to end.

Runs each stage below as its own ``course-lib`` (or papermill) subprocess, with
its own ``--out`` under ``runs/gpu/`` and a hard timeout, then writes
``runs/gpu/report.json`` and ``runs/gpu/summary.txt`` and prints the summary.

Stages: check-env with one all_reduce (NCCL); the single-process reference;
NCCL parity with one rank per GPU (W = 1 on one GPU, 2 on two; the 2-rank
NCCL stage is "not run" on one GPU, since NCCL refuses two ranks on one
device); 2 gloo ranks on CUDA; the float64 audit of global_token; chapter 04
through papermill.

Exit status: 0 when every stage that ran passed, 1 otherwise, 2 when no CUDA
device is visible (nothing is run). ``--plan N`` prints the plan for N GPUs
and runs nothing (no GPU needed).

The plan (``plan()``) is a pure function; ``execute()`` runs one stage. The
script never imports course_lib: it drives the CLI only, so it keeps working
while the package's layout changes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Before torch is imported in this process (only gpu_count() and the host
# report import it, lazily): torch.cuda.is_available() and device_count() then
# ask NVML instead of initialising CUDA, and a fork after CUDA is initialised
# breaks CUDA in the child. The stages inherit it.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "runs" / "gpu"
CHAPTER = Path("notebooks") / "04_ddp_parity.ipynb"

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"
BUDGET_S = 600.0  # the whole check must finish in under 10 minutes on one GPU
KILL_GRACE_S = 5.0  # SIGTERM first (torchrun then stops its workers), then SIGKILL
JOB_MARGIN_S = 15.0  # course-lib's own --timeout fires this much before ours

# Every subprocess: the plain torchrun path (no fork server), text progress.
STAGE_ENV = {"COURSE_FORKSERVER": "0", "COURSE_PROGRESS": "text",
             "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}

NCCL_ONE_GPU = ("NCCL refuses two ranks on one GPU and only 1 GPU is visible; "
                "needs 2 GPUs")


# --------------------------------------------------------------------------- #
# The plan: pure data.

Reader = Callable[["Stage", "Outcome"], "Verdict"]


@dataclass(frozen=True)
class Outcome:
    """What one finished subprocess left behind, for a stage's reader."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Verdict:
    """A reader's judgement of a run that exited 0."""

    figures: dict
    problem: str | None = None  # None: the stage passed
    remark: str | None = None  # said in the reason of a passed stage


@dataclass(frozen=True)
class Stage:
    """One subprocess of the check and how to judge it.

    ``argv`` is None for a stage that is planned but cannot run on this host;
    ``skip`` then says why. ``read`` turns the finished run into figures and
    a verdict."""

    name: str
    title: str
    argv: tuple[str, ...] | None
    timeout: float
    read: Reader
    out: Path
    backend: str | None = None
    device: str | None = None
    world_size: int | None = None
    skip: str | None = None
    note: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(STAGE_ENV))


def _course_lib(python: str, *args: object) -> tuple[str, ...]:
    return (python, "-m", "course_lib", *(str(a) for a in args))


def plan(gpus: int, out: Path = DEFAULT_OUT, python: str = sys.executable) -> list[Stage]:
    """The stages for a host with ``gpus`` visible GPUs (>= 1); runs nothing."""
    if gpus < 1:
        raise ValueError("plan: needs at least one GPU")
    out = Path(out)
    world = min(gpus, 2)
    stages: list[Stage] = []

    def job_timeout(t: float) -> float:
        return t - JOB_MARGIN_S

    t = 60.0
    stages.append(Stage(
        "check_env", f"check-env --launch, nccl, {world} rank(s)",
        _course_lib(python, "check-env", "--launch", "--backend", "nccl",
                    "--world-size", world, "--timeout", job_timeout(t),
                    "--out", out / "check_env"),
        t, read_check_env, out / "check_env", "nccl", "cuda", world))

    t = 30.0
    stages.append(Stage(
        "reference", "single-process reference on cuda",
        _course_lib(python, "reference", "--device", "cuda", "--out", out / "reference"),
        t, read_reference, out / "reference", None, "cuda", None))

    t = 75.0
    if gpus == 1:
        stages.append(Stage(
            "parity_nccl_w1", "parity, nccl, 1 rank (one per GPU)",
            _course_lib(python, "parity", "--backend", "nccl", "--world-size", 1,
                        "--timeout", job_timeout(t), "--out", out / "parity_nccl_w1"),
            t, read_parity, out / "parity_nccl_w1", "nccl", "cuda", 1,
            note="with one rank the two modes coincide: mean_of_means is no control"))
    stages.append(Stage(
        "parity_nccl_w2", "parity, nccl, 2 ranks (one per GPU)",
        None if gpus < 2 else _course_lib(
            python, "parity", "--backend", "nccl", "--world-size", 2,
            "--timeout", job_timeout(t), "--out", out / "parity_nccl_w2"),
        t, read_parity, out / "parity_nccl_w2", "nccl", "cuda", 2,
        skip=NCCL_ONE_GPU if gpus < 2 else None))

    stages.append(Stage(
        "parity_gloo_cuda_w2", "parity, gloo on cuda, 2 ranks",
        _course_lib(python, "parity", "--backend", "gloo", "--device", "cuda",
                    "--world-size", 2, "--timeout", job_timeout(t),
                    "--out", out / "parity_gloo_cuda_w2"),
        t, read_parity, out / "parity_gloo_cuda_w2", "gloo", "cuda", 2,
        note="2 ranks share GPU 0" if gpus == 1 else None))

    t = 120.0
    stages.append(Stage(
        "audit_global_token_f64", "audit global_token, float64, gloo on cuda, 2 ranks",
        _course_lib(python, "audit", "--step", "global_token", "--dtype", "float64",
                    "--backend", "gloo", "--device", "cuda", "--world-size", 2,
                    "--timeout", job_timeout(t), "--out", out / "audit_global_token_f64"),
        t, read_audit, out / "audit_global_token_f64", "gloo", "cuda", 2,
        note="gloo on cuda: world_size_invariance also launches W = 1 and 4, "
             "which NCCL (one rank per GPU) cannot do on this host"))

    t = 150.0
    ch04 = out / "ch04"
    stages.append(Stage(
        "chapter04_papermill", f"chapter 04 through papermill, nccl, {world} rank(s)",
        (python, "-m", "papermill", str(CHAPTER), str(ch04 / CHAPTER.name),
         "-p", "backend", "nccl", "-p", "world_size", str(world),
         "-p", "run_name", _run_name(ch04), "--cwd", "notebooks", "-k", "python3",
         "--no-progress-bar", "--execution-timeout", str(int(t))),
        t, read_chapter, ch04, "nccl", "cuda", world,
        note="the chapter has no device parameter: backend nccl puts its ranks on CUDA; "
             "its 12 -> 36 exercise always runs 2 ranks, on NCCL only when world_size is 2"))
    return stages


def _run_name(out: Path) -> str:
    """The chapter writes to runs/<run_name>; an absolute name works as well."""
    try:
        return str(Path(out).resolve().relative_to(ROOT / "runs"))
    except ValueError:
        return str(Path(out).resolve())


# --------------------------------------------------------------------------- #
# Readers: (figures, problem) from a run that exited 0.

def _json_in(text: str) -> dict:
    """The first JSON object printed at the start of a line."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if start == 0 and not text.startswith("{"):
        raise ValueError("no JSON object in its output")
    return json.JSONDecoder().raw_decode(text[start:])[0]


def _load(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"no report at {path}")
    return json.loads(path.read_text())


def _placement_problem(stage: Stage, backend: str | None, device: str | None) -> str | None:
    if stage.backend and backend != stage.backend:
        return f"ran on backend {backend}, expected {stage.backend}"
    if stage.device and device != stage.device:
        return f"ran on device {device}, expected {stage.device}"
    return None


def read_check_env(stage: Stage, run: Outcome) -> Verdict:
    info = _json_in(run.stdout)
    keys = ("torch", "gpus", "nccl_available", "world_size", "backend", "device",
            "nccl_reference_path", "all_reduce")
    figures = {k: info.get(k) for k in keys}
    problem = _placement_problem(stage, info.get("backend"), info.get("device"))
    if problem is None and info.get("all_reduce") != "ok":
        problem = f"all_reduce: {info.get('all_reduce')!r}"
    return Verdict(figures, problem)


def read_reference(stage: Stage, run: Outcome) -> Verdict:
    rep = _load(stage.out / "reports" / "reference.json")
    figures = {k: rep.get(k) for k in ("device", "dtype", "global_tokens",
                                       "compared_values", "grad_norm")}
    problem = None if rep.get("device") == "cuda" else f"ran on {rep.get('device')}"
    return Verdict(figures, problem)


def read_parity(stage: Stage, run: Outcome) -> Verdict:
    rep = _load(stage.out / "reports" / "parity.json")
    modes = rep.get("modes", {})
    figures = {k: rep.get(k) for k in ("world_size", "backend", "device", "dtype",
                                       "nccl_reference_path", "passed", "control")}
    for mode in ("global_token", "mean_of_means"):
        m = modes.get(mode, {})
        for k in ("max_abs_err", "allclose", "violations"):
            figures[f"{mode}.{k}"] = m.get(k)
    problem = _placement_problem(stage, rep.get("backend"), rep.get("device"))
    if problem is None and rep.get("world_size") != stage.world_size:
        problem = f"ran {rep.get('world_size')} ranks, expected {stage.world_size}"
    if problem is None and not rep.get("passed"):
        problem = "parity report: passed is false"
    return Verdict(figures, problem)


def read_audit(stage: Stage, run: Outcome) -> Verdict:
    rep = _load(stage.out / "reports" / "audit-global_token.json")
    figures = {k: rep.get(k) for k in ("world_size", "backend", "device", "dtype",
                                       "passed")}
    checks = rep.get("checks", {})
    for name, c in checks.items():
        figures[f"{name}.passed"] = c.get("passed")
        if c.get("max_abs_err") is not None:
            figures[f"{name}.max_abs_err"] = c.get("max_abs_err")
    problem = _placement_problem(stage, rep.get("backend"), rep.get("device"))
    if problem is None and rep.get("dtype") != "float64":
        problem = f"dtype {rep.get('dtype')}, expected float64"
    if problem is None and not rep.get("passed"):
        failed = [n for n, c in checks.items() if not c.get("passed")]
        problem = "audit failed: " + (", ".join(failed) or "passed is false")
    return Verdict(figures, problem)


def read_chapter(stage: Stage, run: Outcome) -> Verdict:
    executed = stage.out / CHAPTER.name
    if not executed.is_file():
        return Verdict({}, f"no executed notebook at {executed}")
    verdict = read_parity(stage, run)
    return Verdict({**verdict.figures, "notebook": str(executed)}, verdict.problem)


# --------------------------------------------------------------------------- #
# Execution.

@dataclass
class StageResult:
    name: str
    title: str
    status: str
    reason: str
    seconds: float
    figures: dict
    command: list[str] | None
    timeout_s: float
    returncode: int | None = None
    out: str | None = None
    log: str | None = None
    note: str | None = None


@dataclass
class Report:
    passed: bool
    gpus: int
    host: dict
    budget_s: float
    seconds: float
    counts: dict
    stages: list[StageResult]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= 240 else line[:237] + "..."


def kill_tree(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """Stop ``proc`` (a session leader) with its whole process group, and any
    descendant that left the group (torchrun puts its workers, jupyter its
    kernel, in sessions of their own)."""
    try:
        import psutil
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # psutil missing, or the leader already gone
        descendants = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    for p in descendants:
        try:
            p.kill()
        except Exception:  # gone already
            pass
    for p in descendants:
        try:
            p.wait(timeout=grace)
        except Exception:  # gone, or not our child to reap
            pass


def execute(stage: Stage, logs: Path) -> StageResult:
    """Run one stage to completion or its timeout; never raises for the stage."""
    result = StageResult(stage.name, stage.title, NOT_RUN, stage.skip or "", 0.0, {},
                         list(stage.argv) if stage.argv else None, stage.timeout,
                         out=str(stage.out), note=stage.note)
    if stage.argv is None:
        result.reason = stage.skip or "not planned on this host"
        return result
    if stage.out.exists():
        shutil.rmtree(stage.out)  # a stale report must never pass for this run's
    stage.out.mkdir(parents=True)
    logs.mkdir(parents=True, exist_ok=True)
    out_log, err_log = logs / f"{stage.name}.out", logs / f"{stage.name}.err"
    result.log = str(err_log)
    started = time.monotonic()
    with open(out_log, "w+") as out_f, open(err_log, "w+") as err_f:
        try:
            proc = subprocess.Popen(stage.argv, cwd=ROOT, stdout=out_f, stderr=err_f,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **stage.env})
        except OSError as exc:
            result.status, result.reason = FAILED, f"could not start: {exc}"
            return result
        try:
            proc.wait(timeout=stage.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            timed_out = True
        except BaseException:  # Ctrl-C: leave nothing behind
            kill_tree(proc)
            raise
        result.seconds = round(time.monotonic() - started, 2)
        result.returncode = proc.returncode
        out_f.seek(0)
        err_f.seek(0)
        run = Outcome(proc.returncode, out_f.read(), err_f.read())
    if timed_out:
        result.status = FAILED
        result.reason = (f"timed out after {stage.timeout:g} s; its process group was "
                         f"killed (last output: {_last_line(run.stderr or run.stdout)})")
        return result
    if run.returncode != 0:
        result.status = FAILED
        result.reason = f"exit {run.returncode}: {_last_line(run.stderr or run.stdout)}"
        try:  # what it managed to report still helps
            result.figures = stage.read(stage, run).figures
        except Exception:
            pass
        return result
    try:
        verdict = stage.read(stage, run)
    except Exception as exc:
        result.status, result.reason = FAILED, f"exit 0, but its result: {exc}"
        return result
    result.figures = verdict.figures
    if verdict.problem:
        result.status, result.reason = FAILED, verdict.problem
    else:
        result.status = PASSED
        result.reason = "ok" + (f"; {verdict.remark}" if verdict.remark else "")
    return result


# --------------------------------------------------------------------------- #
# The host.

def gpu_count() -> int:
    """Visible CUDA devices, without initialising CUDA (NVML-based check)."""
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not torch.cuda.is_available():
            return 0
        return torch.cuda.device_count()


def no_gpu_message() -> str:
    try:
        import torch
        version = str(torch.__version__)
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "cpu build"
    except Exception as exc:  # torch itself is broken
        version, build = "unavailable", f"{type(exc).__name__}"
    return (f"gpu-check: no CUDA device visible (torch {version}, {build}); "
            "run it on a GPU host")


def host_info() -> dict[str, Any]:
    import platform

    import torch
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = [ln.strip() for ln in smi.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


# --------------------------------------------------------------------------- #
# Report.

def _figure_text(r: StageResult) -> str:
    f = r.figures
    if "global_token.max_abs_err" in f:
        return (f"{f.get('world_size')} rank(s) {f.get('backend')}/{f.get('device')}  "
                f"global_token err {f['global_token.max_abs_err']:.3g} "
                f"allclose={f.get('global_token.allclose')}  mean_of_means err "
                f"{f.get('mean_of_means.max_abs_err') or 0:.3g} "
                f"allclose={f.get('mean_of_means.allclose')}")
    if "all_reduce" in f:
        return f"{f.get('backend')}/{f.get('device')} all_reduce={f.get('all_reduce')}"
    if "parity.passed" in f:
        errs = [v for k, v in f.items() if k.endswith(".max_abs_err")]
        worst = max(errs) if errs else float("nan")
        return (f"{f.get('backend')}/{f.get('device')} {f.get('dtype')} "
                f"worst err {worst:.3g} passed={f.get('passed')}")
    if "grad_norm" in f:
        return f"device={f.get('device')} grad_norm {f.get('grad_norm'):.6g}"
    return ""


def summary(report: Report, out: Path) -> str:
    smi = report.host.get("nvidia_smi")
    names = ", ".join(smi) if isinstance(smi, list) and smi else "?"
    lines = [f"gpu-check: {report.gpus} GPU(s) [{names}], torch {report.host.get('torch')}"]
    for r in report.stages:
        lines.append(f"  {r.status:<7}  {r.name:<24} {r.seconds:6.1f} s  {r.reason}")
        text = _figure_text(r)
        if text:
            lines.append(f"{'':36}{text}")
    c = report.counts
    lines.append(f"result: {'PASS' if report.passed else 'FAIL'} ({c[PASSED]} passed, "
                 f"{c[FAILED]} failed, {c[NOT_RUN]} not run) in {report.seconds:.0f} s "
                 f"-> {out / 'report.json'}")
    return "\n".join(lines)


def build_report(gpus: int, host: dict, results: list[StageResult],
                 seconds: float) -> Report:
    counts = {s: sum(r.status == s for r in results) for s in (PASSED, FAILED, NOT_RUN)}
    return Report(passed=counts[FAILED] == 0, gpus=gpus, host=host,
                  budget_s=BUDGET_S, seconds=round(seconds, 1), counts=counts,
                  stages=results)


def _describe_plan(stages: list[Stage]) -> list[dict]:
    return [{"name": s.name, "title": s.title, "argv": list(s.argv) if s.argv else None,
             "timeout_s": s.timeout, "backend": s.backend, "device": s.device,
             "world_size": s.world_size, "skip": s.skip, "out": str(s.out)}
            for s in stages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="default: runs/gpu")
    parser.add_argument("--plan", type=int, metavar="GPUS", default=None,
                        help="print the plan for GPUS GPUs as JSON and run nothing")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.plan is not None:
        if args.plan < 1:
            parser.error("--plan: at least 1 GPU")
        print(json.dumps(_describe_plan(plan(args.plan, out)), indent=2))
        return 0

    gpus = gpu_count()
    if gpus < 1:
        print(no_gpu_message(), file=sys.stderr)
        return 2
    started = time.monotonic()
    host = host_info()
    stages = plan(gpus, out)
    results = []
    for stage in stages:
        print(f"gpu-check: {stage.name} ...", flush=True)
        results.append(execute(stage, out / "logs"))
    report = build_report(gpus, host, results, time.monotonic() - started)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    text = summary(report, out)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
