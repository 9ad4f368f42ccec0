"""No graded prediction's answer is on the screen before the learner answers.

A graded prediction is a code cell before a chapter's "## Exercises" section
that calls ``check("<slug>.predict...", ...)`` or ``widgets.Quiz("<id>", ...)``
(the ids are read from the cell's source). For each one whose answer is a
number or an option (``kind`` "number", "choice" or "choices"), the answer
must appear in no cell above the question's first cell: neither in a
source (markdown or code) nor in a committed output.

The rule, exactly:

- **Numbers.** The answer's usual renderings (``repr``, ``:g``, ``:.2f``,
  ``:.3f``, ``:.4g``, and ``:,`` for integers) are searched as whole
  numbers: not preceded by a digit or a decimal point, not followed by a
  digit, a decimal digit or an exponent (so 2.5 is not found in 12.5, 2.57
  or 2.5e-3). Trivial answers are not checked: an integer value from 0 to 3
  (0.0, 1, 2.0, 3 ...) appears anyway, as a rank, a world size or a count.
- **Options.** A chunk is one markdown cell, one code cell's source, or
  one code cell's outputs together. The options a chunk names are those
  found in it as whole words (case-insensitive, and not as a call:
  ``no_sync()`` is the context manager, not the check ``no_sync``). The
  chunk reveals the answer when they are all part of the answer (its one
  option for a "choice", its set for "choices"), are not every option (a
  chunk that names them all only lists them), and include evidence. An
  option made of plain lowercase words ("yes", "no", "more", "the same",
  "parity") is ordinary prose, so in a source it counts among the options
  named but is no evidence on its own; in an output it is. An option with
  ``_``, ``.``, ``/`` or a digit is a name (a check, a recipe, "under 0.1
  nat"): evidence wherever it appears.
- **Answers read from a run.** When ``expected()`` raises
  ``FileNotFoundError`` (the chapters' run is absent) the prediction is
  skipped; ``test_predictions_are_found`` counts those.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import pytest

from course_lib.course import quiz
from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ASKS = (re.compile(r"""\bcheck\(\s*["']([a-z0-9_]+\.predict\w*)["']"""),
        re.compile(r"""\bQuiz\(\s*["']([a-z0-9_]+\.\w+)["']"""))
KINDS = ("number", "choice", "choices")
# An option of plain words ("yes", "more", "parity") is ordinary prose: in a
# source it is no evidence by itself. One with _ . / or a digit is a name.
PROSE = re.compile(r"[a-z ]+")
TRIVIAL = range(0, 4)  # integer answers that appear anyway


@dataclass(frozen=True)
class Prediction:
    chapter: str
    question: str
    cell: int  # index of the first cell that asks it
    chunks: tuple[tuple[str, str], ...]  # (where, text) of every cell above

    def __str__(self) -> str:
        return f"{self.chapter}:{self.question}"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _outputs(cell) -> list[str]:
    found = []
    for out in cell.get("outputs", []):
        parts = [_text(out.get("text", ""))]
        for key, value in out.get("data", {}).items():
            if key.startswith("text/"):
                parts.append(_text(value))
        found.append("".join(parts))
    return found


def _predictions() -> list[Prediction]:
    found = []
    for path in CHAPTERS:
        cells = json.loads(path.read_text())["cells"]
        end = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                    and "## Exercises" in _text(c["source"])), len(cells))
        seen: set[str] = set()
        for i, cell in enumerate(cells[:end]):
            if cell["cell_type"] != "code":
                continue
            source = _text(cell["source"])
            for pattern in ASKS:
                for qid in pattern.findall(source):
                    if qid in seen:
                        continue
                    seen.add(qid)
                    chunks = []
                    for j, above in enumerate(cells[:i]):
                        kind = above["cell_type"]
                        chunks.append((f"cell {j} ({kind} source)", _text(above["source"])))
                        if above["cell_type"] == "code":
                            chunks.append((f"cell {j} (output)", "\n".join(_outputs(above))))
                    found.append(Prediction(path.stem, qid, i, tuple(chunks)))
    return found


PREDICTIONS = _predictions()


def renderings(value: float) -> set[str]:
    shown = {repr(value), f"{value:g}", f"{value:.2f}", f"{value:.3f}", f"{value:.4g}"}
    if float(value).is_integer():
        shown |= {str(int(value)), f"{int(value):,}"}
    return shown


def number_pattern(value: float) -> re.Pattern:
    alternatives = "|".join(re.escape(s) for s in sorted(renderings(value), key=len,
                                                            reverse=True))
    return re.compile(rf"(?<![\d.])(?:{alternatives})(?!\d|\.\d|[eE][-+]?\d)")


def _word(option: str) -> re.Pattern:
    # "no_sync()" is the context manager, not the check no_sync: a call is not named
    return re.compile(rf"(?<![\w]){re.escape(option)}(?![\w(])", re.IGNORECASE)


def revealed(pred: Prediction, q: quiz.Question, expected) -> list[str]:
    """Where the answer shows above the question (empty: nowhere)."""
    if q.kind == "number":
        if float(expected).is_integer() and int(expected) in TRIVIAL:
            return []
        pattern = number_pattern(float(expected))
        return [f"{where}: {m.group(0)!r}" for where, text in pred.chunks
                for m in [pattern.search(text)] if m]  # one hit per chunk
    options = [o.lower() for o in q.choices()]
    answer = {expected.lower()} if q.kind == "choice" else {e.lower() for e in expected}
    hits = []
    for where, text in pred.chunks:
        named = {o for o in options if _word(o).search(text)}
        # in prose, a plain-word option proves nothing by itself
        evidence = named if where.endswith("(output)") else \
            {o for o in named if not PROSE.fullmatch(o)}
        if evidence and named <= answer and named != set(options):
            hits.append(f"{where}: names {sorted(named)}")
    return hits


