"""The committed chapters are clean, self-describing, and papermill-ready."""

import json
import re

import pytest

from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STEMS = [p.stem for p in CHAPTERS]
# The course's arc: eleven chapters that build on each other, in this order.
ARC = ["00_setup", "01_mean_of_means", "02_data_and_plan", "03_global_denominator",
       "04_ddp_parity", "05_bug_lab", "06_checkpoint_resume", "07_evaluation",
       "08_framework_audit", "09_choose_the_unit", "10_capstone"]
# Every chapter from 01 on asks for a graded prediction before its reveal.
PREDICTS = STEMS[1:]
ABSOLUTE = re.compile(r"(?<![\w.])/(work|root|tmp|home|Users|private|var)/")


def _load(path):
    return json.loads(path.read_text())


def _text_of(output):
    parts = [output.get("text", "")]
    for key, value in output.get("data", {}).items():
        if key.startswith("text/") or key.endswith("json"):
            parts.append(value if isinstance(value, str) else json.dumps(value))
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def test_the_chapters_exist_numbered_in_order():
    assert STEMS == ARC, "the chapters are the arc's, and no other"
    assert [int(stem[:2]) for stem in STEMS] == list(range(len(STEMS)))
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+", stem) for stem in STEMS)


@pytest.mark.parametrize("path", CHAPTERS[1:], ids=lambda p: p.stem)
def test_chapter_ends_with_graded_exercises(path):
    cells = _load(path)["cells"]
    heads = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and "## Exercises" in "".join(c["source"])]
    assert len(heads) == 1, f"{path.name}: one '## Exercises' section"
    # a quiz's check(...), not capstone_check(...) (the grader of chapter 10)
    graded = [c for c in cells[heads[0]:] if c["cell_type"] == "code"
              and re.search(r"\bcheck\(", "".join(c["source"]))]
    assert 3 <= len(graded) <= 5, f"{path.name}: 3-5 graded questions"
    for cell in graded:
        shown = "".join(_text_of(o) for o in cell["outputs"])
        assert "correct" not in shown.replace("not yet", ""), (
            f"{path.name}: a committed output answers a question")


@pytest.mark.parametrize("stem", PREDICTS)
def test_predictions_are_graded_before_the_reveal(stem):
    cells = _load(ROOT / "notebooks" / f"{stem}.ipynb")["cells"]
    exercises = next(i for i, c in enumerate(cells)
                     if "## Exercises" in "".join(c["source"]))
    asked = [i for i, c in enumerate(cells[:exercises]) if c["cell_type"] == "code"
             and ("widgets.Quiz(" in "".join(c["source"])
                  or re.search(r'check\("[a-z_]+\.predict', "".join(c["source"])))]
    assert asked, f"{stem}: no graded prediction before the exercises"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_clean(path):
    nb = _load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "run top to bottom, once"
    tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1, "exactly one papermill parameters cell"
    for cell in code:
        for out in cell["outputs"]:
            assert out["output_type"] != "error", f"error output in {path.name}"
            assert not ABSOLUTE.search(_text_of(out)), f"absolute path in {path.name}"
        for line in "".join(cell["source"]).splitlines():
            assert len(line) <= 80, f"{path.name}: {line!r}"
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown"
    assert "after this chapter you can" in "".join(first["source"]).lower()


@pytest.mark.parametrize("path", CHAPTERS[:-1], ids=lambda p: p.stem)
def test_chapter_points_to_the_next(path):
    nb = _load(path)
    nxt = STEMS[STEMS.index(path.stem) + 1]
    last = "".join(nb["cells"][-1]["source"])
    assert f"**Next:** [{nxt}]({nxt}.ipynb)" in last, f"{path.name}: no pointer to {nxt}"


def test_key_numbers_are_in_the_committed_outputs():
    """nbval re-checks these on every run; this names what must be there."""
    def outputs(stem):
        nb = _load(ROOT / "notebooks" / f"{stem}.ipynb")
        return "".join(_text_of(o) for c in nb["cells"] if c["cell_type"] == "code"
                       for o in c["outputs"])
    assert "2.5" in outputs("01_mean_of_means")
    parity = outputs("04_ddp_parity")
    assert re.search(r"global_token\s+allclose yes", parity)
    assert re.search(r"mean_of_means\s+allclose no", parity)
    resume = outputs("06_checkpoint_resume")
    assert "max |param diff| = 0.0 " in resume and "identical: yes" in resume
    assert "loss per token: trained" in outputs("07_evaluation")
    assert "mean of means 2.00, global mean 2.50" in parity
    bugs = outputs("05_bug_lab")
    assert "every bug caught: yes" in bugs and "no correct design flagged: yes" in bugs


# A chapter calls the library through its face: ``course_lib.NAME``, or
# ``from course_lib import NAME``; never a module below it.
BELOW_THE_FACE = re.compile(r"^\s*(?:from\s+course_lib\.|import\s+course_lib\.)", re.MULTILINE)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_reaches_the_library_through_its_face(path):
    for cell in _load(path)["cells"]:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            found = BELOW_THE_FACE.search(source)
            assert not found, f"{path.name}: {found.group(0).strip()}... imports below " \
                              "the face: add the name to course_lib._EXPORTS"


def test_the_face_rule_on_examples():
    assert BELOW_THE_FACE.search("from course_lib.jobs import uneven")
    assert BELOW_THE_FACE.search("x = 1\nimport course_lib.core.data as d")
    assert not BELOW_THE_FACE.search("import course_lib\nfrom course_lib import quiz")
    assert not BELOW_THE_FACE.search("# from course_lib.core.config import Scenario")
