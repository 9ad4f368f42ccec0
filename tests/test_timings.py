"""Every chapter cell that launches a job says first how long it took in the
last measured run, from the committed data/cell-times.json."""

import json
import re

import pytest

from course_lib.course import timings
from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# A call that starts a torchrun job (or several), outside a comment.
LAUNCH = re.compile(
    r"(?<![\w.])(?:course_lib\.)?(parity|bugs|audit|stop_and_continuous|resume_check|"
    r"train|exercise|audit_frameworks|audit_trainer|capstone_check|frameworks_logging)\(|"
    r"recipe_audit\.run\(|"
    r"evaluate_run\(.*world_size=|"  # in one process unless it names its ranks
    r"^\s*!.*torch")  # a shell escape that runs torchrun


def _code(line: str) -> str:
    return line.split("#", 1)[0]


def launching_cells():
    for path in CHAPTERS:
        cells = json.loads(path.read_text())["cells"]
        for cell in cells:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and any(
                    LAUNCH.search(_code(line)) for line in source.splitlines()):
                yield path.stem, source


def test_every_launching_cell_says_how_long_it_takes():
    times = timings.CellTimes.committed()
    found = list(launching_cells())
    assert len(found) >= 15, "the chapters launch jobs in at least 15 cells"
    keys = []
    for stem, source in found:
        call = timings.CALL.search(source)
        assert call, f"{stem}: a launching cell without expect(...):\n{source[:200]}"
        assert call[1] == stem, f"{stem}: expect() names {call[1]}"
        before = source[:call.start()].splitlines()[:-1]  # the lines above its own
        assert all(not _code(line).strip() for line in before), (
            f"{stem}: expect() must come before the launch:\n{source[:200]}")
        keys.append(f"{call[1]}/{call[2]}")
        assert keys[-1] in times.seconds, f"{keys[-1]}: not in data/cell-times.json"
    assert len(set(keys)) == len(keys), "one label per cell"
    assert set(times.seconds) == set(keys), "data/cell-times.json times cells that are gone"


@pytest.mark.parametrize("seconds, shown", [(0.2, "about 1 s"), (3.4, "about 3 s"),
                                            (23.0, "about 25 s"), (131.0, "about 2 min")])
def test_a_time_is_rounded_to_what_a_learner_plans_around(seconds, shown):
    assert timings.about(seconds) == shown


def test_the_line_names_the_measuring_machine():
    times = timings.CellTimes(date="2026-12-01", cores=2, device="cpu", command="x",
                              seconds={"06_bug_lab/bugs": 31.0})
    assert timings.expected("06_bug_lab", "bugs", times) == (
        "expected time: about 30 s (the last measured run, on 2 CPU cores)")
    assert "not measured yet" in timings.expected("06_bug_lab", "other", times)


def test_the_durations_are_read_from_papermill(tmp_path):
    cells = [{"cell_type": "code", "source": ['expect("05_ddp_parity", "parity")\n',
                                              "report = parity(cfg)"],
              "metadata": {"papermill": {"duration": 4.567}}},
             {"cell_type": "code", "source": ["x = 1"],
              "metadata": {"papermill": {"duration": 0.1}}},
             {"cell_type": "markdown", "source": ['expect("05_ddp_parity", "no")'],
              "metadata": {}}]
    path = tmp_path / "05_ddp_parity.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert timings.measure([path]) == {"05_ddp_parity/parity": 4.57}