def test_predictions_are_found():
    graded = [p for p in PREDICTIONS if p.question in quiz.QUESTIONS
              and quiz.QUESTIONS[p.question].kind in KINDS]
    from_run = []
    for p in graded:
        try:
            quiz.QUESTIONS[p.question].expected()
        except FileNotFoundError:
            from_run.append(str(p))
    print(f"{len(graded)} graded predictions, {len(from_run)} read from a run "
          f"(skipped without it): {from_run}")
    assert len({p.chapter for p in graded}) >= 9


@pytest.mark.parametrize("pred", PREDICTIONS, ids=str)
def test_no_prediction_is_answered_above_it(pred):
    q = quiz.QUESTIONS.get(pred.question)
    assert q is not None, f"{pred}: no such question in quiz.QUESTIONS"
    if q.kind not in KINDS:
        pytest.skip(f"{pred}: a {q.kind} answer")
    try:
        expected = q.expected()
    except FileNotFoundError as missing:
        pytest.skip(f"{pred}: the answer is read from a run ({missing})")
    if q.kind == "number" and not math.isfinite(float(expected)):
        pytest.skip(f"{pred}: no finite answer")
    hits = revealed(pred, q, expected)
    assert not hits, f"{pred} is answered above it (cell {pred.cell}): " + "; ".join(hits)


def test_the_rule_on_examples():
    """The matcher itself: whole numbers only, and every usual rendering."""
    pattern = number_pattern(2.5)
    assert pattern.search("the mean is 2.5.") and pattern.search("2.50 nats")
    assert not pattern.search("12.5") and not pattern.search("2.57")
    assert not pattern.search("2.5e-3") and not pattern.search("0.25")
    third = number_pattern(1 / 3)
    assert third.search("0.333") and third.search("0.33 of it")
    assert number_pattern(112_480).search("112,480 components")
    assert number_pattern(-0.5).search("theta = -0.5")


def test_the_option_rule_on_examples():
    q = quiz.Question("which?", "choices", ("parity", "no_sync"), "",
                      options=("parity", "no_sync", "trajectory"))
    def shows(where, text):
        return revealed(Prediction("x", "x.predict", 1, ((where, text),)), q, q.answer)
    assert shows("cell 0 (markdown source)", "only no_sync sees it")
    assert not shows("cell 0 (markdown source)", "parity, no_sync and trajectory")
    assert not shows("cell 0 (markdown source)", "trajectory runs five updates")
    assert not shows("cell 0 (output)", "wrap it in model.no_sync() first")
    yes_no = quiz.Question("ok?", "choice", "no", "", options=("yes", "no"))
    prose = Prediction("x", "x.predict", 1, (("cell 0 (markdown source)", "no"),))
    printed = Prediction("x", "x.predict", 1, (("cell 0 (output)", "passes: no"),))
    assert not revealed(prose, yes_no, "no") and revealed(printed, yes_no, "no")


def _chapter_chunks(path) -> tuple[tuple[str, str], ...]:
    """Every cell of a whole chapter: its sources and its committed outputs."""
    chunks = []
    for j, cell in enumerate(json.loads(path.read_text())["cells"]):
        chunks.append((f"{path.stem} cell {j} ({cell['cell_type']} source)",
                       _text(cell["source"])))
        if cell["cell_type"] == "code":
            chunks.append((f"{path.stem} cell {j} (output)", "\n".join(_outputs(cell))))
    return tuple(chunks)


# Predictions that an EARLIER chapter answers, and the chapters that do. The
# re-cut of issue 28 emptied it; the test fails on a new one, and on an entry
# that no longer holds, so the list can only shrink.
ANSWERED_EARLIER: dict[str, set[str]] = {}


def test_no_prediction_is_answered_by_an_earlier_chapter():
    earlier = {path.stem: _chapter_chunks(path) for path in CHAPTERS}
    found: dict[str, set[str]] = {}
    checked = set()
    for pred in PREDICTIONS:
        q = quiz.QUESTIONS.get(pred.question)
        if q is None or q.kind not in KINDS:
            continue
        try:
            expected = q.expected()
        except FileNotFoundError:
            continue  # read from a run: judged where the run exists
        if q.kind == "number" and not math.isfinite(float(expected)):
            continue
        checked.add(str(pred))
        before = [stem for stem in earlier if stem < pred.chapter]
        chunks = tuple(c for stem in before for c in earlier[stem])
        hits = revealed(Prediction(pred.chapter, pred.question, 0, chunks), q, expected)
        if hits:
            found[str(pred)] = {h.split(" cell ")[0] for h in hits}
    new = {k: sorted(v) for k, v in found.items() if not v <= ANSWERED_EARLIER.get(k, set())}
    assert not new, f"answered by an earlier chapter: {new}"
    stale = {k for k in ANSWERED_EARLIER if k in checked and k not in found}
    assert not stale, f"no longer answered earlier, remove from ANSWERED_EARLIER: {stale}"
