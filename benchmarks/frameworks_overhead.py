"""What the frameworks audit costs: each configuration audited against the
same framework running the same window by itself, in the same launch.

    .venv/bin/python benchmarks/frameworks_overhead.py           # every framework, tiny models
    .venv/bin/python benchmarks/frameworks_overhead.py --scale   # + GPT-2 small (124M), HF
    .venv/bin/python benchmarks/frameworks_overhead.py --quick   # HF on tiny GPT-2 only

For each configuration the job first runs the framework's own loop on the
window alone (built, trained for the window, with the gradient hook), then
the whole audit (the same, plus the gathers, every microbatch's gradient
and the reference on rank 0), each between two barriers. The ratio
audited / alone is the budget (target <= 2). ``--scale`` adds GPT-2 small
from its config, with the peak memory of rank 0 (MiB).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from course_lib.core import paths
from course_lib.course.api import load_config
from course_lib.frameworks.evidence import FrameworkRow
from course_lib.jobs.frameworks import DEFAULT_FRAMEWORKS, audit_frameworks


def show(rows: list[FrameworkRow], title: str) -> list[float]:
    print(title)
    print(f"  {'framework':<11} {'model':<7} {'flags':<38} {'alone':>7} {'audited':>8} "
          f"{'ratio':>6} {'peak MiB':>9}")
    ratios = []
    for r in rows:
        if not r.seconds:
            print(f"  {r.framework:<11} {r.model:<7} not run: {r.reason}")
            continue
        flags = ", ".join(f"{k}={v}" for k, v in r.flags.items()) or "-"
        ratio = r.seconds["audited"] / r.seconds["alone"]
        ratios.append(ratio)
        print(f"  {r.framework:<11} {r.model:<7} {flags:<38} {r.seconds['alone']:>6.2f}s "
              f"{r.seconds['audited']:>7.2f}s {ratio:>6.2f} {r.peak_rss_mb or 0:>9.0f}")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", action="store_true", help="also GPT-2 small (124M)")
    parser.add_argument("--quick", action="store_true",
                        help="the HF Trainer on tiny GPT-2 only: the code path, not the budget")
    args = parser.parse_args()
    if args.quick and args.scale:
        parser.error("--quick and --scale: choose one")
    names, models = (["hf"], ["gpt2"]) if args.quick else (list(DEFAULT_FRAMEWORKS),
                                                           ["gpt2", "llama"])
    cfg = load_config()
    with tempfile.TemporaryDirectory() as tmp:
        report = audit_frameworks(cfg, Path(tmp) / "tiny", names, models, timing=True,
                                  data_dir=paths.data_dir())
        ratios = show(report.rows, "tiny models (2 layers, width 32), the skewed window")
        if not ratios:
            print("no configuration ran: nothing to time", file=sys.stderr)
            return 1
        print(f"  median ratio {statistics.median(ratios):.2f}, "
              f"max {max(ratios):.2f} (target <= 2)")
        if args.scale:
            big = audit_frameworks(cfg, Path(tmp) / "gpt2-small", ["hf"], ["gpt2"],
                                   sizes="gpt2-small", timing=True, timeout=1800,
                                   data_dir=paths.data_dir())
            show(big.rows, "GPT-2 small (124M parameters, from its config), HF Trainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
