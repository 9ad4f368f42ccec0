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

from course_lib.reports.store import Committed

# expect("06_bug_lab", "bugs") in a cell's source: (chapter, label).
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
        return f"about {max(1, round(seconds))} s"
    if seconds < 120:
        return f"about {5 * round(seconds / 5)} s"
    return f"about {round(seconds / 60)} min"


def expected(chapter: str, label: str, times: CellTimes | None = None) -> str:
    """The line ``expect`` prints."""
    try:
        times = times or CellTimes.committed()
    except FileNotFoundError:
        return "expected time: not measured yet (benchmarks/course_time.py --cell-times)"
    found = times.seconds.get(f"{chapter}/{label}")
    if found is None:
        return "expected time: not measured yet (benchmarks/course_time.py --cell-times)"
    on = f"{times.cores} CPU cores" if times.device == "cpu" else times.device
    return f"expected time: {about(found)} (the last measured run, on {on})"


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
