"""Graded questions: right answers pass, wrong ones get a hint, nothing leaks."""

import re

import pytest

from course_lib.core import paths
from course_lib.core.reference import Comparison
from course_lib.course import quiz, widgets
from course_lib.jobs.parity import GradSample, ParityReport

STATIC = {k: q for k, q in quiz.QUESTIONS.items() if not callable(q.answer)}


def _right(q):
    answer = q.expected()
    return list(answer) if q.kind == "choices" else answer


def _wrong(q):
    if q.kind == "number":
        return q.expected() * 1.5 + 1.0
    if q.kind == "choice":
        return next(o for o in q.choices() if o.lower() != q.expected().lower())
    return [q.choices()[0]] if set(q.expected()) != {q.choices()[0]} else [q.choices()[1]]


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


# Chapters from 01 on, by slug: 04_ddp_parity -> ddp_parity.
SLUGS = [p.stem.split("_", 1)[1] for p in sorted((paths.project_root() / "notebooks")
                                                 .glob("[0-9][0-9]_*.ipynb"))][1:]


def test_every_chapter_has_three_to_five_exercises():
    assert len(SLUGS) == 10  # 01 to 10: the arc of tests/test_notebooks.py
    for chapter in SLUGS:
        exercises = [k for k in quiz.questions(chapter) if "predict" not in k]
        assert 3 <= len(exercises) <= 5, chapter


def test_question_ids_start_with_their_chapter_slug():
    strays = sorted(k for k in quiz.QUESTIONS if k.split(".")[0] not in SLUGS)
    assert not strays, f"questions of no chapter: {strays}"


@pytest.mark.parametrize("qid", ["mean_of_means.1", "bug_lab.3", "ddp_parity.2"])
@pytest.mark.parametrize("given", [None, "", "  ", [], ()])
def test_an_unanswered_question_shows_neither_a_grade_nor_a_hint(qid, given):
    verdict = quiz.check(qid, given)
    assert not verdict.correct and not verdict.answered
    assert str(verdict) == "your answer here"
    assert "not yet" not in verdict._repr_html_()


@pytest.mark.parametrize("given", ["abc", float("nan"), True, [1]])
def test_nonsense_is_a_hint_not_a_crash(given):
    verdict = quiz.check("mean_of_means.1", given)
    assert not verdict.correct and "correct" not in str(verdict)


def test_choices_refuse_unknown_options():
    qid = "bug_lab.predict_count_never_reset"  # a set of checks: ("trajectory",)
    verdict = quiz.check(qid, ["no_sync", "speed"])
    assert not verdict.correct and "'speed' is not an option" in str(verdict)
    assert quiz.check(qid, ["Trajectory"]).correct, "case does not matter"
    assert not quiz.check(qid, ["no_sync", "trajectory"]).correct


def test_answers_read_from_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "default_out", lambda name: tmp_path / name)
    missing = quiz.check("ddp_parity.2", 0.0099)
    assert not missing.correct and "run the chapter's job first" in str(missing)
    ok, bad = Comparison(1e-8, True, 0), Comparison(0.00643, False, 110_284)
    # one sampled component: |1.01 - 1.0| - 1e-4 * |1.0| = 0.0099
    ParityReport(
        world_size=2, backend="gloo", device="cpu", dtype="float32",
        nccl_reference_path=False, torch="2.x", compared_values=112_480, atol=1e-6,
        rtol=1e-4, step=0, local_tokens=[1, 2], global_tokens=3,
        window_loss_per_token=1.0, modes={"global_token": ok, "mean_of_means": bad},
        no_sync={}, grad_sample=GradSample(index=[0], reference=[1.0],
                                           global_token=[1.0], mean_of_means=[1.01]),
        passed=True, control="x",
    ).save(tmp_path / "course")
    assert quiz.check("ddp_parity.2", 0.0099).correct
    assert not quiz.check("ddp_parity.2", 0.001).correct


def test_unknown_question():
    with pytest.raises(quiz.UnknownQuestion):
        quiz.check("nope.1", 1)


def _first(kind):
    return next(k for k, q in sorted(STATIC.items()) if q.kind == kind)


def _answer(w, qid, given):
    """Type ``given`` into the widget's input for ``qid``, as a learner would."""
    box = w.inputs[qid]
    if quiz.QUESTIONS[qid].kind == "number":
        box.value = str(given)
    elif quiz.QUESTIONS[qid].kind == "choice":
        box.value = given
    else:
        picked = {str(x).lower() for x in given}
        for child in box.children:
            child.value = child.description.lower() in picked


def test_quiz_widget_grades_without_showing_the_answer():
    ids = [_first("number"), _first("choice"), _first("choices")]
    w = widgets.Quiz(*ids)
    w.check()  # nothing answered yet: no grade, no hint
    assert all(">your answer here<" in w.verdicts[q].value for q in ids)
    for qid in ids:
        _answer(w, qid, _wrong(STATIC[qid]))
    w.check()
    for qid in w.ids:
        html = w.verdicts[qid].value
        assert "not yet" in html and "correct" not in html
        assert not w.results[qid].correct
    for qid in ids:
        _answer(w, qid, _right(STATIC[qid]))
    w.check()
    assert all(v.correct for v in w.results.values())
    assert all(">correct<" in w.verdicts[q].value for q in w.ids)
