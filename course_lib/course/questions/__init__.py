"""The question bank: one module per chapter, in the course's order. A
chapter's module holds its questions (each with its answer, its hint and
its reasoning) and the functions that compute their answers; ``quiz`` asks
them. A new chapter's questions are one module and one entry in ``BANK``.
"""

from __future__ import annotations

from types import ModuleType

from course_lib.course.grading import Question
from course_lib.course.questions import (
    bug_lab,
    capstone,
    checkpoint_resume,
    choose_the_unit,
    data_and_plan,
    ddp_parity,
    evaluation,
    framework_audit,
    global_denominator,
    mean_of_means,
)

BANK: tuple[ModuleType, ...] = (
    mean_of_means,
    data_and_plan,
    global_denominator,
    ddp_parity,
    bug_lab,
    checkpoint_resume,
    evaluation,
    framework_audit,
    choose_the_unit,
    capstone,
)


def _merged() -> dict[str, Question]:
    found: dict[str, Question] = {}
    for module in BANK:
        slug = module.__name__.rsplit(".", 1)[1]
        for qid, question in module.QUESTIONS.items():
            if qid.split(".")[0] != slug or qid in found:
                raise ValueError(f"{module.__name__}: question {qid!r} is not its "
                                 "chapter's, or is asked twice")
            found[qid] = question
    return found


QUESTIONS: dict[str, Question] = _merged()
