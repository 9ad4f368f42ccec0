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
from course_lib.core.verdicts import Verdict as Measured
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


def _check_names() -> tuple[str, ...]:
    from course_lib.checks import NAMES

    return NAMES


# 05 bug_lab: the checks that compare a step with itself, never with the reference
REFERENCE_FREE = ("accumulation_invariance", "world_size_invariance",
                  "permutation_invariance", "no_sync")
# 05 bug_lab: what a step does when the ranks make different numbers of microbatches
UNEVEN_OUTCOMES = ("right gradient", "wrong gradient", "hang")
# 05 bug_lab: why padding_counted passes world_size_invariance
PADDING_W_CANCELS = "W cancels in W * S_r / N' as in the rule"
PADDING_SAME = "every W forms the same microbatches"
PADDING_AVERAGED = "DDP's mean averages the padding away"
PADDING_SMALL = "N' is too close to N to be seen"


def _representative() -> tuple[str, ...]:
    """The recipes chapter 08 reads before it runs them."""
    from course_lib.steps.recipes import REPRESENTATIVE

    return REPRESENTATIVE


def _exact_recipes() -> list[str]:
    from course_lib.steps.recipes import trains_the_token_mean

    return [name for name in _representative() if trains_the_token_mean(name)]


def _default_flag_formula(version: str, model: str) -> str:
    """What the table of readings says a Trainer of ``version`` trains when
    the config leaves average_tokens_across_devices at its default."""
    from course_lib.frameworks.expected import expected

    formula = expected("hf", version, model, {})
    assert formula is not None  # a version with a formula, not 4.46.2
    return formula


def _candidate_names() -> tuple[str, ...]:
    from course_lib.frameworks.candidates import CANDIDATES

    return tuple(c.name for c in CANDIDATES)


# 08: the candidates collinear with the token mean within a window (c g*)
_SCALED_FORMULAS = ("counted before the shift", "token mean without 1/M",
                    "token mean times 1/W")


def _trainer_verdict(model: str) -> str:
    """08: the verdict the table of readings predicts for the installed
    Trainer on ``model``, average_tokens_across_devices on (before the run)."""
    from course_lib.frameworks import installed
    from course_lib.frameworks.expected import expected

    version = installed("transformers")
    if version is None:
        raise FileNotFoundError("transformers is not installed")
    formula = expected("hf", version, model, {"average_tokens_across_devices": True})
    if formula is None:  # 4.46.2: no_sync inverted
        return Measured.RANKS_DISAGREE.value
    if formula == "token mean":
        return Measured.EXACT.value
    scaled = formula in _SCALED_FORMULAS
    return (Measured.SCALED if scaled else Measured.BIASED).value


@cache
def _length_bias(world_size: int = 2) -> float:
    """09: under the sequence mean, what a token of the parity window's
    shortest sequence weighs over one of its longest: a token of sequence s
    weighs 1 / (K n_s), so the ratio is the longest count over the shortest."""
    from course_lib.core.data import parity_window
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    counts = [len(data.sequences[i]) - 1 for rank in parity_window(cfg, data, world_size)
              for mb in rank for i in mb]
    return max(counts) / min(counts)


@cache
def _document_weight_ratio(width: int, world_size: int = 2) -> float:
    """09: under rows_as_documents (the sequence rule on packed rows of
    ``width``), the parity window's heaviest document over its lightest."""
    from course_lib.core import objectives
    from course_lib.core.data import collate, parity_window
    from course_lib.course.api import corpus, load_config
    from course_lib.rank.harness import packing_of

    cfg = load_config()
    data = corpus(cfg)
    packing = packing_of(cfg, width)
    labels = [collate(data, ids, packing=packing)[1]
              for rank in parity_window(cfg, data, world_size) for ids in rank]
    weights = objectives.token_weights(objectives.parse("sequence"), labels)
    found = []
    for w, lb in zip(weights, labels, strict=True):
        doc_of, n_docs = objectives.documents(lb)
        found += [float(w[doc_of == d].sum()) for d in range(n_docs)]
    return max(found) / min(found)


def _largest_window_bias(per_token: tuple[float, ...]) -> float:
    """The largest mean of means - token mean over the windows of the 2-rank
    plan, when every supervised token of rank r has the loss ``per_token[r]``."""
    from course_lib.core import arithmetic
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    biases = []
    for window in make_plan(cfg.with_world_size(2), data, 2):
        counts = [sum(len(data.sequences[i]) - 1 for mb in rank for i in mb)
                  for rank in window]
        sums = [n * x for n, x in zip(counts, per_token, strict=True)]
        biases.append(arithmetic.mean_of_means(sums, counts)
                      - arithmetic.global_mean(sums, counts))
    return max(biases)


def _explorer_balance(world_size: int) -> int:
    """The token explorer with its default counts and losses for the first
    ``world_size`` ranks: the count of rank 0 at which the bias (mean of
    means - global) vanishes, searched over whole counts."""
    from course_lib.core import arithmetic
    from course_lib.core.arithmetic import DEFAULT_LOSSES, DEFAULT_TOKENS

    def bias(n: int) -> float:
        counts = [n, *DEFAULT_TOKENS[1:world_size]]
        sums = [c * x for c, x in zip(counts, DEFAULT_LOSSES, strict=False)]
        return arithmetic.mean_of_means(sums, counts) - arithmetic.global_mean(sums, counts)

    return next(n for n in range(1, 1000) if abs(bias(n)) < 1e-12)


def _targets_for_optimum(theta: float, others: int = 36) -> float:
    """How many +1 targets rank 0 needs, beside ``others`` targets -1 on rank 1,
    for the global mean's gradient to vanish at ``theta``: there theta is the
    token-weighted mean of the targets, (n - others) / (n + others)."""
    return others * (1 + theta) / (1 - theta)


def _plan_token_ratio(world_size: int = 2, top: int | None = None,
                      bottom: int = 0) -> float:
    """Rank ``top``'s supervised tokens (the last rank by default) over rank
    ``bottom``'s, summed over the whole plan of ``world_size`` ranks."""
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config().with_world_size(world_size)
    data = corpus(cfg)
    plan = make_plan(cfg, data, world_size)
    top = world_size - 1 if top is None else top
    per_rank = [sum(len(data.sequences[i]) - 1 for window in plan
                    for mb in window[r] for i in mb) for r in (bottom, top)]
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


