"""Where `make course`'s seconds go: start-up, launches, windows, other.

Runs every chapter with papermill from a clean run directory (so no chapter
reuses an earlier run's reports), then splits the wall time:

  start-up  kernel launch and the chapter's import cell (papermill's timings)
  launches  torchrun's own cost: agent, worker start-up, teardown
  windows   the work inside the workers: windows, checks, checkpoints
  other     everything else: the parent's reference and evaluation, plots

    python benchmarks/course_time.py [--only 05 07] [--baseline SECONDS] [--cell-times]

``--baseline`` prints the total as a ratio of an earlier total.
``--cell-times`` also writes ``data/cell-times.json``: the seconds of each
cell that launches a job, which the chapters print before they run it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from support import timing  # benchmarks/support/, beside this script

from course_lib.core import paths
from course_lib.course import run_chapters as batch
from course_lib.course import timings as cell_times


def _seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def startup_seconds(executed: Path) -> float:
    """Kernel launch plus the import cell (the first code cell after the
    parameters)."""
    nb = json.loads(executed.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = code[0]["metadata"]["papermill"]
    kernel = _seconds(nb["metadata"]["papermill"]["start_time"], first["start_time"])
    imports = next((c for c in code if "import" in "".join(c["source"])), None)
    cell = imports["metadata"]["papermill"]["duration"] if imports else None
    return kernel + (cell or 0.0)


def write_cell_times(executed: list[Path]) -> None:
    import os

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    found = cell_times.CellTimes(
        date=datetime.now().date().isoformat(), cores=os.cpu_count() or 1, device=device,
        command="python benchmarks/course_time.py --cell-times",
        seconds=cell_times.measure(executed))
    print(f"wrote {found.write().name}: {len(found.seconds)} cells")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="chapter prefixes")
    parser.add_argument("--baseline", type=float, default=None,
                        help="an earlier total, in seconds, to print the ratio to")
    parser.add_argument("--cell-times", action="store_true",
                        help="write data/cell-times.json (every chapter must run)")
    args = parser.parse_args()
    if args.cell_times and args.only:
        parser.error("--cell-times times every chapter: drop --only")
    run_dir = paths.default_out(batch.RUN_NAME)
    shutil.rmtree(run_dir, ignore_errors=True)
    selected = [nb for nb in batch.chapters()
                if not args.only or nb.name[:2] in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        timings = batch.run_chapters(selected, Path(tmp))
        startup = sum(startup_seconds(Path(tmp) / name) for name, _ in timings)
        if args.cell_times:
            write_cell_times([Path(tmp) / name for name, _ in timings])
    phases = timing.launch_phases(run_dir)
    total = sum(s for _, s in timings)
    launch_cost = sum(p.agent + p.startup + p.teardown for p in phases)
    windows = sum(p.work for p in phases)
    print()
    for name, seconds in timings:
        print(f"{name:<32} {seconds:6.1f} s")
    print(f"\n{len(phases)} launches:")
    for p in phases:
        print(f"  W={p.world_size} {'+'.join(p.jobs):<44} {p.total:5.1f} s = agent "
              f"{p.agent:.1f} + start-up {p.startup:.1f} + work {p.work:.1f} "
              f"+ teardown {p.teardown:.1f}")
    print("\nbreakdown:")
    for label, seconds in [("start-up (kernels, imports)", startup),
                           ("launches (torchrun overhead)", launch_cost),
                           ("windows (work in the workers)", windows),
                           ("other", total - startup - launch_cost - windows)]:
        print(f"  {label:<32} {seconds:6.1f} s  {seconds / total:5.1%}")
    print(f"  {'total':<32} {total:6.1f} s")
    if args.baseline:
        print(f"total / baseline: {total / args.baseline:.2f} "
              f"(baseline {args.baseline:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
