"""How long a chapter's job takes: printed before the cell runs it.

Every chapter cell that launches a job starts with ``expect("<chapter>",
"<label>")``, which prints the time that cell took in the last measured
run of the whole course (``data/cell-times.json``, written by
``benchmarks/course_time.py --cell-times`` from papermill's per-cell
durations). The figure is the committed one, so a chapter prints the same
line on every machine; it says which machine measured it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from course_lib.core.edition import tr
from course_lib.reports.store import Committed

# expect("05_bug_lab", "bugs") in a cell's source: (chapter, label).
CALL = re.compile(r'expect\("([0-9]{2}_[a-z0-9_]+)", "([a-z0-9_ -]+)"\)')


@dataclass(frozen=True)
class CellTimes(Committed):
    """Seconds per launching cell, keyed ``<chapter>/<label>``."""

    NAME: ClassVar[str] = "cell-times"
    date: str
    cores: int  # the measuring machine's CPU cores
    device: str  # "cpu" or the GPU's name
    command: str
    seconds: dict[str, float]
    extra: dict = field(default_factory=dict, repr=False)


def about(seconds: float) -> str:
    """'about 4 s', 'about 25 s', 'about 2 min': what a learner plans around."""
    if seconds < 10:
        return tr("about {n} s").format(n=max(1, round(seconds)))
    if seconds < 120:
        return tr("about {n} s").format(n=5 * round(seconds / 5))
    return tr("about {n} min").format(n=round(seconds / 60))


def expected(chapter: str, label: str, times: CellTimes | None = None) -> str:
    """The line ``expect`` prints."""
    unmeasured = tr("expected time: not measured yet (benchmarks/course_time.py "
                    "--cell-times)")
    try:
        times = times or CellTimes.committed()
    except FileNotFoundError:
        return unmeasured
    found = times.seconds.get(f"{chapter}/{label}")
    if found is None:
        return unmeasured
    on = (tr("{n} CPU cores").format(n=times.cores) if times.device == "cpu"
          else times.device)
    return tr("expected time: {about} (the last measured run, on {on})").format(
        about=about(found), on=on)


def expect(chapter: str, label: str) -> None:
    """Print how long this cell's job took in the last measured run."""
    print(expected(chapter, label), flush=True)


def measure(executed: list[Path]) -> dict[str, float]:
    """``<chapter>/<label>`` -> seconds, from papermill-executed chapters:
    each cell that calls ``expect`` is timed whole."""
    found: dict[str, float] = {}
    for path in executed:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            call = CALL.search("".join(cell["source"]))
            duration = cell["metadata"].get("papermill", {}).get("duration")
            if call and duration is not None:
                found[f"{call[1]}/{call[2]}"] = round(float(duration), 2)
    return found
