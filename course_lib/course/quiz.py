"""Graded questions: predictions before a reveal, exercises at the end of chapters.

A notebook asks by id and never holds the answer::

    from course_lib.course.quiz import check
    check("mean_of_means.1", 1.2)

``check`` answers "correct", or "not yet" with a hint that never gives the
answer away. Answers that depend on a run are read from the chapters' run
directory (``runs/course``) when the learner checks.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from course_lib.core import paths
from course_lib.course.edition import tr


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


def grade(q: Question, given) -> Verdict:
    """Grade one answer. A wrong answer's message never contains "correct"
    nor the expected value."""
    if q.kind == "number":
        if isinstance(given, str):
            try:
                given = float(given)
            except ValueError:
                return _not_yet(tr("answer with a number"))
        if isinstance(given, bool) or not isinstance(given, (int, float)) \
                or not math.isfinite(given):
            return _not_yet(tr("answer with a finite number"))
        ok = math.isclose(given, q.expected(), rel_tol=q.rel_tol, abs_tol=q.abs_tol)
        return Verdict(True, tr(RIGHT)) if ok else _not_yet(tr(q.hint))
    options = {o.lower(): o for o in q.choices()}
    if q.kind == "choice":
        if not isinstance(given, str) or given.strip().lower() not in options:
            return _not_yet(tr("choose one of: {options}").format(
                options=", ".join(q.choices())))
        ok = given.strip().lower() == q.expected().lower()
        return Verdict(True, tr(RIGHT)) if ok else _not_yet(tr(q.hint))
    if q.kind == "choices":
        if isinstance(given, str) or not isinstance(given, Iterable):
            return _not_yet(tr("give a list of options, e.g. ['a', 'b']"))
        picked = {str(x).strip().lower() for x in given}
        unknown = sorted(picked - set(options))
        if unknown:
            return _not_yet(tr("{option} is not an option; choose among: {options}").format(
                option=repr(unknown[0]), options=", ".join(q.choices())))
        if picked == {x.lower() for x in q.expected()}:
            return Verdict(True, tr(RIGHT))
        return _not_yet(tr(q.hint))
    raise ValueError(f"unknown question kind {q.kind!r}")


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
    """The prompt of a question, with its options."""
    q = QUESTIONS[question_id]
    options = tr(" (choose: {options})").format(options=", ".join(q.choices()))
    return tr(q.prompt) + (options if q.choices() else "")


def questions(chapter: str) -> list[str]:
    """Ids of a chapter's questions, e.g. questions("bug_lab")."""
    return [k for k in QUESTIONS if k.split(".")[0] == chapter]


# --- answers read from the chapters' run ------------------------------------------


