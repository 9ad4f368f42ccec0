"""Graded questions: predictions before a reveal, exercises at the end of chapters.

A notebook asks by id and never holds the answer::

    from course_lib.course.quiz import check
    check("mean_of_means.1", 1.2)

``check`` answers "correct", or "not yet" with a hint that never gives the
answer away. Answers that depend on a run are read from the chapters' run
directory (``runs/course``) when the learner checks. The questions are the
bank's (``course.questions``, one module per chapter); how one is graded is
``course.grading``.
"""

from __future__ import annotations

from course_lib.core.edition import tr
from course_lib.course.grading import (
    RIGHT,
    UNANSWERED,
    Question,
    UnknownQuestion,
    Verdict,
    _unanswered,
    grade,
    listed,
)
from course_lib.course.questions import QUESTIONS


def check(question_id: str, given) -> Verdict:
    """Grade ``given`` for question ``question_id``; the verdict displays itself."""
    q = QUESTIONS.get(question_id)
    if q is None:
        raise UnknownQuestion(f"no question {question_id!r}")
    if _unanswered(given):
        return Verdict(False, tr(UNANSWERED), question_id, answered=False)
    try:
        verdict = grade(q, given)
    except FileNotFoundError as missing:  # an answer read from a run not made yet
        return Verdict(False, tr("not yet: {hint}").format(hint=missing), question_id)
    return Verdict(verdict.correct, verdict.message, question_id)


def ask(question_id: str) -> str:
    """The prompt of a question, with its options in the edition's words."""
    q = QUESTIONS[question_id]
    options = tr(" (choose: {options})").format(options=listed(q.choices()))
    return tr(q.prompt) + (options if q.choices() else "")


def questions(chapter: str) -> list[str]:
    """Ids of a chapter's questions, e.g. questions("bug_lab")."""
    return [k for k in QUESTIONS if k.split(".")[0] == chapter]


__all__ = ["QUESTIONS", "RIGHT", "UNANSWERED", "Question", "UnknownQuestion", "Verdict",
           "ask", "check", "grade", "questions"]
