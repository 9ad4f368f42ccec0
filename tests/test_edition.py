"""The French edition's strings: complete, never stale, and switched by
COURSE_EDITION alone (LANG is the learner's shell, not the course's)."""

import ast
import json
import string

import pytest

from course_lib.core import paths
from course_lib.core.reference import Comparison
from course_lib.course import api, edition, quiz, widgets
from course_lib.jobs.parity import GradSample, ParityReport

SOURCES = sorted((paths.project_root() / "course_lib").rglob("*.py"))


def marked() -> set[str]:
    """Every literal that a ``tr(...)`` call marks, as xgettext would find it."""
    found = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tr"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
    return found


def learner_strings() -> set[str]:
    """What a learner reads: the marked literals, the quiz's prompts and hints."""
    return marked() | {quiz.RIGHT, quiz.UNANSWERED} | {
        q.prompt for q in quiz.QUESTIONS.values()} | {q.hint for q in quiz.QUESTIONS.values()}


def test_the_french_catalog_is_complete_and_not_stale():
    fr = json.loads((edition.LOCALE / "fr.json").read_text(encoding="utf-8"))
    wanted = learner_strings()
    missing = sorted(wanted - set(fr))
    stale = sorted(set(fr) - wanted)
    assert not missing, f"translate into locale/fr.json: {missing[:3]}"
    assert not stale, f"locale/fr.json keeps strings no code reads: {stale[:3]}"
    assert all(v.strip() for v in fr.values())
    for english, french in fr.items():  # the placeholders survive translation
        assert sorted(_fields(english)) == sorted(_fields(french)), english


def _fields(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]


def test_english_is_the_default_even_in_a_french_shell(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    assert edition.current() == "en"
    assert str(quiz.check("mean_of_means.1", None)) == "your answer here"


def test_the_french_edition_speaks_french(monkeypatch):
    from course_lib.course.typography import breakable, french

    monkeypatch.setenv(edition.ENV, "fr")
    catalog = edition.catalog("fr")
    fr = {english: french(text) for english, text in catalog.items()}  # as set in type
    unanswered = quiz.check("mean_of_means.1", None)
    assert str(unanswered) == fr["your answer here"] and not unanswered.answered
    wrong = quiz.check("mean_of_means.1", 99.0)
    assert str(wrong) == fr["not yet: {hint}"].format(
        hint=fr[quiz.QUESTIONS["mean_of_means.1"].hint])
    assert str(quiz.check("mean_of_means.1", quiz.QUESTIONS["mean_of_means.1"].expected())
               ) == fr["correct"]
    assert quiz.ask("mean_of_means.1") == fr[quiz.QUESTIONS["mean_of_means.1"].prompt]
    assert not breakable(str(wrong)), "a colon that can wrap to the start of a line"
    explorer = widgets.TokenExplorer()
    assert explorer.world_size.description == fr["ranks W"]
    assert widgets.Quiz("mean_of_means.1").button.description == fr["Check"]


def test_the_summary_says_its_verdicts_in_french(monkeypatch):
    monkeypatch.setenv(edition.ENV, "fr")
    good, bad = Comparison(1e-8, True, 0), Comparison(1e-2, False, 9)
    report = ParityReport(
        world_size=2, backend="gloo", device="cpu", dtype="float32",
        nccl_reference_path=False, torch="2.x", compared_values=10, atol=1e-6,
        rtol=1e-4, step=0, local_tokens=[1, 2], global_tokens=3,
        window_loss_per_token=1.0, modes={"global_token": good, "mean_of_means": bad},
        no_sync={}, grad_sample=GradSample([], [], [], []), passed=True,
        control="mean_of_means")
    verdicts = [v for _, v, _ in api.SECTIONS["parity"].rows(report)]
    fr = edition.catalog("fr")
    assert verdicts == [fr["PASS"], fr["FAIL (expected)"]]


def test_an_unknown_edition_is_one_line(monkeypatch):
    monkeypatch.setenv(edition.ENV, "de")
    with pytest.raises(edition.EditionError, match="choose one of en, fr"):
        edition.current()