def _from(report: str, get: Callable[[Any], Any], file: str | None = None
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


def _repeats(sequences: int, world_size: int) -> int:
    """14: the sequences DistributedSampler hands out a second time."""
    return -sequences % world_size


def _check_names() -> tuple[str, ...]:
    from course_lib.checks import NAMES

    return NAMES


def _recipe_names() -> tuple[str, ...]:
    """Every fine-tuning recipe but the course's own rule (chapter 12 has the RL ones)."""
    from course_lib.steps.recipes import RECIPES

    return tuple(name for name, r in RECIPES.items()
                 if name != "course_rule" and not r.policy)


def _exact_recipes() -> list[str]:
    from course_lib.steps.recipes import trains_the_token_mean

    return [name for name in _recipe_names() if trains_the_token_mean(name)]


# 11 framework_audit: configurations a learner predicts, as (framework, model, flags).
AUDITED: dict[str, tuple[str, str, dict[str, Any]]] = {
    "hf/llama/on": ("hf", "llama", {"average_tokens_across_devices": True}),
    "hf/llama/off": ("hf", "llama", {"average_tokens_across_devices": False}),
    "hf/gpt2/on": ("hf", "gpt2", {"average_tokens_across_devices": True}),
    "accelerate/accumulate": ("accelerate", "llama", {"recipe": "accumulate"}),
    "accelerate/docs_recipe": ("accelerate", "llama", {"recipe": "docs_recipe"}),
    "lightning": ("lightning", "llama", {}),
}


def _exact_configurations() -> list[str]:
    """Those the reading of the installed versions says train the token
    mean (the chapter's run and the committed matrix check the reading)."""
    from course_lib.frameworks import adapter, installed
    from course_lib.frameworks.candidates import EXACT
    from course_lib.frameworks.expected import expected

    found = []
    for key, (framework, model, flags) in AUDITED.items():
        version = installed(adapter(framework).package)
        stack = {"transformers": installed("transformers") or ""}
        if version and expected(framework, version, model, flags, stack) == EXACT.name:
            found.append(key)
    return found


def _default_flag_formula(version: str, model: str) -> str:
    """What the table of readings says a Trainer of ``version`` trains when
    the config leaves average_tokens_across_devices at its default."""
    from course_lib.frameworks.expected import expected

    formula = expected("hf", version, model, {})
    assert formula is not None  # a version with a formula, not 4.46.2
    return formula


def _counts(report):
    """The window's counts, from the first measured row."""
    return next(r.counts for r in report.rows if r.counts is not None)


def _rank0_weight(report) -> float:
    """N / (W N_0): how much more a rank-0 token weighs in a mean of rank means."""
    c = _counts(report)
    return c.N / (len(c.N_r) * c.N_r[0])


def _candidate_names() -> tuple[str, ...]:
    from course_lib.frameworks.candidates import CANDIDATES

    return tuple(c.name for c in CANDIDATES)


@cache
def _dr_grpo_factor(world_size: int = 2) -> float:
    """trl_grpo_dr_grpo's scale of the A-weighted token mean, on the parity window."""
    from course_lib.course.api import corpus, load_config
    from course_lib.jobs.recipes import predicted_on_parity_window

    cfg = load_config()
    factor = predicted_on_parity_window(cfg, corpus(cfg), world_size)[
        "trl_grpo_dr_grpo"].factor
    assert factor is not None  # a constant normalizer: uniformly scaled
    return factor


@cache
def _uneven_counts(max_tokens: int, world_size: int = 2) -> list[int]:
    """Each rank's microbatch count on the parity window, re-batched by a budget."""
    from course_lib.core.data import parity_window
    from course_lib.course.api import corpus, load_config
    from course_lib.rank.harness import uneven_layout

    cfg = load_config()
    data = corpus(cfg)
    return [len(r) for r in uneven_layout(parity_window(cfg, data, world_size), data,
                                          max_tokens)]


@cache
def _documents(width: int, world_size: int = 2) -> int:
    """The documents of the parity window, packed into rows of ``width`` tokens."""
    from course_lib.core import objectives
    from course_lib.core.data import collate, parity_window
    from course_lib.course.api import corpus, load_config
    from course_lib.rank.harness import packing_of

    cfg = load_config()
    data = corpus(cfg)
    packing = packing_of(cfg, width)
    return sum(objectives.documents(collate(data, ids, packing=packing)[1])[1]
               for rank in parity_window(cfg, data, world_size) for ids in rank)


@cache
def _avg_tokens_factor(world_size: int) -> float:
    """HF 4.46.3-5.9's scale N / (N + R), flag on, on the parity window at this W."""
    from course_lib.course.api import corpus, load_config
    from course_lib.jobs.recipes import predicted_on_parity_window

    cfg = load_config()
    factor = predicted_on_parity_window(cfg, corpus(cfg), world_size)[
        "hf_trainer_avg_tokens"].factor
    assert factor is not None  # the recipe is uniformly scaled
    return factor


def _plan_tokens(step: int) -> int:
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    window = make_plan(cfg, data, cfg.train.world_size)[step]
    return sum(len(data.sequences[i]) - 1 for rank in window for mb in rank for i in mb)


def _explorer_bias(world_size: int) -> float:
    """The token explorer's bias (mean of means - global) with its default
    counts and losses for the first ``world_size`` ranks."""
    from course_lib.core import arithmetic
    from course_lib.core.arithmetic import DEFAULT_LOSSES, DEFAULT_TOKENS

    counts = list(DEFAULT_TOKENS[:world_size])
    sums = [n * x for n, x in zip(counts, DEFAULT_LOSSES, strict=False)]
    return arithmetic.mean_of_means(sums, counts) - arithmetic.global_mean(sums, counts)


def _targets_for_optimum(theta: float, others: int = 36) -> float:
    """How many +1 targets rank 0 needs, beside ``others`` targets -1 on rank 1,
    for the global mean's gradient to vanish at ``theta``: there theta is the
    token-weighted mean of the targets, (n - others) / (n + others)."""
    return others * (1 + theta) / (1 - theta)


def _plan_token_ratio() -> float:
    """Rank 1's supervised tokens over rank 0's, summed over the whole plan."""
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    plan = make_plan(cfg, data, 2)
    per_rank = [sum(len(data.sequences[i]) - 1 for window in plan
                    for mb in window[r] for i in mb) for r in (0, 1)]
    return per_rank[1] / per_rank[0]


def _length_count_factor(step: int) -> float:
    """The gradient's scale on window ``step`` when N counts len(sequence)
    instead of the supervised positions (len - 1): N / (N + sequences)."""
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    window = make_plan(cfg, data, cfg.train.world_size)[step]
    ids = [i for rank in window for mb in rank for i in mb]
    right = sum(len(data.sequences[i]) - 1 for i in ids)
    return right / (right + len(ids))


def _masked_tokens(prompt: int) -> int:
    from course_lib.core.data import IGNORE_INDEX, collate, make_plan
    from course_lib.core.model import count_tokens
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    ids = make_plan(cfg, data, cfg.train.world_size)[0][0][0]
    _, labels = collate(data, ids)
    labels[:, :prompt] = IGNORE_INDEX
    return int(count_tokens(labels))


# 09 exercise: the scenarios of configs/exercise.yaml, and the modes it runs.
_EXERCISE_PAIRS = ("balanced/global_token", "balanced/mean_of_means",
                   "skewed/global_token", "skewed/mean_of_means")
# exercise.2's run: rank 1 one token above rank 0, written under runs/course/.
_ONE_OFF = "exercise-12-13"


def _exercise_counts() -> tuple[dict[str, tuple[int, ...]], tuple[float, ...]]:
    from course_lib.course.api import load_config

    ex = load_config(paths.config_path("exercise")).exercise
    assert ex is not None  # configs/exercise.yaml has an exercise section
    return {sc.name: tuple(sc.tokens) for sc in ex.scenarios}, tuple(ex.per_token_loss)


def _exercise_mean(scenario: str, scheme: str) -> float:
    """The hand example's mean of one scenario, from the config."""
    from course_lib.core import arithmetic

    counts, losses = _exercise_counts()
    tokens = counts[scenario]
    sums = [n * x for n, x in zip(tokens, losses, strict=True)]
    if scheme == "global":
        return arithmetic.global_mean(sums, tokens)
    return arithmetic.mean_of_means(sums, tokens)


def _exercise_exact() -> list[str]:
    """The scenario/mode pairs whose token weights are the global 1/N on
    every rank: the gradients that can match the reference."""
    from course_lib.core import arithmetic

    exact = []
    for name, tokens in _exercise_counts()[0].items():
        right = arithmetic.token_weights(tokens, "global")
        for mode, scheme in (("global_token", "global"),
                             ("mean_of_means", "mean_of_means")):
            weights = arithmetic.token_weights(tokens, scheme)
            if all(math.isclose(w, r) for w, r in zip(weights, right, strict=True)):
                exact.append(f"{name}/{mode}")
    return exact


def _exercise_verdict(folder: str, mode: str) -> str:
    """'yes' when the run in runs/course/<folder> passed the gradient check
    in ``mode`` (its first scenario)."""
    from course_lib.jobs.exercise import ExerciseReport

    out = paths.default_out("course") / folder
    if not ExerciseReport.exists(out):
        raise FileNotFoundError(tr("run the exercise's cell first: no {folder} report yet")
                                .format(folder=folder))
    scenario = ExerciseReport.load(out).scenarios[0]
    return "yes" if getattr(scenario.gradients, mode).allclose else "no"


def _empty_rank_fraction() -> float:
    """13 adapting, only rank 0 holding tokens (N = N_0): a rank-0 token
    weighs 1 / (W N_0) in the mean of means, 1 / N in the token mean: the
    ratio is 1 / W, W the chapter's world size."""
    from course_lib.course.api import load_config

    return 1 / load_config().train.world_size


def _rank0_vs_rule(local_tokens: list[int]) -> str:
    """05: a rank-0 token's weight under the mean of means, N / (W N_0), vs 1."""
    ratio = sum(local_tokens) / (len(local_tokens) * local_tokens[0])
    return "the same" if math.isclose(ratio, 1.0) else "more" if ratio > 1 else "less"


@cache
def _window_tokens(world_size: int) -> tuple[int, int]:
    """05, 06: the parity window at this W, as (targets N, sequences R)."""
    from course_lib.core.data import parity_window
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    ids = [i for rank in parity_window(cfg, data, world_size) for mb in rank for i in mb]
    return sum(len(data.sequences[i]) - 1 for i in ids), len(ids)


def _atol_to_pass(report) -> float:
    """05: the smallest atol, at the report's rtol, under which every sampled
    mean-of-means component passes allclose."""
    s = report.grad_sample
    return max(abs(m - r) - report.rtol * abs(r)
               for m, r in zip(s["mean_of_means"], s["reference"], strict=True))


def _shift_scale(world_size: int) -> float:
    """06: length_before_shift's uniform scale N / (N + R) on the parity window."""
    n, r = _window_tokens(world_size)
    return n / (n + r)


def _reseeded_window(update: int) -> Callable[[Any], int]:
    """07: the window (from 0) the re-seeded sampler draws for ``update``; the
    report counts windows from 1."""
    def get(r) -> int:
        first = r.ablations["sampler_from_seed"].first_window_after_resume - 1
        return first + update - (r.resumed_from_step + 1)
    return get


FLOOR_GAP_BANDS = ("under 0.1 nat", "0.1 to 0.5 nat", "over 0.5 nat")


def _floor_gap_band(gap: float) -> str:
    """08: the band of FLOOR_GAP_BANDS that holds the trained model's gap."""
    return FLOOR_GAP_BANDS[0] if gap < 0.1 else FLOOR_GAP_BANDS[1] if gap <= 0.5 \
        else FLOOR_GAP_BANDS[2]


@cache
def _test_targets(count: int) -> int:
    """08: the next-token targets of the first ``count`` test sequences."""
    from course_lib.course.api import corpus, load_config

    data = corpus(load_config())
    return sum(len(data.sequences[i]) - 1 for i in data.splits["test"][:count])


def _shard_size(world_size: int) -> int:
    """08: the sequences DistributedSampler hands each rank of the test split."""
    from course_lib.course.api import corpus, load_config

    return -(-len(corpus(load_config()).splits["test"]) // world_size)


# --- the questions, keyed by the chapter's slug (05_ddp_parity -> ddp_parity) ---------

QUESTIONS: dict[str, Question] = {
    # 01 the mean of means
    "mean_of_means.predict_mom": Question(
        "Rank 0: 12 tokens of loss 1; rank 1: 36 tokens of loss 3. "
        "The mean of the two local means?", "number", 2.0,
        "average the two local means, one per rank"),
    "mean_of_means.predict_global": Question(
        "Same ranks: the mean over all 48 tokens?", "number", 2.5,
        "add every token's loss, then divide by every token"),
    "mean_of_means.1": Question(
        "Rank 0 holds 20 tokens of loss 2, rank 1 holds 80 tokens of loss 1. "
        "The global token mean?", "number", 1.2,
        "every token counts once, whichever rank holds it: what do all the "
        "tokens' losses average to?"),
    "mean_of_means.2": Question(
        "Same ranks: what does the mean of means report?", "number", 1.5,
        "each rank's mean first, then the mean of those"),
    "mean_of_means.3": Question(
        "Same ranks: under the mean of means, how many times heavier is a "
        "rank-0 token than a rank-1 token?", "number", 4.0,
        "a token of rank r weighs 1 / (W * N_r)"),
    "mean_of_means.4": Question(
        "Run arithmetic.token_weights([5, 45], 'mean_of_means'): what does one "
        "rank-0 token weigh?", "number", 0.1,
        "run the call and read the first weight"),
    # 02 the token explorer
    "token_explorer.predict_mom": Question(
        "Theta example: at which theta is the mean-of-means gradient zero?",
        "number", 0.0, "each rank's mean pulls toward its own target, +1 or -1"),
    "token_explorer.predict_global": Question(
        "At which theta is the global gradient zero?", "number", -0.5,
        "the token-weighted average of the targets: 12 of +1, 36 of -1"),
    "token_explorer.1": Question(
        "From the start position (12 tokens of loss 1, 36 of loss 3), raise W "
        "to 3: rank 2 comes in with 24 tokens of loss 2. Predict the bias "
        "(mean of means - global mean), then move the slider to check.",
        "number", lambda: _explorer_bias(3),
        "the mean of means weighs the three ranks alike; the global mean "
        "weighs each by its share of the tokens"),
    "token_explorer.2": Question(
        "Set tokens to [12, 36] and swap the losses to [3, 1] in the explorer. "
        "The bias (mean of means - global mean)?", "number", 0.5,
        "the mean of means does not see the swap; the global mean now gives "
        "the low loss three times the say of the high one"),
    "token_explorer.3": Question(
        "Theta example with 12 targets on each rank: where is the global "
        "gradient zero?", "number", 0.0, "balanced counts: both objectives agree"),
    "token_explorer.4": Question(
        "Theta example, rank 1 keeps its 36 targets -1: how many targets +1 "
        "must rank 0 hold for the global gradient to vanish at theta = -0.2? "
        "Derive it, then check with widgets.ThetaExplorer(counts=(n, 36)).",
        "number", lambda: _targets_for_optimum(-0.2),
        "where the global gradient vanishes, theta is the token-weighted "
        "average of the targets"),
    # 03 data and plan
    "data_and_plan.predict_ratio": Question(
        "Both ranks draw the same number of sequences per window, rank 0 from "
        "lengths 16-64 and rank 1 from 65-128. Over the whole plan, how many "
        "times as many supervised tokens as rank 0 does rank 1 hold? (within "
        "10% counts)", "number", _plan_token_ratio,
        "same number of sequences on both ranks: compare a typical length "
        "of each band", rel_tol=0.1),
    "data_and_plan.1": Question(
        "A sequence of 50 tokens: how many supervised next-token positions?",
        "number", 49, "the first token is never a target"),
    "data_and_plan.2": Question(
        "Sequences of lengths 10, 20 and 30 padded into one microbatch: how "
        "many label cells does it have?", "number", 87,
        "rows times the widest row's number of targets"),
    "data_and_plan.3": Question(
        "Suppose N counted len(sequence) per sequence instead of its supervised "
        "positions. On step 0's window (both ranks), by what factor would "
        "every gradient be scaled? Compute it from the plan.", "number",
        lambda: _length_count_factor(0),
        "the loss sums do not change, only N does; how many sequences "
        "does the window hold?"),
    "data_and_plan.4": Question(
        "Run window_tokens on plan[3] for every rank: what is N for step 3?",
        "number", lambda: _plan_tokens(3), "sum the two ranks' counts"),
    # 04 the global denominator
    "global_denominator.predict": Question(
        "The 12/36 example: 2.5 is right. With an extra / accumulation "
        "(2 microbatches), what does DDP's average become?", "number", 1.25,
        "N already covers both microbatches: what does dividing again do?"),
    "global_denominator.1": Question(
        "W = 4 ranks and N = 400 tokens in the window: by what factor does "
        "each rank multiply its loss sum S_r?", "number", 0.01,
        "the factor undoes DDP's average over ranks, then divides by the "
        "window's count"),
    "global_denominator.2": Question(
        "3 microbatches per window and an extra / accumulation: what fraction "
        "of the right gradient do you get?", "number", 1 / 3,
        "the direction is right; only the length changes"),
    "global_denominator.3": Question(
        "A window of 4 microbatches. A rank runs every forward outside "
        "no_sync(), and the backwards of the first 3 inside it. How many of "
        "the 4 backwards synchronise the gradients across ranks?", "number", 4,
        "where does DDP prepare its reduction, and where does each forward "
        "run?"),
    "global_denominator.4": Question(
        "Run ddp_average('global_token', extra_divisor=4): the ratio "
        "|trap| / |reference|?", "number", 0.25, "print trap.norm() / ref.norm()",
        rel_tol=1e-3),
    # 05 DDP parity
    "ddp_parity.1": Question(
        "With rtol = 0, what is the smallest atol that lets the mean of means "
        "pass? Read it from the report.", "number",
        _from("course_lib.jobs.parity:ParityReport", lambda p: p.control_mode.max_abs_err),
        "with rtol = 0 every component needs |err| <= atol", rel_tol=0.05),
    "ddp_parity.predict": Question(
        "Rank 0 holds the window's short sequences, rank 1 its long ones. Under "
        "the mean of means, does a rank-0 token weigh more, less or the same as "
        "under the token rule?", "choice",
        _from("course_lib.jobs.parity:ParityReport",
              lambda p: _rank0_vs_rule(p.local_tokens)),
        "a rank's mean divides by its own count: is rank 0's count above or "
        "below an even share of N?", options=("more", "less", "the same")),
    "ddp_parity.2": Question(
        "Launch the by-hand script with --nproc-per-node=3: how many tokens N "
        "does its parity window hold?", "number", lambda: _window_tokens(3)[0],
        "every rank takes its own share of the window: read what the script "
        "prints"),
    "ddp_parity.3": Question(
        "With no_sync() around the backward only, would parity fail?", "choice",
        "no", "averaging is linear: what changes is when ranks talk",
        options=("yes", "no")),
    "ddp_parity.4": Question(
        "Keep rtol = 1e-4 and raise atol only: on the components sampled in "
        "report.grad_sample, the smallest atol that lets the mean of means "
        "pass?", "number",
        _from("course_lib.jobs.parity:ParityReport", _atol_to_pass),
        "solve the allclose inequality for atol, one component at a time: the "
        "worst component decides", rel_tol=0.05),
    # 06 the bug lab
    "bug_lab.predict_no_sync_backward_only": Question(
        "no_sync() around the backward only: which checks catch it?", "choices",
        ("uneven_microbatches", "no_sync"), "is the gradient wrong, or only the "
        "communication? And when one rank makes more microbatches than the other?",
        options=_check_names),
    "bug_lab.predict_count_never_reset": Question(
        "A token count never reset between windows: which checks catch it?",
        "choices", ("trajectory",), "which checks look past the first window?",
        options=_check_names),
    "bug_lab.predict_forgot_world_size": Question(
        "W forgotten (each rank backprops S_r / N): which checks catch it?",
        "choices", _from("course_lib.jobs.audit:BugsReport",
                         lambda b: tuple(b.steps["forgot_world_size"].caught_by)),
        "a uniform 1/W: which comparisons see a change of scale, and which "
        "compare layouts at the same W?", options=_check_names),
    "bug_lab.1": Question(
        "At W = 4 the parity window holds other sequences. Read it with "
        "parity_window(cfg, corpus, 4): by what factor does length_before_shift "
        "scale the gradient there?", "number", lambda: _shift_scale(4),
        "the same count as in the chapter, on the W = 4 window", rel_tol=1e-4),
    "bug_lab.2": Question(
        "Why does mean_of_means pass accumulation_invariance?", "choice",
        "whole-window count",
        "what does each rank divide by, a microbatch's count or its window's?",
        options=("whole-window count", "loose tolerance", "luck")),
    "bug_lab.3": Question(
        "Audit a step that backprops W * S_r / N with no no_sync() at all: "
        "which checks fail?", "choices", ("uneven_microbatches", "no_sync"),
        "write it with %%writefile and run course_lib.audit on it",
        options=_check_names),
    "bug_lab.4": Question(
        "Suppose world_size_invariance also compared W = 8, and two steps in "
        "the middle of the catalog deadlocked on uneven microbatches: how many "
        "torchrun launches would course_lib.bugs make at W = 2?", "number", 7,
        "which jobs share the first launch, which world sizes need their own, "
        "and what must happen after a launch dies on a deadlock?"),
    # 07 checkpoint and resume
    "checkpoint_resume.predict": Question(
        "Which ablations change the parameters at step 100?", "choices",
        ("weights_only", "no_optimizer_state", "sampler_from_seed", "no_rng_state"),
        "for each piece, ask whether the updates after step 50 read it",
        options=("weights_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state")),
    "checkpoint_resume.1": Question(
        "Set the model's dropout to 0 (dataclasses.replace on cfg.model), then "
        "run stop_and_continuous and resume_check in a scratch folder: which "
        "ablations still change the parameters at step 100?", "choices",
        ("weights_only", "no_optimizer_state", "sampler_from_seed"),
        "which piece of state did only the dropout masks read?",
        options=("weights_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state")),
    "checkpoint_resume.2": Question(
        "Counting windows from 0: which window does the sampler_from_seed "
        "ablation draw for update 80 (the continuous run draws window 79)?",
        "number", _from("course_lib.jobs.resume:ResumeReport", _reseeded_window(80)),
        "a re-seeded sampler starts its sequence over at the resume: count the "
        "updates since then"),
    "checkpoint_resume.3": Question(
        "A checkpoint of an 8-rank run: how many files does its folder hold?",
        "number", 12, "which files are written once per checkpoint, and which "
        "once per rank?"),
    "checkpoint_resume.4": Question(
        "Copy step-0025 and step-0050 of the run's checkpoints/ into "
        "scratch/checkpoints/, then cut the copy of step-0050's optimizer.pt "
        "to half its size. Which checkpoint does "
        "checkpoint.latest_valid(scratch) return?", "choice", "step-0025",
        "what does the manifest vouch for, and what does latest_valid do when "
        "the newest checkpoint fails?",
        options=("step-0025", "step-0050", "none")),
    # 08 evaluation
    "evaluation.predict": Question(
        "After 100 updates, how far above the entropy floor will the trained "
        "model's test loss sit?", "choice",
        _from("course_lib.course.api:EvaluationReport",
              lambda e: _floor_gap_band(e.above_floor_by)),
        "a small model, a first-order source and 100 SGD updates: how much of "
        "the gap from the untrained loss can it close?", options=FLOOR_GAP_BANDS),
    "evaluation.predict_shard": Question(
        "The test split holds 256 sequences. On 3 ranks, how many sequences "
        "does DistributedSampler (drop_last=False) hand each rank?", "number",
        lambda: _shard_size(3),
        "every rank runs the same number of samples, and none is left out"),
    "evaluation.1": Question(
        "If every transition row of the source were uniform over the 32 "
        "symbols, what would its entropy floor be, in nats per token?", "number",
        math.log(32), "the floor averages each row's entropy over the states",
        rel_tol=1e-3),
    "evaluation.2": Question(
        "Read evaluation.json: how many nats above the entropy floor is the "
        "trained model?", "number",
        _from("course_lib.course.api:EvaluationReport", lambda e: e.above_floor_by),
        "loss per token minus the floor", rel_tol=0.02),
    "evaluation.3": Question(
        "Count them from the corpus: how many next-token targets do the first "
        "128 test sequences hold (corpus.splits['test'][:128])?", "number",
        lambda: _test_targets(128),
        "a sequence's targets are its tokens after the first"),
    "evaluation.4": Question(
        "On a large test set, can a model's loss sit well below the entropy "
        "floor?", "choice", "no", "what does the floor bound?",
        options=("yes", "no")),
    "evaluation.5": Question(
        "Evaluate the same checkpoint on 2 ranks (world_size=2). Which of the "
        "two wrong combinations still differs from the one-process value?",
        "choice", "mean of rank means",
        "does 2 divide 256? and do the even and the odd positions of the test "
        "split hold the same loss per token?",
        options=("repeats kept", "mean of rank means", "both", "neither")),
    # 09 the exercise
    "exercise.predict_mom": Question(
        "The skewed scenario (12 and 36 tokens, losses 1 and 3 per token): the "
        "mean of means?", "number",
        lambda: _exercise_mean("skewed", "mean_of_means"),
        "one mean per rank, then their average"),
    "exercise.predict_global": Question(
        "Same scenario: the global token mean?", "number",
        lambda: _exercise_mean("skewed", "global"),
        "every token counts once: which rank holds most of them?"),
    "exercise.predict_pass": Question(
        "Which of the four gradients will match the single-process reference "
        "(scenario/mode)?", "choices", lambda: _exercise_exact(),
        "a mode is exact when it gives every token the same weight, 1 / N: "
        "what does each rank's count do to a token's weight in each mode?",
        options=_EXERCISE_PAIRS),
    "exercise.predict_change": Question(
        "Rank 1 goes from 12 to 36 tokens. In W * S_r / N, what changes?",
        "choice", "change N", "count the ranks, then the tokens",
        options=("change W", "change N", "divide again")),
    "exercise.1": Question(
        "Rank 1 grows to 60 tokens (rank 0 keeps 12; losses 1 and 3). The "
        "global mean?", "number", 192 / 72,
        "weigh each rank's per-token loss by its share of all the tokens"),
    "exercise.2": Question(
        "Run the exercise with rank 1 at 13 tokens, one more than rank 0: "
        "does the mean of means pass the gradient check?", "choice",
        lambda: _exercise_verdict(_ONE_OFF, "mean_of_means"),
        "the check forgives rounding, not a change of weight: do a token's "
        "two weights still agree when the counts differ by one?",
        options=("yes", "no")),
    "exercise.3": Question(
        "Both ranks hold the same two microbatches, of 12 and 36 tokens. A step "
        "that divides each microbatch's sum by its own count: does it pass "
        "the gradient check?", "choice", "no",
        "equal ranks are not equal microbatches: what does a token of the "
        "short microbatch weigh next to one of the long one?",
        options=("yes", "no")),
    # 10 production recipes
    "production_recipes.predict": Question(
        "Which recipes train the global token mean, leaving exactly the "
        "reference gradient whatever the token counts?", "choices",
        lambda: _exact_recipes(),
        "an exact recipe weighs every token 1/N on every window: which "
        "backprop and reduction pairs give W * S / N after DDP's average?",
        options=_recipe_names),
    "production_recipes.1": Question(
        "64 unmasked rows of 512 tokens (511 labels each after the shift): by "
        "what factor does HF 4.46.3-5.9 with average_tokens_across_devices "
        "on scale the gradient?", "number", 511 / 512,
        "N' counts the labels before the shift and the loss uses them after "
        "it: how many labels does each row lose? The factor is N / N'.",
        rel_tol=1e-6),
    "production_recipes.2": Question(
        "torchtitan #2206 on pure DDP over 8 ranks, SGD (momentum 0.9) at lr "
        "0.05: which lr gives exactly the updates of the exact gradient at "
        "0.05?", "number", 0.4,
        "with SGD, multiplying every gradient by c moves the weights as "
        "multiplying the learning rate by c would: what c does pure DDP add, "
        "and what undoes it?", rel_tol=1e-4),
    "production_recipes.3": Question(
        "One microbatch holds no supervised token but the window does: which "
        "recipe turns every rank's gradient into NaN?", "choice",
        "megatron_pre_clamp",
        "look for a recipe that divides a multiplicatively masked sum by a "
        "count that can be 0", options=("fairseq", "hf_trainer_le_4_45",
                                        "megatron_default", "megatron_pre_clamp",
                                        "megatron_per_token")),
    "production_recipes.4": Question(
        "Run the recipes on 4 ranks: the measured factor of "
        "hf_trainer_avg_tokens?", "number", lambda: _avg_tokens_factor(4),
        "run the cell with world_size=4, then read the factor of "
        "hf_trainer_avg_tokens (N and R are in its skewed regime)", rel_tol=1e-5),
    "production_recipes.5": Question(
        "Which check catches hf_trainer_4_46_0 and torchtitan_ddp but none of "
        "the mean-of-microbatch-means recipes?", "choice", "world_size_invariance",
        "run every check, then compare the failed checks of hf_trainer_4_46_0 "
        "with those of lightning", options=("trajectory", "accumulation_invariance",
                                            "world_size_invariance",
                                            "permutation_invariance", "no_sync")),
    # 11 framework_audit
    "framework_audit.predict": Question(
        "With the versions installed here, which configurations train the "
        "global token mean?", "choices", lambda: _exact_configurations(),
        "for each, ask what the loss divides by: the window's N over every "
        "rank, counted after the shift, or something local or per microbatch? "
        "The model class matters on transformers >= 5.10.1.",
        options=tuple(AUDITED)),
    "framework_audit.1": Question(
        "16 rows over 2 ranks: 10 start with a masked prompt, 6 are supervised "
        "from their first label; after the shift the loss uses N = 1,200 "
        "labels. By what factor does a GPT-2 on transformers >= 5.10.1, with "
        "the flag on, scale the gradient?", "number", 1200 / 1206,
        "which rows hand the count a label that the shifted loss never uses?",
        rel_tol=1e-6),
    "framework_audit.2": Question(
        "With average_tokens_across_devices off, a Llama trains the mean of rank "
        "means: how many times the token mean's weight does each of rank 0's "
        "tokens get?", "number",
        _from("course_lib.jobs.frameworks:FrameworksReport", _rank0_weight),
        "compare what one rank-0 token weighs in each objective: who divides "
        "by the rank's own count, who by the window's?", rel_tol=1e-6),
    "framework_audit.3": Question(
        "A Llama on transformers 4.50, a version the matrix never ran; the "
        "config leaves average_tokens_across_devices at its default. Which "
        "formula does the gradient match?", "choice",
        lambda: _default_flag_formula("4.50.0", "llama"),
        "first: what was the flag's default before 4.54? Then: does 4.50 "
        "count the labels before or after the shift?", options=_candidate_names),
    "framework_audit.4": Question(
        "Audit the Trainer whose compute_loss returns the model's mean loss "
        "(make_mean_trainer): which formula does its gradient match?", "choice",
        _from("course_lib.jobs.frameworks:FrameworksReport",
              lambda r: r.rows[0].matches, "audit-trainer-make_mean_trainer"),
        "run the audit_trainer cell on make_mean_trainer, then read 'matches'",
        options=_candidate_names),
    # 12 choose the unit
    "choose_the_unit.predict": Question(
        "Two completions with the same per-token loss, of 10 and 40 tokens. Under "
        "the sequence mean, a token of the long one weighs what fraction of a "
        "token of the short one?", "number", 0.25,
        "each sequence gets the same total weight, shared among its own tokens",
        rel_tol=1e-9),
    "choose_the_unit.1": Question(
        "On the parity window, trl_grpo_dr_grpo's gradient is the advantage-"
        "weighted token mean's times what factor? Derive it before you read the "
        "RL table.", "number", lambda: _dr_grpo_factor(2),
        "both sum A l; one divides by the window's supervised tokens, the other "
        "by every completion of the window at the maximum completion length",
        rel_tol=1e-6),
    "choose_the_unit.2": Question(
        "Dr. GRPO's constant: 4 ranks x 2 microbatches x 8 completions, at most 512 "
        "tokens each. Which C must every rank and microbatch use?", "number",
        4 * 2 * 8 * 512, "C is the whole optimizer step's batch, in completions, "
        "times the maximum completion length", rel_tol=1e-9),
    "choose_the_unit.3": Question(
        "At PaLM's strength, zloss:0.0001, in float32: which checks catch "
        "zloss_mean_per_microbatch?", "choices", ("trajectory", "uneven_microbatches"),
        "audit it with objective='zloss:0.0001' and every check; a small term "
        "hides inside one gradient's rounding: which checks look further?",
        options=_check_names),
    "choose_the_unit.4": Question(
        "With a token budget of 256 padded tokens instead of 384, how many "
        "microbatches does rank 1 make on the parity window?", "number",
        lambda: _uneven_counts(256)[1],
        "run uneven_layout(window, corpus, 256) and count rank 1's microbatches: "
        "rows x the longest row may not pass the budget", rel_tol=0),
    "choose_the_unit.5": Question(
        "Packed rows of 128 tokens (document:128): how many documents does the "
        "parity window hold, over both ranks?", "number", lambda: _documents(128),
        "collate the window with packing_of(cfg, 128) and count the "
        "documents of every microbatch with objectives.documents", rel_tol=0),
    # 13 adapting
    "adapting.predict_empty": Question(
        "Two ranks; rank 1's window holds no supervised token, rank 0's does. "
        "The mean of means' gradient is what fraction of the right one?",
        "number", lambda: _empty_rank_fraction(),
        "what does rank 1 hand to DDP's average, and what does the token mean "
        "divide by when rank 1 has no token?"),
    "adapting.1": Question(
        "Two documents: 10 tokens of loss 2 and 30 tokens of loss 1. The "
        "per-token mean?", "number", 1.25,
        "each document weighs as many times as it has tokens"),
    "adapting.2": Question(
        "Same documents: the per-sequence mean?", "number", 1.5,
        "one mean per document, then their average"),
    "adapting.3": Question(
        "W = 3: rank 2's window is empty, ranks 0 and 1 hold the same number "
        "of tokens. The mean of means' gradient is what fraction of the right "
        "one?", "number", 2 / 3,
        "DDP still averages over every rank, the empty one included; the "
        "token mean divides by the tokens only"),
    "adapting.4": Question(
        "Set prompt_tokens = 20 in section 2 and re-run it: what does "
        "model.count_tokens give?", "number", lambda: _masked_tokens(20),
        "re-run the cell with the new parameter"),
    # 14 capstone
    "capstone.predict": Question(
        "Read the script's four functions: how many of the grader's eight "
        "properties will it pass?", "number",
        _from("course_lib.jobs.capstone:CapstoneReport",
              lambda r: len(r.properties) - len(r.failed)),
        "each bug breaks the properties that compare what it changes: which "
        "part of the script does what the course taught?"),
    "capstone.1": Question(
        "A window on 4 ranks holds 30, 10, 50 and 10 supervised tokens. Under the "
        "mean of means, how many times heavier is a token of a 10-token rank than "
        "one of the 50-token rank?", "number", 5,
        "a token of rank r weighs 1 / (W N_r)"),
    "capstone.2": Question(
        "A window holds 100 supervised tokens and 20 padded slots, and the count "
        "takes labels.numel(). By what factor is every gradient off?", "number",
        100 / 120, "the loss sums only the supervised tokens; what does N divide by?"),
    "capstone.3": Question(
        "An evaluation of 1,001 sequences on 8 ranks with DistributedSampler "
        "(drop_last=False): how many sequences does it score twice?", "number",
        _repeats(1001, 8), "the sampler pads the list until 8 divides it"),
    "capstone.4": Question(
        "In a copy of the script, fix only step's count: N as the supervised "
        "labels, all-reduced over the ranks, the rest of step as it is. Grade it: "
        "which of the step's five properties still fail?", "choices",
        ("parity", "trajectory", "accumulation_invariance"),
        "what is left in step: a factor the same on every rank, or one per rank? "
        "and does it depend on the number of microbatches?",
        options=("parity", "trajectory", "accumulation_invariance",
                 "permutation_invariance", "no_sync")),
}
