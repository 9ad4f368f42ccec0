"""The committed chapters are clean, self-describing, and papermill-ready."""

import json
import re

import pytest

from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["00_setup", "01_mean_of_means", "02_token_explorer", "03_data_and_plan",
            "04_global_denominator", "05_ddp_parity", "06_checkpoint_resume",
            "07_evaluation", "08_exercise", "09_adapting"]
ABSOLUTE = re.compile(r"(?<![\w.])/(work|root|tmp|home|Users|private|var)/")


def _load(path):
    return json.loads(path.read_text())


def _text_of(output):
    parts = [output.get("text", "")]
    for key, value in output.get("data", {}).items():
        if key.startswith("text/") or key.endswith("json"):
            parts.append(value if isinstance(value, str) else json.dumps(value))
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def test_the_ten_chapters_exist():
    assert [p.stem for p in CHAPTERS] == EXPECTED


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
    nxt = EXPECTED[EXPECTED.index(path.stem) + 1]
    last = "".join(nb["cells"][-1]["source"])
    assert f"**Next:** [{nxt}]({nxt}.ipynb)" in last, f"{path.name}: no pointer to {nxt}"


def test_key_numbers_are_in_the_committed_outputs():
    """nbval re-checks these on every run; this names what must be there."""
    def outputs(stem):
        nb = _load(ROOT / "notebooks" / f"{stem}.ipynb")
        return "".join(_text_of(o) for c in nb["cells"] if c["cell_type"] == "code"
                       for o in c["outputs"])
    assert "2.5" in outputs("01_mean_of_means")
    parity = outputs("05_ddp_parity")
    assert re.search(r"global_token\s+allclose=True", parity)
    assert re.search(r"mean_of_means\s+allclose=False", parity)
    resume = outputs("06_checkpoint_resume")
    assert "max |param diff| = 0.0 " in resume and "identical: True" in resume
    assert "loss per token: trained" in outputs("07_evaluation")
    assert "mean of means 2.00, global mean 2.50" in outputs("08_exercise")
