"""What the frameworks LOG, against the token mean: the HF Trainer's logged
training loss and eval_loss, accelerate's gather_for_metrics, Lightning's
self.log(sync_dist=True), and each framework's correct recipe.

    .venv/bin/python benchmarks/frameworks_logging.py           # gpt2 and llama
    .venv/bin/python benchmarks/frameworks_logging.py --quick   # llama only, nothing written

One torchrun launch (2 ranks, gloo on CPU) of the ``frameworks_logging``
job (``course_lib/jobs/frameworks_logging.py``) with the installed
frameworks, on the skewed window of the frameworks job. Prints the table and
writes ``data/frameworks-logging.json`` (committed), the ``LoggingData``
report, with the date, the versions and this command. Exit 1 when a recipe
is not the token mean.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one model (llama); data/ is left as it is")
    parser.add_argument("--out", default=None, help="the launch's run directory "
                        "(default: a temporary one)")
    args = parser.parse_args()
    import course_lib
    from course_lib.jobs import frameworks_logging as fl

    cfg = course_lib.load_config(ROOT / "configs" / "minimum.yaml")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="course-fw-logging-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        report = fl.frameworks_logging(cfg, out, fl.QUICK_MODELS if args.quick else fl.MODELS,
                                       world_size=2, backend="gloo", device="cpu")
    print(fl.describe(report))
    data = fl.LoggingData(
        date=datetime.date.today().isoformat(), python=sys.version.split()[0],
        command="python benchmarks/frameworks_logging.py" + (" --quick" if args.quick else ""),
        stack=fl.stack(), run=report)
    if args.quick:  # one model: not the committed table
        print(f"{len(report.recipes)} recipes measured, {fl.LoggingData.path().name} "
              "left as it is (--quick)")
    else:
        print(f"wrote {data.write().relative_to(ROOT)} in {time.monotonic() - started:.0f} s")
    wrong = [f"{r.framework} {r.model} {r.mode}" for r in report.recipes
             if r.verdict != fl.TOKEN_MEAN]
    if wrong:
        print(f"not the token mean: {'; '.join(wrong)}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