LOSS_GAP_BANDS = ("under 0.05 nat", "0.05 to 0.3 nat", "over 0.3 nat")


def _loss_gap_band(report) -> str:
    """04: the band of |mean of means - global mean| of the untrained model's
    losses on the exercise's skewed scenario."""
    m = report.scenario("skewed").model
    gap = abs(m.mean_of_means - m.global_mean)
    return LOSS_GAP_BANDS[0] if gap < 0.05 else LOSS_GAP_BANDS[1] if gap <= 0.3 \
        else LOSS_GAP_BANDS[2]


@cache
def _rank_tokens(world_size: int) -> tuple[int, ...]:
    """04: each rank's supervised targets N_r on the parity window at this W."""
    from course_lib.core.data import parity_window
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    return tuple(sum(len(data.sequences[i]) - 1 for mb in rank for i in mb)
                 for rank in parity_window(cfg, data, world_size))


def _mom_weight(rank: int, world_size: int) -> float:
    """04: a token of ``rank`` under the mean of means weighs 1 / (W N_r); in
    units of its due 1 / N, that is N / (W N_r)."""
    counts = _rank_tokens(world_size)
    return sum(counts) / (world_size * counts[rank])


def _overweighted(world_size: int) -> list[str]:
    """04: the ranks whose tokens the mean of means over-weights, N_r < N / W."""
    counts = _rank_tokens(world_size)
    return [f"rank {r}" for r, n in enumerate(counts) if n * world_size < sum(counts)]


def _atol_to_pass(report) -> float:
    """04: the smallest atol, at the report's rtol, under which every sampled
    mean-of-means component passes allclose."""
    s = report.grad_sample
    return max(abs(m - r) - report.rtol * abs(r)
               for m, r in zip(s.mean_of_means, s.reference, strict=True))


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


def _padding(world_size: int) -> int:
    """05: the empty microbatches pad_to_longest_rank runs, over every rank, on
    the parity window re-batched by uneven_microbatches' budget."""
    from course_lib.checks.uneven import MAX_TOKENS

    counts = _uneven_counts(MAX_TOKENS, world_size)
    return sum(max(counts) - c for c in counts)


def _join_alone_scale() -> float:
    """05: rank 1's scale along the reference when Join divides by the ranks
    still running. Rank 0 holds A, what was synced when it ran out; rank 1
    adds its last microbatches h whole (divided by 1), the reference holds
    them halved: rank 1 = A + h = 2 * (A + h / 2) - A, so its scale is 2
    minus rank 0's, read from the chapter's join_every_microbatch."""
    import torch

    from course_lib.checks.uneven import result_path

    path = result_path(paths.default_out("course"), "join_every_microbatch")
    if not path.exists():
        raise FileNotFoundError(tr("run the chapter's job first: no {name} yet")
                                .format(name="audit/uneven/join_every_microbatch.pt"))
    saved = torch.load(path, weights_only=True)
    g, ref = saved["grads"][0].double(), saved["reference"].double()
    return 2 - float(g @ ref / (ref @ ref))


def _reseeded_window(update: int) -> Callable[[Any], int]:
    """06: the window (from 0) the re-seeded sampler draws for ``update``. A
    checkpoint saved after the re-seeding keeps the re-seeded sampler, so a
    full resume from it goes on counting."""
    def get(r) -> int:
        first = r.ablations["sampler_from_seed"].first_window_after_resume
        return first + update - (r.resumed_from_step + 1)
    return get


def _hf_train_loss() -> float:
    """07: the Trainer's logged training loss on the skewed window, with
    average_tokens_across_devices, as the committed data/frameworks-logging.json
    measured it (the Llama model)."""
    from course_lib.jobs.frameworks_logging import LoggingData

    return LoggingData.committed().run.row(
        "hf", "train loss", "average_tokens_across_devices=True", model="llama").value


def _train_log(first: int, last: int) -> list[dict[str, Any]]:
    """07: every rank's log line of updates ``first`` to ``last`` in the
    chapters' run (logs/train-rank<R>.jsonl)."""
    import json

    found = []
    for path in sorted((paths.default_out("course") / "logs").glob("train-rank*.jsonl")):
        found += [rec for rec in map(json.loads, path.read_text().splitlines())
                  if rec["event"] == "step" and first <= rec["step"] <= last]
    if len({rec["step"] for rec in found}) != last - first + 1:
        raise FileNotFoundError(tr("run chapter 06 first: no training log yet"))
    return found


def _logged_token_mean(first: int, last: int) -> float:
    """07: the token mean of updates ``first`` to ``last`` taken together."""
    lines = _train_log(first, last)
    return sum(r["local_loss_sum"] for r in lines) / sum(r["local_tokens"] for r in lines)


@cache
def _repeats_kept_loss(world_size: int) -> float:
    """07: the test loss per token of the chapters' step-100 model on
    ``world_size`` ranks, the ranks' [loss sum, tokens, correct] added with
    DistributedSampler's repeats kept."""
    import torch

    from course_lib.core import checkpoint
    from course_lib.core.evaluate import score, shard
    from course_lib.core.model import build_model
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    final = checkpoint.step_dir(paths.default_out("course"), cfg.train.updates)
    if not final.is_dir():
        raise FileNotFoundError(tr("run chapter 06 first: no training log yet"))
    model = build_model(cfg)
    model.load_state_dict(checkpoint.load_params(final))
    test = data.splits["test"]
    total = torch.zeros(3, dtype=torch.float64)
    for rank in range(world_size):
        positions, _ = shard(len(test), world_size, rank)
        total += score(model, data, [test[p] for p in positions]).totals()
    return float(total[0] / total[1])


def _stationary_entropy() -> float:
    """07: the expected loss of a model that always predicts the source's
    stationary distribution: its entropy H(pi)."""
    from course_lib.course.api import corpus, load_config

    return -sum(p * math.log(p) for p in corpus(load_config()).source.stationary if p > 0)


@cache
def _test_targets(count: int) -> int:
    """07: the next-token targets of the first ``count`` test sequences."""
    from course_lib.course.api import corpus, load_config

    data = corpus(load_config())
    return sum(len(data.sequences[i]) - 1 for i in data.splits["test"][:count])


