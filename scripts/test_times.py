"""Where `make test`'s seconds go: each lane's time and the slowest tests.

`make test` writes each lane's JUnit XML report (runs/test-lane1.xml, the
chapters' lane, and runs/test-lane2.xml, every other test); this reads them:

    python scripts/test_times.py [--top 20] [REPORT.xml ...]     (make test-times)

It prints each lane's wall time, its number of tests and the sum of its
tests' own times, then the slowest tests of both lanes (setup, call and
teardown together, as pytest's JUnit report counts them).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = [ROOT / "runs" / "test-lane1.xml", ROOT / "runs" / "test-lane2.xml"]


def lane(path: Path) -> tuple[float, list[tuple[float, str]]]:
    """A JUnit report's wall time and its tests' (seconds, node id)."""
    suite = ET.parse(path).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    tests = [(float(case.get("time", 0)),
              f"{case.get('classname', '')}::{case.get('name', '')}")
             for case in suite.iter("testcase")]
    return float(suite.get("time", 0)), tests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="each lane's time and the slowest tests")
    parser.add_argument("reports", nargs="*", type=Path, default=LANES)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing:
        print(f"test_times: no report at {', '.join(missing)}: run `make test` first",
              file=sys.stderr)
        return 2
    every = []
    for path in args.reports:
        wall, tests = lane(path)
        every += tests
        print(f"{path.name}: {wall:7.1f} s wall, {len(tests)} tests, "
              f"{sum(t for t, _ in tests):7.1f} s in the tests")
    print(f"the {args.top} slowest tests:")
    for seconds, name in sorted(every, reverse=True)[:args.top]:
        print(f"{seconds:7.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
