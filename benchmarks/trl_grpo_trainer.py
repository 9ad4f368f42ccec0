"""TRL's real GRPOTrainer under torchrun, each loss type against the token mean.

    .venv/bin/python benchmarks/trl_grpo_trainer.py            # every case, writes data/
    .venv/bin/python benchmarks/trl_grpo_trainer.py --others   # and tries verl, OpenRLHF
    .venv/bin/python benchmarks/trl_grpo_trainer.py --quick    # dapo only, nothing written

One torchrun launch (2 ranks, gloo on CPU) of the ``trl_grpo_trainer`` job
(``course_lib/jobs/trl_grpo.py``): for each ``loss_type`` the installed
GRPOTrainer offers, and for the RLOOTrainer, one optimizer step of the real
trainer, generating its own completions, against the gradient of the global
token mean of every rank's completion tokens and of the objective the loss
type claims. Prints the table and writes ``data/trl-grpo-trainer.json``
(committed), the ``TrainerData`` report, with the date, the versions and
this command. ``--others`` tries to pip-install verl and OpenRLHF into a
throwaway venv (the course's own torch linked in, never .venv changed) and
records each as not run with what stopped it; without it, the committed
file's rows for them are kept. Exit 1 when a trainer raised.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported late: the venv probes need none of it
    from course_lib.frameworks.evidence import TrainerRow

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600  # seconds for one pip install

# What runs in the throwaway venv once the package is installed: its version,
# then what stops its trainer on this CPU-only machine ("RUNS" if nothing does).
PROBES = {
    "verl": (
        "import importlib.metadata as m\n"
        "from verl.trainer.ppo.core_algos import agg_loss\n"
        "from verl.utils.device import get_device_id, get_device_name\n"
        "print(m.version('verl'))\n"
        "try:\n"
        "    get_device_id()\n"
        "    print('RUNS')\n"
        "except Exception as exc:\n"
        "    print(f'it imports on the CPU (core_algos.agg_loss loads), but its '\n"
        "          f'platform detection names {get_device_name()!r} here and '\n"
        "          f'get_device_id(), which its FSDP engine calls to all-reduce the '\n"
        "          f'token count (forward_backward_batch), raises '\n"
        "          f'{type(exc).__name__}: {exc}; its trainer drives that engine '\n"
        "          f'through Ray workers: no adapter')\n"),
    "openrlhf": (
        "import importlib.metadata as m\n"
        "import openrlhf\n"
        "print(m.version('openrlhf'))\n"
        "print('it imports on the CPU; its loss runs inside its DeepSpeed/Ray actors: '\n"
        "      'no adapter')\n"),
}
NAMES = {"verl": "verl", "openrlhf": "OpenRLHF"}


def _torch_only(into: Path) -> None:
    """Links to this venv's torch and what it requires (not its extras), for a
    throwaway venv's .pth: pip sees torch installed and downloads no other."""
    from packaging.requirements import Requirement

    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        site = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if top not in ("..", "__pycache__") and not (into / top).exists():
                (into / top).symlink_to(site / top)
        needs = [Requirement(r) for r in dist.requires or ()]
        todo += [r.name for r in needs if r.marker is None or r.marker.evaluate({"extra": ""})]


def pip_failure(package: str, output: str) -> tuple[str | None, str]:
    """(the package's version, what failed): the requirement pip was
    collecting when the error came, the step that failed and its innermost error."""
    text = [s.strip() for s in output.splitlines() if not s.startswith("WARNING")]
    version = next((s.split(f"{package}-")[1].split("-")[0] for s in text
                    if s.startswith(f"Downloading {package}-")), None)
    first = next((i for i, s in enumerate(text) if "error" in s.lower()), len(text))
    collecting = next((s.removeprefix("Collecting ") for s in reversed(text[:first])
                       if s.startswith("Collecting ")), "")
    step = next((s.lstrip("× ").rstrip(".") for s in text if s.startswith("×")), "")
    cause = next((s for s in reversed(text) if "Error:" in s), "")
    found = [f"collecting {collecting}" if collecting else "", step, cause]
    return version, ": ".join(f for f in found if f) or (text or ["no output"])[-1]