def _shard_size(world_size: int) -> int:
    """07: the sequences DistributedSampler hands each rank of the test split."""
    from course_lib.core.evaluate import shard
    from course_lib.course.api import corpus, load_config

    return len(shard(len(corpus(load_config()).splits["test"]), world_size, 0)[0])


# --- the questions, keyed by the chapter's slug (04_ddp_parity -> ddp_parity) ---------

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
        "Rank 0 holds 20 tokens of loss 2; every token of rank 1 has loss 1. "
        "How many tokens must rank 1 hold for the mean of means to exceed the "
        "global token mean by exactly 0.3?", "number", 80,
        "which of the two means moves when rank 1's count changes? Find the "
        "global mean that the gap asks for, then the count that gives it"),
    "mean_of_means.2": Question(
        "From the start position (12 tokens of loss 1, 36 of loss 3), raise W "
        "to 3: rank 2 comes in with 24 tokens of loss 2. Rank 0 keeps its loss "
        "of 1: how many tokens must it hold for the bias (mean of means - "
        "global mean) to vanish? Derive it, then set the slider to check.",
        "number", lambda: _explorer_balance(3),
        "the counts do not move the mean of means; find the count that brings "
        "the global mean to it"),
    "mean_of_means.3": Question(
        "Four ranks share N = 100 tokens. How many tokens must a rank hold for "
        "one of its tokens to weigh exactly 5 times its global weight under the "
        "mean of means?", "number", 5,
        "write one token's weight under each mean, 1/(W N_r) and 1/N; their "
        "ratio is the factor asked for: solve for N_r"),
    "mean_of_means.predict_gradient": Question(
        "From the two ranks' gradients printed above: the first component of "
        "the gradient of the mean over all 48 tokens?", "number", -0.0625,
        "weight each rank's first component by its share of the tokens, "
        "as for the losses", abs_tol=1e-3),
    # the theta example: same loss, different gradient
    "mean_of_means.predict_theta_mom": Question(
        "Theta example: at which theta is the mean-of-means gradient zero?",
        "number", 0.0, "each rank's mean pulls toward its own target, +1 or -1"),
    "mean_of_means.predict_theta_global": Question(
        "At which theta is the global gradient zero?", "number", -0.5,
        "the token-weighted average of the targets: 12 of +1, 36 of -1"),
    "mean_of_means.4": Question(
        "Theta example, rank 1 keeps its 36 targets -1: how many targets +1 "
        "must rank 0 hold for the global gradient to vanish at theta = -0.2? "
        "Derive n, then check it with widgets.ThetaExplorer(theta=-0.2, "
        "counts=(n, 36)), or without a kernel widgets.theta_state(-0.2, "
        "counts=(n, 36)).",
        "number", lambda: _targets_for_optimum(-0.2),
        "where the global gradient vanishes, theta is the token-weighted "
        "average of the targets"),
    "mean_of_means.5": Question(
        "Theta example: rank 0 keeps its 12 targets +1; rank 1 holds 36 "
        "targets, 18 of them -1 and 18 equal to t. Which t makes the two "
        "ranks' gradients equal at every theta? Set it in the cell and run "
        "it: the losses differ, the gradients agree.", "number", 3.0,
        "a rank's gradient, 2 (theta - its mean target), depends on its "
        "targets only through their mean"),
    # 02 data and plan
    "data_and_plan.predict_ratio": Question(
        "Both ranks draw the same number of sequences per window, rank 0 from "
        "lengths 16-64 and rank 1 from 65-128. Over the whole plan, how many "
        "times as many supervised tokens as rank 0 does rank 1 hold? (within "
        "10% counts)", "number", _plan_token_ratio,
        "same number of sequences on both ranks: compare a typical length "
        "of each band", rel_tol=0.1),
    "data_and_plan.predict_labels": Question(
        "The miniature batch [7, 4, 9] and [5, 2] goes through data.collate. "
        "What is the shape of its labels (rows x columns), and how many of "
        "their cells are supervised tokens?", "choice", "2 x 2 and 3",
        "each label is the next token: which position of a row has none? "
        "Count the targets of each row, then pad to the longer one",
        options=("2 x 3 and 5", "2 x 3 and 3", "2 x 2 and 4", "2 x 2 and 3")),
    "data_and_plan.1": Question(
        "A made-up loss: in every window, each supervised token of rank 0 has "
        "loss 2.0 and each token of rank 1 has loss 1.0. In which of the plan's "
        "windows is the mean of means furthest above the global token mean, and "
        "by how much? Answer the largest gap, computed from the plan's token "
        "counts (per_window).", "number", lambda: _largest_window_bias((2.0, 1.0)),
        "write the gap with N_0 / N: the mean of means gives each rank half the "
        "say, the token mean gives rank r its share N_r / N. Which window "
        "gives rank 0 the smallest share?", rel_tol=0.01),
    "data_and_plan.2": Question(
        "Sequences of lengths 10, 20 and 30 go through data.collate as one "
        "microbatch: what fraction of its label cells is padding?", "number",
        30 / 87, "count the label cells (rows times the widest row's targets), "
        "then the supervised ones (each row's targets)", rel_tol=0.01),
    "data_and_plan.3": Question(
        "Suppose N counted len(sequence) per sequence instead of its supervised "
        "positions. On step 0's window (both ranks), by what factor would the "
        "global token mean, and so its gradient, be scaled? Compute it from "
        "the plan.", "number",
        lambda: _length_count_factor(0),
        "the loss sums do not change, only N does; how many sequences "
        "does the window hold?"),
    "data_and_plan.4": Question(
        "With world_size = 4 the length range 16-128 splits into four even "
        "bands. Over the whole plan, how many times rank 1's supervised tokens "
        "does rank 2 hold? Estimate it from the bands before any run (within "
        "5% counts); then set world_size = 4 in the parameters cell, run the "
        "chapter again and compare.",
        "number", lambda: _plan_token_ratio(4, top=2, bottom=1),
        "same number of sequences on every rank: compare a typical length of "
        "rank 1's band and of rank 2's", rel_tol=0.05),
    # 03 the global denominator
    "global_denominator.predict_factor": Question(
        "Every rank r backprops its loss sum times one factor c, the same on "
        "every rank: L_r = c * S_r. DDP averages the ranks' gradients. Which c "
        "makes that average the gradient of the global token mean, "
        "sum_r S_r / N?", "choice", "W / N",
        "write DDP's average (1 / W) * sum_r of the gradient of c * S_r, and "
        "compare it with the gradient of sum_r S_r / N: what must c * (1 / W) "
        "equal?",
        options=("1 / N_r", "1 / N", "W / N", "1 / (W * N)")),
    "global_denominator.predict": Question(
        "The extra / accumulation (2 microbatches) halves every gradient. SGD "
        "(lr 0.1, momentum 0.9) and Adam (lr 0.1), with neither weight decay "
        "nor clipping, make three updates with the trapped gradients and three "
        "with the right ones, from the same weights. For each optimizer, what "
        "is a trapped update divided by the right one, to two decimals?",
        "choice", "SGD 0.5 and Adam 1",
        "SGD's update is linear in the gradients; Adam divides a running mean "
        "of the gradients by the square root of a running mean of their "
        "squares: what does a constant factor on every gradient do to each?",
        options=("SGD 0.5 and Adam 0.5", "SGD 0.5 and Adam 1",
                 "SGD 1 and Adam 0.5", "SGD 1 and Adam 1")),
    "global_denominator.1": Question(
        "Three ranks share a window. Ranks 0 and 1 hold 300 and 500 supervised "
        "tokens; rank 2 drew only padding (0 supervised tokens), yet it runs "
        "its forwards and backwards and joins DDP's all-reduce. By what factor "
        "must rank 0 multiply its loss sums?",
        "number", 3 / 800,
        "DDP divides by the number of processes in the all-reduce, whatever "
        "they hold; N counts tokens, not ranks", rel_tol=1e-3),
    "global_denominator.2": Question(
        "Plain SGD with lr = 0.1 and weight_decay = 0.1 (torch adds "
        "weight_decay * w to the gradient before the step). One weight, w = 1.0, "
        "whose gradient under the rule is 0.5. With the extra / accumulation of "
        "2 microbatches, the weight's update is what fraction of its update "
        "under the rule?", "number", (0.5 / 2 + 0.1) / (0.5 + 0.1),
        "the trap halves the loss's gradient, not the decay term: write the "
        "update lr * (g + weight_decay * w) for both"),
    "global_denominator.3": Question(
        "A window of 4 microbatches. A rank runs all 4 forwards inside "
        "model.no_sync(), and the backwards of the first 3 inside it too; only "
        "the last backward runs outside. How many of the 4 backwards "
        "synchronise the gradients across ranks?", "number", 0,
        "DDP arms a backward's reduction during the forward, never during the "
        "backward: which of the four forwards armed one?"),
    "global_denominator.4": Question(
        "Plain SGD after clip_grad_norm_(params, max_norm=1.0). Under the rule "
        "the gradient is [0.9, 1.2], of norm 1.5. With the extra / accumulation "
        "of 2 microbatches, the update's length is what fraction of the "
        "update's length under the rule?", "number", 0.75,
        "clipping rescales a gradient only when its norm exceeds max_norm: "
        "clip each of the two gradients first", rel_tol=1e-3),
    # 04 two processes, one gradient: DDP parity and the 12 -> 36 exercise
    "ddp_parity.predict": Question(
        "On the parity window (W = 2), under the mean of means: what multiple "
        "of its due weight 1 / N does a rank-1 token get?", "number",
        lambda: _mom_weight(1, 2),
        "under the mean of means a token of rank r weighs 1 / (W * N_r): how "
        "many times 1 / N is that for rank 1?", rel_tol=0.01),
    "ddp_parity.predict_loss_gap": Question(
        "The skewed scenario (12 and 36 tokens) on the real, untrained model: "
        "how far apart are the mean of means and the global mean of its "
        "losses?", "choice",
        _from("course_lib.jobs.exercise:ExerciseReport", _loss_gap_band),
        "with two ranks the gap is (1/2 - N_0 / N) times the difference of the "
        "two local means: how different are an untrained model's losses per "
        "token on two ranks?", options=LOSS_GAP_BANDS),
    "ddp_parity.1": Question(
        "Launch the by-hand script on 3 ranks (--nproc-per-node=3): its parity "
        "window then holds other sequences. Under the mean of means, the tokens "
        "of which ranks weigh more than their due 1 / N?", "choices",
        lambda: _overweighted(3),
        "a token of rank r weighs 1 / (W * N_r) under the mean of means: "
        "compare each rank's count with an even share, N / W",
        options=("rank 0", "rank 1", "rank 2")),
    "ddp_parity.2": Question(
        "Keep rtol = 1e-4 and raise atol only: on the components sampled in "
        "report.grad_sample, the smallest atol that lets the mean of means "
        "pass?", "number",
        _from("course_lib.jobs.parity:ParityReport", _atol_to_pass),
        "solve the allclose inequality for atol, one component at a time: the "
        "worst component decides", rel_tol=0.05),
    "ddp_parity.3": Question(
        "The 12 -> 36 experiment with rank 1 at 13 tokens, one more than rank "
        "0: does the mean of means pass the gradient check? Decide from a "
        "token's weights, then run it to see.", "choice", "no",
        "the check forgives rounding, not a change of weight: do a token's "
        "two weights still agree when the counts differ by one?",
        options=("yes", "no")),
    "ddp_parity.4": Question(
        "Two ranks join the skewed scenario (12 and 36 tokens), so W = 4, but "
        "their microbatches hold no supervised token (all prompt); they run "
        "their forward and backward like the others. Under the mean of means, "
        "after DDP's sync, what multiple of its due weight 1 / N does a rank-1 "
        "token get?", "number", 1 / 3,
        "an empty rank's loss is 0 / 0 = NaN, but what does its .grad hold? Run "
        "the commented lines; then write what DDP sums, what it divides by, and N",
        rel_tol=0.01),
    "ddp_parity.5": Question(
        "Break the by-hand script: move its forward, s = loss_sum(model, "
        "inputs, labels), out of the with block, so that no_sync() wraps only "
        "the scaling and loss.backward(). On the same two ranks, what does the "
        "broken script print for global_token? Predict, then run it.",
        "choice", "PASS",
        "DDP arms a backward's sync during the forward: which microbatches now "
        "sync, and does averaging again a part that every rank already holds "
        "alike change it?", options=("PASS", "FAIL", "the job hangs")),
    # 05 the bug lab
    "bug_lab.predict_no_sync_backward_only": Question(
        "On the uneven layout (rank 1 makes more microbatches than rank 0), "
        "no_sync() around the backward only: does the step give the right "
        "gradient, a wrong gradient, or hang?", "choice", "hang",
        "which microbatches sync when the forward runs outside no_sync()? Count "
        "each rank's all-reduces: one returns only when every rank has called it",
        options=UNEVEN_OUTCOMES),
    "bug_lab.predict_join_every_microbatch": Question(
        "The same layout, no no_sync() at all, and the loop wrapped in Join: "
        "the right gradient, a wrong gradient, or hang?", "choice",
        "wrong gradient",
        "follow both ranks after rank 0 runs out: does rank 0 ever receive rank "
        "1's last microbatches, and what does each of rank 1's extra syncs do to "
        "what was synced before?",
        options=UNEVEN_OUTCOMES),
    "bug_lab.predict_count_never_reset": Question(
        "A token count never reset between windows: which checks catch it?",
        "choices", ("trajectory",), "which checks look past the first window?",
        options=_check_names),
    "bug_lab.predict_forgot_world_size": Question(
        "W forgotten (each rank backprops S_r / N): of the four checks that "
        "never look at the reference, which catch it?", "choices",
        ("world_size_invariance",),
        "the gradient is the right one times 1/W: which of these comparisons "
        "would see that factor move?", options=REFERENCE_FREE),
    "bug_lab.1": Question(
        "count_never_reset keeps its running count on the model, and trajectory "
        "trains one model for 5 updates. If the first three windows held 2000, "
        "2400 and 1600 supervised tokens, by what factor is the gradient of the "
        "third update off the reference at the same weights?", "number",
        1600 / (2000 + 2400 + 1600),
        "write the N the step divides by at the third update, and the N the "
        "rule divides by", rel_tol=1e-3),
    "bug_lab.2": Question(
        "pad_to_longest_rank at W = 4: re-batch parity_window(cfg, corpus, 4) "
        "with uneven_layout and the chapter's budget. How many empty "
        "microbatches do the four ranks run, all together?", "number",
        lambda: _padding(4),
        "every rank runs as many microbatches as the longest rank: count what "
        "each one lacks", rel_tol=0),
    "bug_lab.3": Question(
        "Log the loss as many training loops do: in your finished "
        "my_step_fixed, after each microbatch's backward, add "
        "dist.all_reduce(s.detach().clone()). Audit it with every check (leave "
        "the list out): which checks fail?", "choices", ("uneven_microbatches",),
        "the logged all-reduce changes no gradient: count the collectives each "
        "rank calls when the ranks make 3 and 6 microbatches",
        options=_check_names),
    "bug_lab.4": Question(
        "Join([model], divide_by_initial_world_size=False) divides each sync "
        "by the ranks still running instead of by W. Derive: with your "
        "my_step_fixed's for loop inside that Join, without no_sync() (the "
        "count's all-reduce and the scaling after it), what is rank 1's scale, "
        "from rank 0's? Then run: audit it with [\"uneven_microbatches\"] and "
        "project each rank's saved gradient on the reference, as the chapter "
        "does.", "number", _join_alone_scale,
        "rank 0 keeps A, what was synced when it ran out; rank 1 then adds its "
        "last three microbatches alone, divided by 1, where the reference "
        "divides every microbatch by W: write both ranks and the reference "
        "from A and those three", rel_tol=1e-3),
    "bug_lab.5": Question(
        "padding_counted divides by N', every label position of the padded "
        "microbatches, instead of N. It fails accumulation_invariance and "
        "permutation_invariance, yet passes world_size_invariance. Why?",
        "choice", PADDING_SAME,
        "its gradient is the reference times N / N': for the check to see it, "
        "N' must change with W. Which microbatches does world_size_layout form "
        "at W = 1, 2 and 4, with 8 sequences each?",
        options=(PADDING_W_CANCELS, PADDING_SAME, PADDING_AVERAGED, PADDING_SMALL)),
    # 06 checkpoint and resume
    "checkpoint_resume.predict": Question(
        "Which of the five resumes change the parameters at step 100?",
        "choices",
        ("model_only", "no_optimizer_state", "sampler_from_seed", "no_rng_state"),
        "for each piece, ask whether the updates after step 50 read it",
        options=("model_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state", "other Python RNG states")),
    "checkpoint_resume.1": Question(
        "Set the model's dropout to 0 and SGD's momentum to 0 "
        "(dataclasses.replace on cfg.model and cfg.train), then run "
        "stop_and_continuous and resume_check in a scratch folder: which "
        "ablations still change the parameters at step 100?", "choices",
        ("model_only", "sampler_from_seed"),
        "which piece of state did only the dropout masks read, and which one "
        "only the momentum? what does each ablation leave out?",
        options=("model_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state")),
    "checkpoint_resume.2": Question(
        "A run resumes from step 50 with its sampler re-seeded, as in "
        "sampler_from_seed, and saves its checkpoints at steps 75 and 100 as "
        "usual. It is stopped after step 75, and a new job resumes from "
        "step-0075 with every part restored. Counting windows from 0 as the "
        "continuous run does (update 1 draws window 0): which window does "
        "update 80 draw?",
        "number", _from("course_lib.jobs.resume:ResumeReport", _reseeded_window(80)),
        "what sampler state did the checkpoint at step 75 save, and which "
        "window had that sampler drawn last?"),
    "checkpoint_resume.3": Question(
        "The run folder holds step-0025 and step-0050, and a restarted job "
        "saves step 50 again. It is killed between final.rename(old) and "
        "tmp.rename(final). The next start resumes from what "
        "checkpoint.latest_valid returns: from which step?", "number", 25,
        "at that moment, what is each folder called, and which names does "
        "latest_valid look at?"),
    "checkpoint_resume.4": Question(
        "The run saves a checkpoint every 25 updates (checkpoint_every) and is "
        "killed during update 73. A new job resumes from what "
        "checkpoint.latest_valid returns. How many of the updates that the "
        "killed job had finished does the new job compute again?", "number", 22,
        "which step-NNNN folders exist when update 73 starts? the new job's "
        "first update is the one after that step; the killed job had finished "
        "every update before 73."),
    # 07 evaluation
    "evaluation.predict_spread": Question(
        "Averaged over the test tokens, how does the trained model's spread "
        "term compare with the untrained model's?", "choice", "spread grows",
        "the spread is also the average of -log p_j over all 32 symbols, p the "
        "softmax: what does a model that is sure of the likely successors "
        "leave to the other symbols?",
        options=("spread shrinks", "spread stays about the same", "spread grows")),
    "evaluation.predict": Question(
        "On 3 ranks, the one-process evaluation's 16,971 test tokens become "
        "how many when the ranks' token counts are added with the sampler's "
        "repeats kept?", "number",
        lambda: _test_targets(256) + _test_targets(2),
        "which positions does the sampler deal twice (the cell above), and "
        "how many next-token targets does each of those sequences hold?"),
    "evaluation.predict_logging": Question(
        "The skewed window, 2 ranks: rank 0's microbatches hold N_0 = 31 "
        "tokens with loss sum S_0 = 180.32, rank 1's N_1 = 56 tokens with "
        "S_1 = 351.07. With average_tokens_across_devices=True, every rank's "
        "num_items_in_batch is 87, the window's tokens over both ranks. "
        "Following the three lines above, what training loss does the Trainer "
        "log?", "number", _hf_train_loss,
        "what does each rank hold once its loss, S_r / 87, is multiplied by "
        "loss_scale = 2? and what does .mean() over the gathered ranks then "
        "do with that 2?", rel_tol=2e-3),
    "evaluation.predict_shard": Question(
        "The test split holds 256 sequences. On 3 ranks, how many sequences "
        "does DistributedSampler (drop_last=False) hand each rank?", "number",
        lambda: _shard_size(3),
        "every rank runs the same number of samples, and none is left out"),
    "evaluation.1": Question(
        "From the course's train logs (logs/train-rank<R>.jsonl in the run "
        "folder): what is the training loss of updates 1 to 10 taken together, "
        "every supervised token of those ten windows counted once?", "number",
        lambda: _logged_token_mean(1, 10),
        "do the ten windows hold the same number of tokens? and what does each "
        "line's loss divide by?", rel_tol=1e-4),
    "evaluation.2": Question(
        "Do the evaluation job's sum yourself, on 5 ranks, in this process: "
        "for each rank r, score the test sequences at the positions "
        "DistributedSampler(range(256), num_replicas=5, rank=r, shuffle=False) "
        "hands it, with course_lib.evaluation_job.score, and add the five "
        "ranks' scores.totals() (the [loss sum, token count, right predictions] "
        "that one all_reduce adds up), the sampler's repeats kept. What loss "
        "per token do the sums give?", "number", lambda: _repeats_kept_loss(5),
        "which positions does the sampler repeat on 5 ranks? Drop them and you "
        "should get the one-process value back; keep them and they count twice",
        rel_tol=1e-4),
    "evaluation.3": Question(
        "Lightning, self.log(\"loss\", loss, on_epoch=True, sync_dist=True, "
        "batch_size=<the batch's tokens>), one step per epoch on 4 ranks whose "
        "batches hold 30, 31, 33 and 35 tokens: the logged epoch value is the "
        "token mean of the four batches times what factor?", "number",
        129 / 128,
        "follow the Lightning lines the chapter prints: each rank adds "
        "value * batch_size and batch_size; the sync averages both over the "
        "ranks. Which of the two is an integer tensor, and what does copy_ keep "
        "of 129 / 4?", rel_tol=1e-5),
    "evaluation.4": Question(
        "A model that ignores the current token and always predicts the "
        "source's stationary distribution (corpus.source.stationary): what is "
        "its expected loss per token, in nats?", "number", _stationary_entropy,
        "every target follows the stationary distribution, whatever came before "
        "it: what does a model pay, on average, when it predicts exactly the "
        "distribution its targets follow?",
        rel_tol=1e-3),
    "evaluation.5": Question(
        "Evaluate the same checkpoint on 2 ranks (world_size=2). Which of the "
        "two wrong combinations still differs from the one-process value?",
        "choice", "mean of rank means",
        "does 2 divide 256? and do the even and the odd positions of the test "
        "split hold the same loss per token?",
        options=("sums with the repeats", "mean of rank means", "both", "neither")),
    # 08 framework_audit
    "framework_audit.predict": Question(
        "Which of these eight recipes train the global token mean, leaving "
        "exactly the reference gradient whatever the token counts?", "choices",
        lambda: _exact_recipes(),
        "an exact recipe weighs every token 1/N on every window: which "
        "backprop and reduction pairs give W * S / N after DDP's average?",
        options=_representative),
    "framework_audit.predict_gpt2": Question(
        "A GPT-2 built from its config has loss_type None, and its forward "
        "takes **kwargs. In the live run, your installed Trainer trains it with "
        "average_tokens_across_devices on: within the audited window, what will "
        "the audit say of its gradient, against the token mean?",
        "choice",
        lambda: _trainer_verdict("gpt2"),
        "with loss_type None, does _loss_shifts_labels hold, and which labels "
        "does the count take then? Is the factor that follows the same for "
        "every token of the window?",
        options=tuple(v.value for v in (Measured.EXACT, Measured.SCALED,
                                          Measured.BIASED, Measured.RANKS_DISAGREE))),
    "framework_audit.1": Question(
        "A GPT-2 on transformers >= 5.10.1 with average_tokens_across_devices "
        "on. Window A: 16 rows, all supervised from their first label, N = 1,000 "
        "after the shift. Window B: 16 rows, 8 of them start with a masked "
        "prompt, N = 1,000. With SGD, how much more does window B's update "
        "weigh than window A's (c_B / c_A)?",
        "number", 1016 / 1008,
        "each window's update is scaled by its own N / (N + R): count R in each "
        "window first", rel_tol=1e-6),
    "framework_audit.2": Question(
        "Your own collator shifts the labels itself, as chapter 02's does: "
        "labels = input_ids[:, 1:], padded with -100 at the end of each row. "
        "You pass it to the installed Trainer with a Llama, "
        "average_tokens_across_devices on. From the lines printed in this "
        "chapter, for a sequence of L tokens (its labels: the L - 1 next "
        "tokens, then one -100): how many labels does the count take, how many "
        "targets does the loss train, and which token does position t learn?",
        "choice",
        "L - 2 counted; L - 2 targets; t learns token t + 2",
        "the model's loss shifts whatever labels it gets (_loss_shifts_labels "
        "is True for a Llama), and the count takes labels[..., 1:]: apply both "
        "to labels that are already shifted once",
        options=("L - 1 counted; L - 1 targets; t learns token t + 1",
                 "L - 2 counted; L - 2 targets; t learns token t + 2",
                 "L - 1 counted; L - 2 targets; t learns token t + 2",
                 "L - 2 counted; L - 1 targets; t learns token t + 1")),
    "framework_audit.3": Question(
        "my_trainer.py also defines make_mean_trainer, whose compute_loss "
        "returns the model's own mean loss. Derive it from the Trainer's lines "
        "printed in this chapter, before any audit: on W = 2 ranks, M = 2 "
        "microbatches per rank and a window of N = 1,200 supervised tokens, a "
        "token of a microbatch with n = 100 supervised tokens weighs how many "
        "times 1/N (its weight under the token mean) in the gradient? Then "
        "audit make_mean_trainer: its matches column names the formula to "
        "confirm.", "number", 6.0,
        "the override calls the model without num_items_in_batch, so the model "
        "returns its own mean S / n. Does training_step still divide by M when "
        "the model accepts loss kwargs and a count was made? And DDP averages "
        "the W ranks.", rel_tol=1e-6),
    "framework_audit.4": Question(
        "The installed transformers has a class attribute, "
        "Trainer.loss_is_scaled_for_ga (the ÷ M skipped? lines printed in this "
        "chapter), that tells training_step whether the "
        "loss compute_loss returns is already scaled for gradient accumulation; "
        "None, the default, lets it decide as the lines printed in this chapter "
        "do. Subclass MeanLossTrainer with loss_is_scaled_for_ga = False. Before "
        "you audit it: on the same window as exercise 3 (W = 2, M = 2, "
        "N = 1,200), a token of a microbatch with n = 200 supervised tokens "
        "weighs how many times 1/N? Then audit make_flagged_trainer (uncomment "
        "the lines) to confirm. (A version without the attribute ignores it: "
        "the audit shows what yours does.)", "number", 1.5,
        "False says the loss is not yet scaled for accumulation: what does "
        "training_step then do to it before the backward? The model still "
        "returns its own mean over its microbatch, and DDP averages the ranks.",
        rel_tol=1e-6),
    # 09 choose the unit
    "choose_the_unit.predict": Question(
        "Under the sequence mean, on the parity window (rank 0's sequences drawn "
        "from 16-64 tokens, rank 1's from 65-128): a token of the window's "
        "shortest sequence weighs how many times what a token of its longest "
        "weighs? (within 15% counts)", "number", lambda: _length_bias(2),
        "a sequence's tokens share one sequence's weight: how does a token's "
        "share grow as its sequence gets shorter?", rel_tol=0.15),
    "choose_the_unit.predict_penalty": Question(
        "Three ways to place the L2 penalty wrongly: penalty_every_microbatch "
        "(weight 1 on every microbatch), penalty_times_world_size (W on each "
        "rank's last microbatch) and penalty_on_rank_zero (1 on rank 0's last "
        "microbatch alone). Which of them does accumulation_invariance catch, "
        "with no reference?", "choices", ("penalty_every_microbatch",),
        "accumulation_invariance cuts the same window into 1, 2, 4 or 16 "
        "microbatches per rank: which placements give a penalty that changes "
        "with that number?",
        options=("penalty_every_microbatch", "penalty_times_world_size",
                 "penalty_on_rank_zero")),
    "choose_the_unit.predict_packed": Question(
        "Packed rows, rows_as_documents: the sequence rule run unchanged, each "
        "row one sequence. One row holds a document alone, another four "
        "documents of equal length. One of the four weighs what fraction of the "
        "lone document?", "number", 1 / 4,
        "each row gets one share, spread evenly over the row's tokens: what part "
        "of its row's tokens does each document hold?", rel_tol=1e-6),
    "choose_the_unit.predict_rl": Question(
        "On the skewed window, against the advantage-weighted token mean: what "
        "are TRL's grpo, dr_grpo and dapo (steps_per_generation = GA)?", "choice",
        "grpo biased; dr_grpo scaled; dapo exact",
        "which of them averages each completion first, which divides by a "
        "number fixed in advance, and which counts the window's tokens?",
        options=("grpo exact; dr_grpo exact; dapo exact",
                 "grpo biased; dr_grpo scaled; dapo exact",
                 "grpo scaled; dr_grpo exact; dapo biased",
                 "grpo biased; dr_grpo exact; dapo scaled",
                 "grpo exact; dr_grpo biased; dapo exact")),
    "choose_the_unit.1": Question(
        "W = 2, the weighted objective: the class weights of rank 0's supervised "
        "tokens sum to 2,100, rank 1's to 600. Each rank divides its weighted "
        "loss sum by its own sum of weights, and DDP averages the two ranks. A "
        "rank-1 token then weighs how many times what the weighted mean gives "
        "it?", "number", 2700 / 1200,
        "the weighted mean gives a token of class weight w the weight w / (sum "
        "of every weight); what does it get once its rank divides by its own "
        "sum and DDP by W?", rel_tol=1e-6),
    "choose_the_unit.2": Question(
        "Dr. GRPO divides the step's loss sum by a constant C: the optimizer "
        "step's number of completions times the maximum completion length. A "
        "job was set up on 4 ranks x 2 microbatches x 8 completions, at most 512 "
        "tokens each, with that C. It moves to 8 ranks (still 2 microbatches of "
        "8 completions each) and completions of up to 1,024 tokens, and its "
        "config keeps the old C. Each update is then the right Dr. GRPO "
        "update times what factor?", "number",
        (8 * 2 * 8 * 1024) / (4 * 2 * 8 * 512),
        "work out the C the new job should use, then compare the two "
        "normalizers of the same loss sum", rel_tol=1e-9),
    "choose_the_unit.3": Question(
        "At PaLM's strength, zloss:0.0001, in float32: which checks catch "
        "zloss_mean_per_microbatch (its source below)? Predict first, from the "
        "size of its wrong term against parity's tolerance and from what each "
        "check varies; then audit it with every check (the skeleton in this "
        "cell).", "choices",
        ("trajectory", "uneven_microbatches"),
        "audit it with objective='zloss:0.0001' and every check; a small term "
        "hides inside one gradient's rounding: which checks look further?",
        options=_check_names),
    "choose_the_unit.4": Question(
        "TRL's dapo divides each optimizer step's loss sum by the generation "
        "batch's token count times GA / steps_per_generation. With "
        "steps_per_generation = 2 GA, the two steps of one generation batch "
        "train 300 and 500 tokens. Step 1's gradient is "
        "its own token mean's times what factor? (Then work out step 2's: over "
        "the two steps, which tokens count more?)", "number", 300 / 400,
        "the generation batch holds both steps' tokens: what does step 1 divide "
        "by, and what would its own token mean divide by?", rel_tol=1e-6),
    "choose_the_unit.5": Question(
        "The chapter's packed window (document:128), under rows_as_documents "
        "(the sequence rule, each row one sequence): the heaviest document of "
        "the window weighs how many times the lightest (a document's weight: "
        "the sum of its tokens' weights)? The document objective makes it 1.",
        "number", lambda: _document_weight_ratio(128), "collate every "
        "microbatch of both ranks with packing, weigh the tokens with "
        "objectives.token_weights(objectives.parse('sequence'), labels), and "
        "sum them per document (objectives.documents)", rel_tol=1e-3),
    # 10 capstone
    "capstone.predict": Question(
        "Read the script's four functions as a reviewer would: which of these "
        "does it get wrong?", "choices",
        ("the step's token count", "the step's scale", "the checkpoint's sampler",
         "the checkpoint's RNG states", "the evaluation's shares of the test set",
         "the evaluation's average"),
        "hold each against its chapter: what N counts, and on which ranks (02, "
        "03); what multiplies S_r (03); what no_sync() wraps (03, 05); what a "
        "resume must restore (06); which sequences each rank scores, and what is "
        "averaged (07)",
        options=("the step's token count", "the step's scale", "the step's sync",
                 "the checkpoint's model and optimizer", "the checkpoint's sampler",
                 "the checkpoint's RNG states", "the evaluation's shares of the test set",
                 "the evaluation's average")),
    "capstone.predict_crash": Question(
        "Every process is killed while rank 0 is inside the torch.save of save "
        "at update 40; step-0020 is the last checkpoint saved before. The restart "
        "resumes from the newest step-* directory that holds a state.pt. With "
        "save as it is (the script's or the worked fix's: they write alike), "
        "what does the restart load?", "choice",
        "a half-written step-0040",
        "what does dist.barrier() wait for, and what lies on disk under "
        "state.pt's final name the moment torch.save is killed?",
        options=("a whole step-0040", "a half-written step-0040", "step-0020")),
    "capstone.predict_empty": Question(
        "Two ranks; rank 1's window holds no supervised token, rank 0's does. "
        "Which of these steps still pass parity against the one-process token "
        "mean? mean of means (mean_of_means: each rank backprops S_r / N_r), post "
        "scale (post_scale, chapter 05: the raw sum S_r, the gradients scaled by "
        "W / N after the sync), local count (local_count: W * S_r / N_r, the "
        "count never all-reduced)",
        "choices", ("post scale", "local count"),
        "N = N_0 here, and an empty rank's gradient is a finite zero: write each "
        "step's update as a sum over the ranks and compare it with S_0 / N_0",
        options=("mean of means", "post scale", "local count")),
    "capstone.1": Question(
        "Two nodes of 4 ranks each. The step backprops W * S_r / N with W = 8, "
        "but N is all-reduced over a node-local process group only, so each "
        "rank divides by its own node's tokens. Node 0 holds three times node "
        "1's tokens. A token on node 1 weighs how many times the token mean's "
        "1/N? (Then a token on node 0: is the update a scale of the right one, "
        "or a bias?)", "number", (3 + 1) / 1,
        "DDP still averages over all 8 ranks: write the update as a sum over the "
        "two nodes, each node's sum divided by its own count, and put N_0 = 3 N_1",
        rel_tol=1e-6),
    "capstone.2": Question(
        "Two windows of 100 supervised tokens each: the first holds 20 padded "
        "slots, the second 100, and the count takes labels.numel(). A token of "
        "the second window then weighs what fraction of a token of the first?",
        "number", 120 / 200,
        "the token mean gives every token of both windows 1 / 100: what does "
        "each window divide by instead?", rel_tol=1e-6),
    "capstone.3": Question(
        "Convert the script's step to chapter 05's post_scale (backprop the raw "
        "sum S_r, then scale the gradients by W / N after the sync) and run the "
        "model and its loss in float16 (model.half(), no autocast), whose largest "
        "value is 65,504; the loss starts near 3.6 "
        "nats per token. As a rank's window grows, which quantity overflows "
        "first, and before which call?", "choice", "S_r before backward()",
        "compare how fast each grows per supervised token: the loss sum, a "
        "logit's gradient (softmax minus one-hot), the count; and which one is "
        "computed first",
        options=("S_r before backward()", "the gradients in DDP's all-reduce",
                 "the gradients in the scale by W / N", "N in its all_reduce")),
    "capstone.4": Question(
        "In a copy of the script, fix only step's count: N as the supervised "
        "labels, all-reduced over the ranks, the rest of step as it is. Grade it: "
        "which of the step's five properties still fail?", "choices",
        ("parity", "trajectory", "accumulation_invariance"),
        "what is left in step: a factor the same on every rank, or one per rank? "
        "and does it depend on the number of microbatches?",
        options=("parity", "trajectory", "accumulation_invariance",
                 "permutation_invariance", "no_sync")),
    "capstone.5": Question(
        "A 4-rank run of the fixed script is resumed on 2 ranks from its "
        "checkpoint. Which parts of the checkpoint still carry the 4-rank run's "
        "trajectory on?", "choices", ("model weights", "optimizer state"),
        "which parts are the same on every rank and never mention W, and what "
        "does the course's sampler draw per rank? (make_sampler(cfg, corpus, 4) "
        "and (..., 2): draw, load one's state into the other, compare)",
        options=("model weights", "optimizer state", "sampler state",
                 "per-rank RNG states")),
}
