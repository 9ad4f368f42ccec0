"""Graded questions: right answers pass, wrong ones get a hint, nothing leaks."""

import json
import math
import re

import pytest

from course_lib import paths, quiz, widgets

STATIC = {k: q for k, q in quiz.QUESTIONS.items() if not callable(q.answer)}


def _right(q):
    answer = q.expected()
    return list(answer) if q.kind == "choices" else answer


def _wrong(q):
    if q.kind == "number":
        return q.expected() * 1.5 + 1.0
    if q.kind == "choice":
        return next(o for o in q.options if o.lower() != q.expected().lower())
    return [q.options[0]] if set(q.expected()) != {q.options[0]} else [q.options[1]]


def _leaks(message, q):
    answer = q.expected()
    if q.kind == "number":
        shown = {repr(answer), f"{answer:g}", f"{answer:.3f}", f"{answer:.4g}"}
        return any(re.search(rf"(?<![\d.]){re.escape(s)}(?![\d])", message)
                   for s in shown)
    if q.kind == "choice":
        return re.search(rf"\b{re.escape(answer.lower())}\b", message.lower())
    return False


@pytest.mark.parametrize("qid", sorted(STATIC))
def test_the_right_answer_is_correct(qid):
    verdict = quiz.check(qid, _right(STATIC[qid]))
    assert verdict.correct and str(verdict) == "correct"


@pytest.mark.parametrize("qid", sorted(STATIC))
def test_a_wrong_answer_gets_a_hint_and_never_the_answer(qid):
    q = STATIC[qid]
    verdict = quiz.check(qid, _wrong(q))
    assert not verdict.correct
    assert "correct" not in str(verdict).lower()
    assert str(verdict).startswith("not yet: ")
    assert not _leaks(str(verdict), q), str(verdict)


def test_every_chapter_has_three_to_five_exercises():
    for chapter in ("mean_of_means", "token_explorer", "data_and_plan",
                    "global_denominator", "ddp_parity", "bug_lab",
                    "checkpoint_resume", "evaluation", "exercise", "recipes",
                    "adapting"):
        exercises = [k for k in quiz.questions(chapter) if "predict" not in k]
        assert 3 <= len(exercises) <= 5, chapter


@pytest.mark.parametrize("given", [None, "abc", float("nan"), True, [1]])
def test_nonsense_is_a_hint_not_a_crash(given):
    verdict = quiz.check("mean_of_means.1", given)
    assert not verdict.correct and "correct" not in str(verdict)


def test_choices_refuse_unknown_options():
    verdict = quiz.check("bug_lab.3", ["no_sync", "speed"])
    assert not verdict.correct and "'speed' is not an option" in str(verdict)
    assert quiz.check("bug_lab.3", ["NO_SYNC"]).correct, "case does not matter"


def test_answers_read_from_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "default_out", lambda name: tmp_path / name)
    missing = quiz.check("ddp_parity.1", 0.0064)
    assert not missing.correct and "run the chapter's job first" in str(missing)
    reports = tmp_path / "course" / "reports"
    reports.mkdir(parents=True)
    (reports / "parity.json").write_text(json.dumps(
        {"modes": {"mean_of_means": {"max_abs_err": 0.00643}}}))
    assert quiz.check("ddp_parity.1", 0.0064).correct
    assert not quiz.check("ddp_parity.1", 0.001).correct


def test_unknown_question():
    with pytest.raises(quiz.UnknownQuestion):
        quiz.check("nope.1", 1)


def test_quiz_widget_grades_without_showing_the_answer():
    w = widgets.Quiz("mean_of_means.predict_mom", "global_denominator.3",
                     "bug_lab.predict_count_never_reset")
    number, choice, choices = (w.inputs[q] for q in w.ids)
    number.value = "2.5"
    choice.value = "backward only"
    choices.children[0].value = True  # parity
    w.check()
    for qid in w.ids:
        html = w.verdicts[qid].value
        assert "not yet" in html and "correct" not in html
        assert not w.results[qid].correct
    number.value = "2"
    choice.value = "forward and backward"
    choices.children[0].value = False
    next(c for c in choices.children if c.description == "trajectory").value = True
    w.check()
    assert all(v.correct for v in w.results.values())
    assert all(">correct<" in w.verdicts[q].value for q in w.ids)
    assert math.isclose(quiz.QUESTIONS["evaluation.1"].expected(), math.log(32))
