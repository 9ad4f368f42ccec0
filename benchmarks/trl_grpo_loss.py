"""TRL GRPO's real loss against the recipes' re-implementation, per loss type.

    .venv/bin/python benchmarks/trl_grpo_loss.py
    .venv/bin/python benchmarks/trl_grpo_loss.py --quick  # this venv's trl, one case

For each TRL version of the version matrix (the venvs of
``benchmarks/frameworks_matrix.py``, ``runs/matrix/trl-*/venv``), one
process in that venv calls the installed ``GRPOTrainer._compute_loss`` on
hand-built inputs: a microbatch of the course's parity window (completion
mask = the supervised labels, synthetic advantages from
``rl_recipes.advantages``, one per completion), and per-token log-probs
from the course's model in float64, handed to the trainer in place of its
own forward (``_get_per_token_logps_and_entropies`` in 1.x,
``_get_per_token_logps`` in 0.19). The trainer object is built without
``__init__`` (no model download, no generation), with the attributes the
loss reads; no generation, old log-probs = the current ones (ratio 1), beta
0, no clipping in effect. Each loss type is then compared with
``rl_recipes.trl_grpo_loss``:

- the loss value, on TRL's own per-token terms (-A x ratio), by
  torch.allclose;
- the gradient on every parameter of the model, against the gradient of
  the recipe's scalar (the A-weighted cross-entropy under the same
  normalizer), by torch.allclose.

TRL 0.19.1 divides by GA outside ``_compute_loss`` (the Trainer's
``training_step``: ``model_accepts_loss_kwargs`` is False there, and
accelerate gets num_steps 1); that division is applied here after the call
and named in the row. A venv that is missing, or a loss type a version does
not have, is ``not run`` with its reason. Writes ``data/trl-grpo-loss.json``
(committed), the ``LossRuns`` report of ``course_lib/frameworks/evidence.py``. Not
part of ``make test``: it needs the matrix's venvs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported late at run time: --worker needs none of it
    from course_lib.frameworks.evidence import LossRun

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / "runs" / "matrix"
ENTRIES = ("trl-1.16.0", "trl-0.19.1")
GA = 2  # microbatches per optimizer step in the cases below
# key suffix -> (loss_type, GA, steps_per_generation): what Recipe.loss_runs names
CASES = {
    "dapo/spg=ga": ("dapo", GA, GA),
    "dapo/spg=2ga": ("dapo", 1, 2),
    "bnpo": ("bnpo", GA, GA),
    "grpo": ("grpo", GA, GA),
    "dr_grpo": ("dr_grpo", GA, GA),
}


def worker(cases: list[str]) -> list[Any]:
    """In an entry's venv: these cases against the installed trl, as JSON."""
    from course_lib.core.typed import encode
    from course_lib.frameworks import trl_grpo

    return [encode(r) for r in trl_grpo.compare_all({k: CASES[k] for k in cases})]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", action="append", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="this venv's trl on the first case only; nothing written")
    args = parser.parse_args()
    cases = args.case or list(CASES)
    if args.worker:
        print(json.dumps(worker(cases)))
        return 0
    import torch

    from course_lib.core.typed import decode
    from course_lib.frameworks.evidence import LossRun, LossRuns
    from course_lib.frameworks.trl_grpo import WORLD

    venvs = {entry: VENVS / entry / "venv" / "bin" / "python" for entry in ENTRIES}
    if args.quick:
        venvs, cases = {"installed": Path(sys.executable)}, cases[:1]
    runs: list[LossRun] = []
    for entry, python in venvs.items():
        if not python.exists():
            why = f"no venv at {python.relative_to(ROOT)} (run benchmarks/frameworks_matrix.py)"
            runs += [_not_run(LossRun, entry, k, CASES[k], why, WORLD) for k in cases]
            continue
        proc = subprocess.run([str(python), __file__, "--worker",
                               *(f"--case={k}" for k in cases)],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            runs += [_not_run(LossRun, entry, k, CASES[k], why, WORLD) for k in cases]
            continue
        runs += [decode(LossRun, row)
                 for row in json.loads(proc.stdout.strip().splitlines()[-1])]
    report = LossRuns(date=datetime.date.today().isoformat(), torch=torch.__version__,
                      command="python benchmarks/trl_grpo_loss.py", dtype="float64",
                      runs=runs)
    if args.quick:
        print(f"{len(runs)} run(s), not written (--quick)")
    else:
        print(f"wrote {report.write()}")
    for r in runs:
        if r.status == "run":
            print(f"{r.key:<26} loss {r.loss_trl:+.6e} vs {r.loss_mine:+.6e} "
                  f"allclose {r.loss_allclose}; grad max|d| {r.grad_max_abs_diff:.1e} "
                  f"allclose {r.grad_allclose}")
        else:
            print(f"{r.key:<26} not run: {r.reason}")
    return 0 if all(r.agrees for r in runs if r.status == "run") else 1


def _not_run(cls: type[LossRun], entry: str, suffix: str, case: tuple[str, int, int],
             why: str, world: int) -> LossRun:
    loss_type, ga, spg = case
    return cls(key=f"{entry}/{suffix}", entry=entry, loss_type=loss_type, accumulation=ga,
               steps_per_generation=spg, world_size=world, status="not run", reason=why)


if __name__ == "__main__":
    sys.exit(main())
