"""Chapter 10's graded questions: a prediction before the reveal, exercises.

The notebook never holds an answer. ``check(qid, answer)`` says "correct",
or "not yet: <hint>" with a hint that does not give the answer away.
Answers that depend on a window are computed here from the config and the
corpus (no job runs to grade).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import ipywidgets as w

from .recipes import RECIPES, trains_the_token_mean
from .style import COLORS
from .widgets import _Displayable, _tagged

RIGHT = "correct"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message

    def _repr_html_(self) -> str:
        color = COLORS["global_token"] if self.correct else COLORS["mean_of_means"]
        return f'<b style="color:{color}">{html.escape(self.message)}</b>'


def _not_yet(hint: str) -> Verdict:
    return Verdict(False, f"not yet: {hint}")


@dataclass(frozen=True)
class Question:
    kind: str  # "number" or "choice"
    answer: Any | Callable[[], Any]  # a value, or a function computing it
    hint: str
    options: tuple[str, ...] = ()
    rel_tol: float = 1e-4

    def expected(self):
        return self.answer() if callable(self.answer) else self.answer


@cache
def _avg_tokens_factor_at(world_size: int) -> float:
    """HF 4.46.2-5.9's scale N / (N + R) on the parity window at this W."""
    from . import protocol
    from .recipe_audit import predicted_on_parity_window

    cfg = protocol.load_config()
    found = predicted_on_parity_window(cfg, protocol.corpus(cfg), world_size)
    return found["hf_trainer_avg_tokens"].factor


QUESTIONS: dict[str, Question] = {
    "recipes.1": Question(
        "number", 511 / 512,
        "N' counts the labels before the shift and the loss uses them after it: how "
        "many labels does each row lose? The factor is N / N'.", rel_tol=1e-6),
    "recipes.2": Question(
        "number", 0.4,
        "with SGD, multiplying every gradient by c moves the weights exactly as "
        "multiplying the learning rate by c would. What c does pure DDP add here, "
        "and what undoes it?"),
    "recipes.3": Question(
        "choice", "megatron_pre_clamp",
        "look for a recipe that divides a multiplicatively masked sum by a count "
        "that can be 0 (each recipe's docstring says how it computes S).",
        options=("fairseq", "hf_trainer_le_4_45", "megatron_default",
                 "megatron_pre_clamp", "megatron_per_token")),
    "recipes.4": Question(
        "number", lambda: _avg_tokens_factor_at(4),
        "run the cell with world_size=4, then read the factor of "
        "hf_trainer_avg_tokens in that report (N and R are in its skewed regime).",
        rel_tol=1e-5),
    "recipes.5": Question(
        "choice", "world_size_invariance",
        "run every check, then compare the failed checks of hf_trainer_4_46_0 "
        "with those of lightning.",
        options=("trajectory", "accumulation_invariance", "world_size_invariance",
                 "permutation_invariance", "no_sync")),
}


def check(qid: str, answer) -> Verdict:
    """Grade one exercise: "correct", or "not yet" and a hint."""
    if qid not in QUESTIONS:
        raise KeyError(f"no question {qid!r} (have: {', '.join(QUESTIONS)})")
    q = QUESTIONS[qid]
    if q.kind == "number":
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) \
                or not math.isfinite(answer):
            return _not_yet("answer with a finite number")
        ok = math.isclose(answer, q.expected(), rel_tol=q.rel_tol)
        return Verdict(True, RIGHT) if ok else _not_yet(q.hint)
    if not isinstance(answer, str) or answer.strip() not in q.options:
        return _not_yet("answer with one of: " + ", ".join(q.options))
    return Verdict(True, RIGHT) if answer.strip() == q.expected() else _not_yet(q.hint)


# --- the prediction: which recipes train the global token mean? --------------------------


def prediction_options() -> list[str]:
    """Every recipe but the course's own rule."""
    return [name for name in RECIPES if name != "course_rule"]


def grade_picks(picked: Iterable[str]) -> dict:
    """Per recipe: did the learner's pick (trains the token mean or not) hold?"""
    chosen = set(picked)
    unknown = chosen - set(prediction_options())
    if unknown:
        raise ValueError(f"unknown recipe {sorted(unknown)[0]!r}")
    rows = {name: {"picked": name in chosen, "truth": trains_the_token_mean(name),
                   "correct": (name in chosen) == trains_the_token_mean(name)}
            for name in prediction_options()}
    n_correct = sum(r["correct"] for r in rows.values())
    return {"recipes": rows, "n_correct": n_correct, "n_total": len(rows),
            "all_correct": n_correct == len(rows)}


class RecipePrediction(_Displayable):
    """Tick the recipes you expect to train the global token mean, then Check.

    Nothing is revealed until ``check()`` runs (the button calls it).
    """

    def __init__(self):
        self.boxes = {
            name: _tagged(w.Checkbox(value=False, indent=False,
                                     description=f"{RECIPES[name].label}: "
                                                 f"{RECIPES[name].backprop}, "
                                                 f"{RECIPES[name].reduction}"),
                          "course-recipe-pick")
            for name in prediction_options()}
        self.button = _tagged(w.Button(description="Check", button_style="primary"),
                              "course-recipe-check")
        self.verdict = _tagged(w.HTML("<i>Tick your picks, then press Check.</i>"),
                               "course-recipe-verdict")
        self.button.on_click(lambda _: self.check())
        self.result: dict | None = None
        self.widget = w.VBox([*self.boxes.values(), self.button, self.verdict])

    def picked(self) -> list[str]:
        return [name for name, box in self.boxes.items() if box.value]

    def check(self) -> dict:
        self.result = r = grade_picks(self.picked())
        lines = []
        for name, row in r["recipes"].items():
            color = COLORS["global_token"] if row["correct"] else COLORS["mean_of_means"]
            truth = "trains the token mean" if row["truth"] else "does not"
            lines.append(f'<span style="color:{color}">{"right" if row["correct"] else "no"}'
                         f"</span>: {html.escape(RECIPES[name].label)} {truth}")
        lines.append(f"<b>{r['n_correct']}/{r['n_total']} right.</b>")
        self.verdict.value = "<br>".join(lines)
        return r
