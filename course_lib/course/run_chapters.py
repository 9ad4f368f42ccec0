"""Batch-run every chapter with papermill (``make course``), then summarise.

Executed copies go to ``runs/notebooks/``; the sources are never written.
The chapters share one kernel, reset between chapters, so torch and
matplotlib are imported once per course instead of once per chapter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from course_lib.core import edition, paths
from course_lib.course import api as protocol
from course_lib.course import translation

RUN_NAME = "course"  # the chapters' shared run directory: runs/course


def chapters(root: Path | None = None, of: str = edition.DEFAULT) -> list[Path]:
    """The chapters of an edition: English in notebooks/, the others in
    notebooks/<edition>/ (course_lib.course.translation builds them)."""
    return sorted(translation.chapters_dir(of, root).glob("[0-9][0-9]_*.ipynb"))


# Between chapters: what a fresh kernel would not have. Imported modules stay
# (that is the point: torch and matplotlib load once per course, not per
# chapter); variables, figures and the RNGs' states do not.
RESET = """%reset -f
import matplotlib.pyplot as _plt
_plt.close("all")
import random as _random, numpy as _np, torch as _torch
_random.seed(); _np.random.seed(); _torch.seed()
del _plt, _random, _np, _torch
"""


def _reset(km) -> None:
    # A client of its own: papermill's clients leave a shared one deaf.
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(RESET, timeout=120, output_hook=lambda msg: None)
    finally:
        kc.stop_channels()
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"could not reset the kernel: {reply['content']}")


def run_chapters(selected: list[Path], out_dir: Path,
                 parameters: dict | None = None) -> list[tuple[str, float]]:
    """Execute the chapters in order, in one kernel, reset in between."""
    import papermill
    from jupyter_client.manager import KernelManager

    os.environ.setdefault("COURSE_PROGRESS", "text")
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: list[tuple[str, float]] = []
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(selected[0].parent))
    try:
        for nb in selected:
            started = time.perf_counter()
            print(f"running {nb.name} ...", flush=True)
            if timings:
                _reset(km)
            papermill.execute_notebook(
                str(nb), str(out_dir / nb.name), parameters=parameters or {},
                cwd=str(nb.parent), kernel_name="python3", progress_bar=False, km=km,
            )
            timings.append((nb.name, time.perf_counter() - started))
    finally:
        km.shutdown_kernel(now=True)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.course.run_chapters")
    parser.add_argument("--only", nargs="*", default=None,
                        help="chapter prefixes to run, e.g. 05 06")
    parser.add_argument("--out", default=None, help="default: runs/notebooks")
    parser.add_argument("--edition", default=edition.DEFAULT, choices=edition.EDITIONS,
                        help="fr: the French edition, notebooks/fr/")
    args = parser.parse_args(argv)
    root = paths.project_root()
    os.environ[edition.ENV] = args.edition  # the summary below speaks it too
    selected = [nb for nb in chapters(root, args.edition)
                if not args.only or nb.name[:2] in args.only]
    if not selected:
        print("no chapter matched", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else (
        root / "runs" / "notebooks" / ("" if args.edition == edition.DEFAULT else args.edition))
    timings = run_chapters(selected, out_dir)
    shown = out_dir.relative_to(root) if out_dir.is_relative_to(root) else out_dir
    print(f"\nExecuted {len(timings)} chapter(s) into {shown}/")
    for name, seconds in timings:
        print(f"  {name:<32} {seconds:6.1f} s")
    print(f"  {'total':<32} {sum(s for _, s in timings):6.1f} s\n")
    print(protocol.summary(paths.default_out(RUN_NAME), tuple(protocol.SECTIONS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