def try_install(package: str, today: str) -> tuple[str | None, str]:
    """(version, why it is not run): pip install in a throwaway venv, then its probe."""
    with tempfile.TemporaryDirectory(prefix=f"course-try-{package}-") as tmp:
        venv, links = Path(tmp) / "venv", Path(tmp) / "torch"
        links.mkdir()
        _torch_only(links)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = next((venv / "lib").glob("python*/site-packages"))
        (site / "course-torch.pth").write_text(f"{links}\n")
        started = time.monotonic()
        try:
            pip = subprocess.run([str(python), "-m", "pip", "install", package],
                                 capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        except subprocess.TimeoutExpired:
            return None, f"pip install {package} did not finish in {INSTALL_TIMEOUT} s " \
                         f"(tried {today})"
        took = time.monotonic() - started
        if pip.returncode != 0:
            version, why = pip_failure(package, pip.stdout + pip.stderr)
            return version, f"pip install {package} failed after {took:.0f} s: {why} " \
                            f"(tried {today})"
        probe = subprocess.run([str(python), "-c", PROBES[package]], capture_output=True,
                               text=True, timeout=INSTALL_TIMEOUT)
        lines = probe.stdout.strip().splitlines()
        if probe.returncode != 0 or len(lines) < 2:
            error = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            return (lines[0] if lines else None), (
                f"pip install {package} worked ({took:.0f} s), its import failed: {error} "
                f"(tried {today})")
        return lines[0], (f"{package} {lines[0]} installs in {took:.0f} s; {lines[1]} "
                          f"(tried {today})")


def others(today: str, probe: bool) -> list[TrainerRow]:
    """verl and OpenRLHF, not run: tried now (``probe``), else as committed."""
    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.evidence import TrainerRow
    from course_lib.jobs.trl_grpo import TrainerData

    if not probe:
        try:
            return TrainerData.committed().others
        except FileNotFoundError:
            return []
    rows = []
    for package, name in NAMES.items():
        version, why = try_install(package, today)
        print(f"{name}: {why}")
        rows.append(TrainerRow(framework=name, version=version, model="-", flags={},
                               verdict=Verdict.NOT_RUN, reason=why, trainer=package))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="TRL's default loss type only; data/ is left as it is")
    parser.add_argument("--others", action="store_true",
                        help="also try to pip-install verl and OpenRLHF (minutes)")
    parser.add_argument("--out", default=None, help="the launch's run directory "
                        "(default: a temporary one)")
    args = parser.parse_args()
    import course_lib
    from course_lib.frameworks import trl_grpo_trainer as grpo
    from course_lib.jobs import trl_grpo
    from course_lib.jobs.frameworks import stack

    cfg = course_lib.load_config(ROOT / "configs" / "minimum.yaml")
    cases = [grpo.default_case()] if args.quick else grpo.cases()
    today = datetime.date.today().isoformat()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="course-trl-grpo-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        report = trl_grpo.trl_grpo_trainer(cfg, out, cases, world_size=2, backend="gloo",
                                           device="cpu")
    took = time.monotonic() - started
    data = trl_grpo.TrainerData(
        date=today, python=sys.version.split()[0],
        command="python benchmarks/trl_grpo_trainer.py" + (" --others" if args.others else ""),
        stack=stack(), run=report, others=[] if args.quick else others(today, args.others))
    print(f"TRL {data.stack.get('trl')} GRPOTrainer, {report.world_size} ranks, "
          f"{report.backend} on {report.device}: the gradient after DDP vs the token mean "
          "of every rank's completion tokens, and vs the loss type's claim")
    print(trl_grpo.describe(data.rows))
    if args.quick:
        print(f"{len(report.rows)} case(s) in {took:.0f} s, "
              f"{trl_grpo.TrainerData.path().name} left as it is (--quick)")
    else:
        print(f"wrote {data.write().relative_to(ROOT)}; the launch took {took:.0f} s")
    failed = [r.loss_type or r.trainer for r in report.rows if r.verdict == "failed"]
    if failed:
        print(f"raised while training: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
