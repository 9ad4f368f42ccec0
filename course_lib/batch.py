"""Batch-run every chapter with papermill (``make course``), then summarise.

Executed copies go to ``runs/notebooks/``; the sources are never written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import paths, protocol

RUN_NAME = "course"  # the chapters' shared run directory: runs/course


def chapters(root: Path | None = None) -> list[Path]:
    root = root or paths.project_root()
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def run_chapters(selected: list[Path], out_dir: Path,
                 parameters: dict | None = None) -> list[tuple[str, float]]:
    import papermill

    os.environ.setdefault("COURSE_PROGRESS", "text")
    out_dir.mkdir(parents=True, exist_ok=True)
    timings = []
    for nb in selected:
        started = time.perf_counter()
        print(f"running {nb.name} ...", flush=True)
        papermill.execute_notebook(
            str(nb), str(out_dir / nb.name), parameters=parameters or {},
            cwd=str(nb.parent), kernel_name="python3", progress_bar=False,
        )
        timings.append((nb.name, time.perf_counter() - started))
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.batch")
    parser.add_argument("--only", nargs="*", default=None,
                        help="chapter prefixes to run, e.g. 05 06")
    parser.add_argument("--out", default=None, help="default: runs/notebooks")
    args = parser.parse_args(argv)
    root = paths.project_root()
    selected = [nb for nb in chapters(root)
                if not args.only or nb.name[:2] in args.only]
    if not selected:
        print("no chapter matched", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else root / "runs" / "notebooks"
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
