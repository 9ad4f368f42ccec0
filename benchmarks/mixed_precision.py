"""Where bfloat16 changes the course's sums and counts, on the parity window.

    python benchmarks/mixed_precision.py [--quick]

For each precision of ``course_lib.core.precision`` (float32; bf16 autocast;
bf16 weights), the course's rule W * S_r / N and the mean of means, each
rank's share computed in one process and averaged as DDP's all-reduce adds
them, against the float64 reference, with the parity check's atol and rtol.
Prints each row, each rank's S_r against its float64 value, the window's
count N summed as int64, bfloat16 and float16, and the figure line: how many
times the mean of means' error exceeds the rule's own rounding error in the
worst precision. Above 1, the bias still stands out of bf16's noise; the
parity check's float32 tolerances no longer pass the rule itself.
``--quick`` measures bf16 autocast alone.
"""

from __future__ import annotations

import argparse
import sys

import course_lib
from course_lib.core import precision


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bf16 autocast only")
    args = parser.parse_args()
    cfg = course_lib.load_config()
    modes = ("autocast_bf16",) if args.quick else precision.MODES
    p = precision.measure(cfg, course_lib.corpus(cfg), modes=modes)
    print(f"{'mode':<14} {'rule max|err|':>14} {'violations':>11} {'passes':>7} "
          f"{'mean of means max|err|':>23}  S_r (float64 S_r)")
    for r in p.rows:
        sums = ", ".join(f"{a:.3f} ({b:.3f})"
                         for a, b in zip(r.loss_sums, r.loss_sums_float64, strict=True))
        print(f"{r.mode:<14} {r.global_token.max_abs_err:>14.3e} "
              f"{r.global_token.violations:>11,} {str(r.global_token.passes):>7} "
              f"{r.mean_of_means.max_abs_err:>23.3e}  {sums}")
    c = p.count
    print(f"N = {c.exact:,} (int64); summed as bfloat16 {c.bfloat16:,.0f}, "
          f"as float16 {c.float16:,.0f}")
    worst = max(p.rows, key=lambda r: r.global_token.max_abs_err)
    ratio = worst.mean_of_means.max_abs_err / worst.global_token.max_abs_err
    print(f"mean of means error / rule error, {worst.mode}: {ratio:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
