"""The French edition's quiz: the options are shown in French, a learner
answers in French or in English, and both grade alike."""

import dataclasses

import pytest

from course_lib.core import edition
from course_lib.core.edition import tr
from course_lib.core.typography import NBSP, NNBSP
from course_lib.course import grading, quiz, widgets

OPTIONED = {k: q for k, q in quiz.QUESTIONS.items() if q.kind != "number"}


@pytest.fixture
def french(monkeypatch):
    monkeypatch.setenv(edition.ENV, "fr")


def typed(text: str) -> str:
    """``text`` as a keyboard types it: plain spaces, an x for ×."""
    return text.replace(NBSP, " ").replace(NNBSP, " ").replace("×", "x")


def _given(q, option):
    return option if q.kind == "choice" else [option]


def test_there_are_questions_with_options():
    assert len(OPTIONED) > 20


@pytest.mark.parametrize("qid", sorted(OPTIONED))
def test_every_option_has_a_catalog_entry(qid):
    """Code names and formulas read the same in French; the rest is translated."""
    catalog = edition.catalog("fr")
    assert not [o for o in OPTIONED[qid].choices()
                if o not in catalog and not grading.neutral(o)]


def test_only_code_names_and_formulas_are_neutral():
    assert grading.neutral("parity") and grading.neutral("model_only")
    assert grading.neutral("fairseq") and grading.neutral("1 / (W * N)")
    assert not grading.neutral("yes") and not grading.neutral("step-0020")
    assert not grading.neutral("S_r before backward()")


@pytest.mark.parametrize("qid", sorted(OPTIONED))
def test_a_french_option_grades_like_its_english_one(qid, french):
    """Each option as the answer in turn: every option, given in English, as
    shown in French or as typed, grades the same; English stays accepted."""
    q = OPTIONED[qid]
    for right in q.choices():
        posed = dataclasses.replace(q, answer=right if q.kind == "choice" else (right,))
        for option in q.choices():
            english = grading.grade(posed, _given(q, option))
            assert english.correct == (option == right), (option, str(english))
            for text in (tr(option), typed(tr(option))):
                assert grading.grade(posed, _given(q, text)) == english, text


@pytest.mark.parametrize("qid", sorted(k for k, q in OPTIONED.items() if q.kind == "choices"
                                       and not callable(q.answer)))
def test_a_set_of_french_options_is_graded_as_a_set(qid, french):
    q = OPTIONED[qid]
    assert quiz.check(qid, [tr(o) for o in q.expected()]).correct
    assert quiz.check(qid, [typed(tr(o)).upper() for o in q.expected()]).correct
    assert not quiz.check(qid, [tr(o) for o in q.expected()][1:] or [
        tr(next(o for o in q.choices() if o not in q.expected()))]).correct


@pytest.mark.parametrize("qid", sorted(k for k, q in OPTIONED.items() if q.kind == "choice"
                                       and not callable(q.answer)))
def test_a_wrong_french_answer_never_shows_the_answer(qid, french):
    q = OPTIONED[qid]
    wrong = next(o for o in q.choices() if o != q.expected())
    verdict = quiz.check(qid, tr(wrong))
    assert not verdict.correct and str(verdict).startswith(tr("not yet: {hint}")[:9])
    assert tr(q.expected()).lower() not in str(verdict).lower()


def test_an_unknown_answer_is_still_not_an_option(french):
    hint = tr("choose one of: {options}").format(options="oui, non")
    assert str(quiz.check("ddp_parity.3", "peut-être")) == tr("not yet: {hint}").format(
        hint=hint)
    q = quiz.QUESTIONS["bug_lab.predict_count_never_reset"]
    listed = ", ".join(tr(o) for o in q.choices())
    hint = tr("{option} is not an option; choose among: {options}").format(
        option="'vitesse'", options=listed)
    assert str(quiz.check("bug_lab.predict_count_never_reset", ["no_sync", "vitesse"])
               ) == tr("not yet: {hint}").format(hint=hint)


def test_english_knows_no_french_options(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    assert str(quiz.check("ddp_parity.3", "oui")) == "not yet: choose one of: yes, no"
    assert quiz.check("ddp_parity.3", "No").correct


def test_ask_shows_the_french_options(french):
    assert quiz.ask("ddp_parity.3").endswith(f" (au choix{NBSP}: oui, non)")
    assert "yes" not in quiz.ask("ddp_parity.3")


def test_a_french_number_may_keep_its_decimal_comma(french, monkeypatch):
    assert quiz.check("mean_of_means.predict_global", "2,5").correct
    assert quiz.check("mean_of_means.predict_global", "2.5").correct
    # a minus sign as the French edition prints it (U+2212), or a hyphen
    assert quiz.check("mean_of_means.predict_theta_global", "\u22120,5").correct
    assert quiz.check("mean_of_means.predict_theta_global", "-0,5").correct
    monkeypatch.delenv(edition.ENV)  # English: 2,5 is no number, as before
    assert not quiz.check("mean_of_means.predict_global", "2,5").correct


def test_the_quiz_widget_shows_and_grades_french_options(french):
    one, many = "ddp_parity.3", "bug_lab.predict_count_never_reset"
    form = widgets.Quiz(one, many)
    radio, boxes = form.inputs[one], form.inputs[many]
    assert list(radio.options) == [("oui", "yes"), ("non", "no")]
    assert [c.description for c in boxes.children] == [
        tr(o) for o in quiz.QUESTIONS[many].choices()]
    radio.label = "non"  # what a learner clicks
    for child in boxes.children:
        child.value = child.description == tr("trajectory")
    form.check()
    assert form.results[one].correct and form.results[many].correct
    assert "(au choix" in form._static_text() and "yes" not in form._static_text()


def test_options_with_a_decimal_comma_are_set_apart_by_semicolons(french):
    assert quiz.ask("global_denominator.predict").endswith(
        f"(au choix{NBSP}: SGD 0,5 et Adam 0,5{NNBSP}; SGD 0,5 et Adam 1{NNBSP}; "
        f"SGD 1 et Adam 0,5{NNBSP}; SGD 1 et Adam 1)")
    assert quiz.ask("ddp_parity.3").endswith("oui, non)")
