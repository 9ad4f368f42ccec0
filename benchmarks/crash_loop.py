"""Run the crashed-rank test N times in a row (default 20) and count passes.

The test once died of a JSONDecodeError when rank 0's progress line and
another rank's traceback interleaved on the shared pipe; a flaky test is a
defect, so this proves the fix under repetition. Each run is a fresh pytest
process (one torchrun launch, ~5 s).

    python benchmarks/crash_loop.py [--runs 20] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_torchrun.py::test_crashed_rank_is_named_with_its_step"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="one run")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    passed, started = 0, time.monotonic()
    for i in range(1, args.runs + 1):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:nbval", "-o", "addopts=",
             "-q", "-x", TEST], cwd=ROOT, capture_output=True, text=True)
        ok = proc.returncode == 0
        passed += ok
        print(f"run {i:>2}: {'pass' if ok else 'FAIL'}", flush=True)
        if not ok:
            print(proc.stdout[-3000:], flush=True)
    print(f"{passed}/{args.runs} passed in {time.monotonic() - started:.0f} s")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
