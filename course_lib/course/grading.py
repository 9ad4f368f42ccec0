"""How a graded question is asked and graded; the questions themselves are
the bank's (``course.questions``), one module per chapter, and a chapter
asks them through ``quiz``.

A ``Question`` holds its prompt, its answer (a value, or a function that
computes it from the config, the corpus, the installed versions or the
chapters' run), its hint and its worked reasoning (``docs/solutions.md``).
``grade`` says "correct", or "not yet" with the hint: never the answer.
"""

from __future__ import annotations

import importlib
import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from course_lib.core import paths, typography
from course_lib.core.edition import catalog, current, tr


class UnknownQuestion(KeyError):
    pass


@dataclass(frozen=True)
class Question:
    prompt: str
    kind: str  # "number", "choice" (one option) or "choices" (a set of options)
    answer: Any  # the value, or a function that computes it from a run
    hint: str
    # the options, or a function that lists them (so that listing the
    # recipes waits until a question needs them: it imports torch)
    options: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    rel_tol: float = 1e-3
    abs_tol: float = 1e-9
    # why the answer is what it is, in 1-3 sentences (docs/solutions.md)
    reasoning: str = ""

    def expected(self):
        return self.answer() if callable(self.answer) else self.answer

    def choices(self) -> tuple[str, ...]:
        return self.options() if callable(self.options) else self.options


@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str
    question: str = field(default="", repr=False)
    answered: bool = True  # False: no answer yet, so neither a grade nor a hint

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message

    def _repr_html_(self) -> str:
        if not self.answered:  # no grade and no hint before an answer
            return f'<i style="color:#777777">{self.message}</i>'
        color = "#1b7837" if self.correct else "#c51b7d"
        return f'<b style="color:{color}">{self.message}</b>'


RIGHT = "correct"
# What a question says before any answer: neither a grade nor a hint.
UNANSWERED = "your answer here"


def _unanswered(given) -> bool:
    """None, an empty text or an empty selection (a widget left as it came)."""
    if given is None:
        return True
    if isinstance(given, str):
        return not given.strip()
    return isinstance(given, (list, tuple, set, frozenset)) and not given


def _not_yet(hint: str) -> Verdict:
    return Verdict(False, tr("not yet: {hint}").format(hint=hint))


def _folded(text: str) -> str:
    """What of an option's text matters when a learner types it: not its
    case, accents, kind of space nor French typography (2 × 3, ' ;')."""
    text = unicodedata.normalize("NFKD", text.replace("×", "x").replace("…", "..."))
    text = " ".join("".join(c for c in text if not unicodedata.combining(c)).split())
    return re.sub(r" (?=[;:?!])", "", text.casefold())


def aliases(options: Iterable[str]) -> dict[str, str]:
    """Every text that names an option, folded (``_folded``) -> the option:
    the option itself and, in an edition other than English, its catalog
    text, so that French « oui » and English "yes" both answer "yes"."""
    texts = catalog(current())
    found: dict[str, str] = {}
    for option in options:
        for text in (option, texts.get(option, option)):
            found.setdefault(_folded(text), option)
    return found


def neutral(option: str) -> bool:
    """Whether ``option`` reads the same in every edition, so that the
    catalog holds no entry for it: a name from the code (a check, a recipe,
    a step function, an ablation: ``model_only``) or a formula of symbols
    (``1 / N_r``). Every other option has its catalog entry."""
    from course_lib.steps.recipes import RECIPES

    names = {*check_names(), *RECIPES}
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", option)
    return all(len(w) == 1 or "_" in w or w in names for w in words)


def listed(options: Iterable[str]) -> str:
    """The options as the edition shows them, for a prompt or a hint: apart
    by commas, or by semicolons once an option holds a comma (French 0,5)."""
    shown = [tr(o) for o in options]
    if not any("," in o for o in shown):
        return ", ".join(shown)
    return (typography.NNBSP + "; " if current() == "fr" else "; ").join(shown)


def grade(q: Question, given) -> Verdict:
    """Grade one answer. A wrong answer's message never contains "correct"
    nor the expected value. An option may be given in the edition's words
    or in English (``aliases``)."""
    if q.kind == "number":
        if isinstance(given, str):
            if current() == "fr":  # 2,5, 112 480 and −0,5, as French writes them
                given = "".join(given.split()).replace(",", ".").replace(
                    typography.MINUS, "-")
            try:
                given = float(given)
            except ValueError:
                return _not_yet(tr("answer with a number"))
        if isinstance(given, bool) or not isinstance(given, (int, float)) \
                or not math.isfinite(given):
            return _not_yet(tr("answer with a finite number"))
        ok = math.isclose(given, q.expected(), rel_tol=q.rel_tol, abs_tol=q.abs_tol)
        return Verdict(True, tr(RIGHT)) if ok else _not_yet(tr(q.hint))
    options = aliases(q.choices())
    if q.kind == "choice":
        chosen = options.get(_folded(given)) if isinstance(given, str) else None
        if chosen is None:
            return _not_yet(tr("choose one of: {options}").format(
                options=listed(q.choices())))
        ok = chosen == options.get(_folded(q.expected()))
        return Verdict(True, tr(RIGHT)) if ok else _not_yet(tr(q.hint))
    if q.kind == "choices":
        if isinstance(given, str) or not isinstance(given, Iterable):
            return _not_yet(tr("give a list of options, e.g. ['a', 'b']"))
        given = [str(x) for x in given]  # a generator is read twice below
        unknown = sorted({x.strip().lower() for x in given if _folded(x) not in options})
        if unknown:
            return _not_yet(tr("{option} is not an option; choose among: {options}").format(
                option=repr(unknown[0]), options=listed(q.choices())))
        picked = {options[_folded(x)] for x in given}
        if picked == {options.get(_folded(x)) for x in q.expected()}:
            return Verdict(True, tr(RIGHT))
        return _not_yet(tr(q.hint))
    raise ValueError(f"unknown question kind {q.kind!r}")


# --- answers read from the chapters' run ------------------------------------------


def from_run(report: str, get: Callable[[Any], Any], file: str | None = None
          ) -> Callable[[], Any]:
    """An answer read from the chapters' run: ``get`` of the report class
    ``report`` ("module:Class"), loaded from the course's run directory
    (from ``reports/<file>.json`` when the class's reports have several)."""
    def read():
        module, _, name = report.partition(":")
        cls = getattr(importlib.import_module(module), name)
        out = paths.default_out("course")
        if not cls.exists(out, file):
            raise FileNotFoundError(tr("run the chapter's job first: no {name}.json yet")
                                    .format(name=file or cls.NAME))
        return get(cls.load(out, file))
    return read


def check_names() -> tuple[str, ...]:
    from course_lib.checks import NAMES

    return NAMES
