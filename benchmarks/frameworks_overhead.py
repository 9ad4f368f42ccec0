"""What the frameworks audit costs: each configuration audited against the
same framework running the same window by itself, in the same launch.

    .venv/bin/python benchmarks/frameworks_overhead.py           # every framework, tiny models
    .venv/bin/python benchmarks/frameworks_overhead.py --scale   # + GPT-2 small and medium, HF
    .venv/bin/python benchmarks/frameworks_overhead.py --quick   # HF on tiny GPT-2 only

For each configuration the job first runs the framework's own loop on the
window alone (built, trained for the window, with the gradient hook), then
the whole audit (the same, plus every rank's microbatch gradients from the
initial weights, and the comparison), each between two barriers. The ratio
audited / alone is the budget (target <= 2), warm: a framework's first,
untimed window pays its imports. ``--scale`` adds GPT-2 small (124M) and
medium (355M) from their configs, on the HF Trainer: small compared through
the sketch (the default above ``sketch.WHOLE_UP_TO`` components) and whole
(``--exact-compare``), medium through the sketch; with the largest rank's
peak resident memory (MiB).
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

# --scale: (size preset, how the gradients are compared, title).
SCALE = (
    ("gpt2-small", "auto", "GPT-2 small (124M parameters, from its config), HF Trainer"),
    ("gpt2-small", "exact", "GPT-2 small, compared whole (--exact-compare)"),
    ("gpt2-medium", "auto", "GPT-2 medium (355M parameters, from its config), HF Trainer"),
)


def show(rows: list[FrameworkRow], title: str) -> list[float]:
    print(title)
    print(f"  {'framework':<11} {'model':<7} {'flags':<38} {'compared':>12} {'alone':>7} "
          f"{'audited':>8} {'ratio':>6} {'peak MiB':>9}")
    ratios = []
    for r in rows:
        if not r.seconds:
            print(f"  {r.framework:<11} {r.model:<7} not run: {r.reason}")
            continue
        flags = ", ".join(f"{k}={v}" for k, v in r.flags.items()) or "-"
        ratio = r.seconds["audited"] / r.seconds["alone"]
        ratios.append(ratio)
        compared = f"sketch {r.sketch}" if r.sketch else "whole"
        print(f"  {r.framework:<11} {r.model:<7} {flags:<38} {compared:>12} "
              f"{r.seconds['alone']:>6.2f}s {r.seconds['audited']:>7.2f}s {ratio:>6.2f} "
              f"{r.peak_rss_mb or 0:>9.0f}")
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
        for sizes, compare, title in SCALE if args.scale else ():
            big = audit_frameworks(cfg, Path(tmp) / f"{sizes}-{compare}", ["hf"], ["gpt2"],
                                   sizes=sizes, timing=True, timeout=1800, compare=compare,
                                   data_dir=paths.data_dir())
            found = show(big.rows, title)
            if found:
                print(f"  max ratio {max(found):.2f} (target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
