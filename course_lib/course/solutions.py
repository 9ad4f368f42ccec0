"""Worked solutions for instructors: every graded question, its answer and why.

``python -m course_lib.course.solutions`` (``make solutions``) writes
``docs/solutions.md`` from ``quiz.QUESTIONS`` and ``REASONING`` below. No
chapter imports this module: a learner who opens a chapter sees questions,
never the reasoning (tests/test_docs.py checks both).

Answers come in three sorts:

- a value typed in ``quiz.py``: printed as it is;
- a function of the config, the corpus or the installed versions (the same
  on every checkout of one environment): computed and printed;
- a function that reads a report of the chapters' run (``runs/course``):
  never computed (the run is hidden while the document is written, so the
  document is the same with or without one); it says "read from the
  chapter's run", with the question's hint and the report it needs, and
  the chapter's ``check`` grades the learner against the run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from course_lib.core import paths
from course_lib.course import quiz

FROM_RUN = "read from the chapter's run"

# question id -> why the answer is what it is, in 1-3 sentences.
REASONING: dict[str, str] = {
    # 01 mean of means
    "mean_of_means.predict_mom":
        "The local means are 1 and 3; DDP averages the two means, so 2, whatever "
        "the counts behind them.",
    "mean_of_means.predict_global":
        "The 48 tokens sum to 12 * 1 + 36 * 3 = 120, and 120 / 48 = 2.5: the busy "
        "rank's tokens pull the mean toward its loss of 3.",
    "mean_of_means.1":
        "Every token weighs 1 / N: (20 * 2 + 80 * 1) / 100 = 120 / 100 = 1.2.",
    "mean_of_means.2":
        "The local means are 2 and 1, and their average is 1.5: above the token "
        "mean, because the small rank holds the larger loss.",
    "mean_of_means.3":
        "Under the mean of means a token of rank r weighs 1 / (W N_r): 1/40 on "
        "rank 0 and 1/160 on rank 1, a ratio of N_1 / N_0 = 4.",
    "mean_of_means.4":
        "A rank-0 token weighs 1 / (W N_0) = 1 / (2 * 5) = 0.1, and a rank-1 "
        "token 1 / 90: nine times less.",
    # 02 token explorer
    "token_explorer.predict_mom":
        "Each rank's mean pulls toward its own target, +1 or -1, and the mean of "
        "means gives each rank the same weight: the pulls cancel halfway, at 0.",
    "token_explorer.predict_global":
        "The token mean's minimum is the token-weighted mean of the targets: (12 "
        "* (+1) + 36 * (-1)) / 48 = -0.5.",
    "token_explorer.1":
        "The mean of means weighs the three ranks alike: (1 + 3 + 2) / 3 = 2. The "
        "global mean weighs them by their tokens: (12 + 108 + 48) / 72 = 7/3, so "
        "the bias is 2 - 7/3 = -1/3.",
    "token_explorer.2":
        "The mean of means does not see the swap, (3 + 1) / 2 = 2; the token mean "
        "becomes (12 * 3 + 36 * 1) / 48 = 1.5; the bias is 0.5.",
    "token_explorer.3":
        "With 12 targets of each sign both objectives weigh every token alike, "
        "and +1 and -1 balance: the gradient is zero at 0.",
    "token_explorer.4":
        "The global gradient vanishes where theta is the token-weighted mean of "
        "the targets, (n - 36) / (n + 36). Setting it to -0.2 gives 1.2 n = 28.8, "
        "so n = 24.",
    # 03 data and plan
    "data_and_plan.predict_ratio":
        "Both ranks draw as many sequences, so the ratio is that of their typical "
        "targets: about 96 in the band 65-128 against about 39 in 16-64, close to "
        "2.5; the plan's exact sums give the answer.",
    "data_and_plan.1":
        "A next-token model predicts each position from the ones before it; the "
        "first token has none before it, so 50 - 1 = 49 targets.",
    "data_and_plan.2":
        "The widest row has 30 tokens, so 29 targets; three rows padded to 29 "
        "make 87 label cells, of which only 9 + 19 + 29 = 57 are supervised.",
    "data_and_plan.3":
        "Counting len(sequence) adds one to N per sequence while the loss sums "
        "stay, so every gradient scales by N / (N + R), with R the 32 sequences "
        "of step 0's window.",
    "data_and_plan.4":
        "N is the window's supervised targets over both ranks: each sequence of "
        "step 3 adds its length minus one, whatever rank holds it.",
    # 04 global denominator
    "global_denominator.predict":
        "N already counts both microbatches' tokens; dividing again by 2 halves "
        "every gradient, and the loss DDP averages: 2.5 / 2 = 1.25.",
    "global_denominator.1":
        "Each rank backprops W * S_r / N, so it multiplies S_r by W / N = 4 / 400 "
        "= 0.01; DDP's mean over 4 ranks leaves sum S_r / 400.",
    "global_denominator.2":
        "The extra division by 3 scales every component by 1/3: the direction is "
        "right, the length a third of it.",
    "global_denominator.3":
        "DDP prepares a backward's reduction during the forward, and skips it "
        "only for a forward run under no_sync(). Every forward ran outside it, so "
        "all 4 backwards synchronise; the no_sync() around 3 of them comes too "
        "late.",
    "global_denominator.4":
        "Dividing the right gradient by 4 scales every component by 1/4, so the "
        "ratio of the norms is 0.25.",
    # 05 ddp parity
    "ddp_parity.1":
        "With rtol = 0 the test is |err| <= atol for every component, so the "
        "smallest atol that passes is the largest error: the mean of means' max "
        "|err|.",
    "ddp_parity.predict":
        "Rank 0's short sequences hold fewer tokens than an even share N / W, and "
        "the mean of means weighs a rank-0 token 1 / (W N_0) instead of 1 / N: "
        "more.",
    "ddp_parity.2":
        "At W = 3 the sampler draws a window for three ranks, each taking its own "
        "share, and the script's N is the all_reduce of the three counts: the "
        "supervised targets of that window.",
    "ddp_parity.3":
        "No: every microbatch then syncs, but averaging is linear, so the sum of "
        "the synced pieces is the same gradient; only the communication is "
        "wasted.",
    "ddp_parity.4":
        "allclose passes a component when |err| <= atol + rtol * |ref|, so each "
        "sampled component needs atol >= |err| - rtol * |ref|; the worst "
        "component sets the smallest atol.",
    # 06 bug lab
    "bug_lab.predict_no_sync_backward_only":
        "The gradient is right, so the comparisons with the reference pass. "
        "no_sync sees the ranks agree between microbatches (nothing was "
        "deferred), and with uneven microbatch counts the extra syncs do not pair "
        "up: uneven_microbatches names the hang.",
    "bug_lab.predict_count_never_reset":
        "On the first window the count is right, so every one-window check "
        "passes; only trajectory runs later windows, where N has grown and the "
        "gradient fades.",
    "bug_lab.predict_forgot_world_size":
        "S_r / N is the right gradient times 1/W: parity, trajectory and "
        "uneven_microbatches compare with the reference and see the scale, and "
        "world_size_invariance changes W and sees it move. Accumulation and "
        "permutation compare layouts at one W, which share the scale.",
    "bug_lab.1":
        "Counting lengths before the shift adds one label per sequence: N' = N + "
        "R on the W = 4 window, with its own N and R, and the gradient scales by "
        "N / (N + R).",
    "bug_lab.2":
        "Each rank divides by its own window's count N_r, not a microbatch's: "
        "splitting the window into other microbatches leaves N_r, so its (wrong) "
        "gradient does not move.",
    "bug_lab.3":
        "Without no_sync every microbatch all-reduces: the gradient is still "
        "right, but no_sync sees synced ranks between microbatches and "
        "uneven_microbatches deadlocks when the ranks' microbatch counts differ.",
    "bug_lab.4":
        "The first launch runs every in-launch check and world_size_invariance's "
        "W = 2; W = 1, 4 and 8 take one launch each. uneven_microbatches runs in "
        "launches of its own, and each deadlock ends one, so two deadlocks split "
        "it into 3: 4 + 3 = 7.",
    # 07 checkpoint resume
    "checkpoint_resume.predict":
        "Each ablation drops one piece that the updates after step 50 read: the "
        "momentum (weights_only, no_optimizer_state), the order of the windows "
        "(sampler_from_seed), the dropout masks (no_rng_state). Any one of them "
        "changes the parameters by step 100.",
    "checkpoint_resume.1":
        "Without dropout nothing after step 50 draws from the RNG states, so "
        "no_rng_state no longer changes anything; the momentum and the order of "
        "the windows still do.",
    "checkpoint_resume.2":
        "A sampler re-seeded at the resume starts its order over: update 51 draws "
        "window 0 of that order, so update 80, the 30th after the resume, draws "
        "window 29.",
    "checkpoint_resume.3":
        "model.pt, optimizer.pt, trainer.json and manifest.json are written once "
        "per checkpoint, and a rank-RR.pt once per rank (its own RNG states): 4 + "
        "8 = 12.",
    "checkpoint_resume.4":
        "The manifest holds each file's hash, so the cut optimizer.pt fails it "
        "and step-0050 is not valid; latest_valid then returns the newest "
        "checkpoint that verifies, step-0025.",
    # 08 evaluation
    "evaluation.predict":
        "The source is first-order and the model sees each transition many times "
        "in 100 updates, so it closes nearly all of the gap from the untrained "
        "loss: the chapter's run measures how little is left.",
    "evaluation.predict_shard":
        "The sampler pads the list with its first entries until 3 divides it: "
        "258 = 3 * 86, so every rank gets 86, and two sequences are scored twice.",
    "evaluation.1":
        "A uniform row over 32 symbols has entropy log 32, and the floor averages "
        "the rows' entropies: log 32, about 3.466 nats per token.",
    "evaluation.2":
        "The floor is the best loss per token any model can reach on this data; "
        "the trained model's test loss minus it is what training left on the "
        "table.",
    "evaluation.3":
        "A sequence's targets are its tokens after the first, so the answer is "
        "the sum of (length - 1) over those 128 test sequences.",
    "evaluation.4":
        "No: the entropy floor bounds the expected loss of every model on data "
        "drawn from the corpus's distribution; a large test set sits at most a "
        "sampling error below it.",
    "evaluation.5":
        "2 divides 256, so the sampler adds no repeat and the sums with repeats "
        "kept are the token-weighted ones; the even and odd positions hold "
        "different token counts and losses, so their means' average is not the "
        "token mean.",
    # 09 exercise
    "exercise.predict_mom":
        "The local means are 1 and 3, and their average is 2, whatever the "
        "counts.",
    "exercise.predict_global":
        "(12 * 1 + 36 * 3) / 48 = 120 / 48 = 2.5: the rank with three times the "
        "tokens pulls the mean toward its loss.",
    "exercise.predict_pass":
        "global_token weighs every token 1 / N in both scenarios. The mean of "
        "means weighs a token 1 / (W N_r), which is 1 / N only when the counts "
        "are equal, so it passes the balanced scenario and fails the skewed one.",
    "exercise.predict_change":
        "W counts the ranks and stays 2; only the number of tokens changes, so N, "
        "summed over the ranks by the all_reduce, is what moves.",
    "exercise.1":
        "(12 * 1 + 60 * 3) / 72 = 192 / 72, about 2.667.",
    "exercise.2":
        "With 12 and 13 tokens, the mean of means weighs a rank-0 token 1/24 "
        "instead of 1/25: a 4% change of weight, far above what the check "
        "forgives as rounding.",
    "exercise.3":
        "Dividing each microbatch by its own count weighs a token of the 12-token "
        "microbatch 1/12 against 1/36 in the long one: equal ranks do not make "
        "equal microbatches, so it fails.",
    # 10 production recipes
    "production_recipes.predict":
        "A recipe is exact when every token of every window weighs 1 / N after "
        "DDP's average: a count after the shift, summed over the whole window and "
        "every rank, and the W factor applied once.",
    "production_recipes.1":
        "N' counts 512 labels per row before the shift, and the loss sees 511 "
        "after it: the gradient scales by N / N' = 511 / 512.",
    "production_recipes.2":
        "#2206 on pure DDP divides a global mean by W again: every gradient is "
        "1/8 of the exact one. With SGD (momentum too is linear) a gradient times "
        "c moves like a learning rate times c, so 0.05 * 8 = 0.4.",
    "production_recipes.3":
        "megatron_pre_clamp divides each microbatch's masked sum by that "
        "microbatch's own count, unclamped: a microbatch with no supervised token "
        "gives 0 / 0, and DDP's average spreads the NaN to every rank.",
    "production_recipes.4":
        "The factor is N / (N + R): the labels the loss sees over those a count "
        "before the shift finds, on the skewed window laid out for 4 ranks.",
    "production_recipes.5":
        "Both get the weights' pattern right at one W but carry a factor that "
        "depends on the ranks (a rank's own count; DDP's 1/W on a global mean), "
        "so changing W exposes them; a mean of microbatch means depends on the "
        "microbatches, which that check keeps.",
    # 11 framework audit
    "framework_audit.predict":
        "A configuration trains the token mean when its loss divides by the "
        "window's N over every rank, counted after the shift: the reading of the "
        "installed versions, which the chapter's run then measures.",
    "framework_audit.1":
        "With the flag on, GPT-2's count is taken before the shift, so each of "
        "the 6 rows supervised from its first label adds a label the loss never "
        "uses: N' = 1,206 and the factor is 1200 / 1206.",
    "framework_audit.2":
        "The mean of rank means weighs a rank-0 token 1 / (W N_0) instead of 1 / "
        "N: N / (W N_0) times the token mean's weight, with the counts of the "
        "report.",
    "framework_audit.3":
        "Before 4.54 average_tokens_across_devices defaults to off, so each rank "
        "divides by its own count: a mean of rank means. And 4.50 counts the "
        "labels before the shift.",
    "framework_audit.4":
        "A compute_loss that returns the model's mean loss divides each "
        "microbatch by its own count; the audit names the candidate formula that "
        "its gradient matches.",
    # 12 choose the unit
    "choose_the_unit.predict":
        "Under the sequence mean each sequence gets the same total weight, shared "
        "among its tokens: 1/10 each in the short one, 1/40 in the long one, a "
        "ratio of 0.25.",
    "choose_the_unit.1":
        "Both sum A * l; the token mean divides by N, the window's supervised "
        "tokens, and Dr. GRPO by its completions times the maximum length: the "
        "factor is N over that constant.",
    "choose_the_unit.2":
        "C covers the whole optimizer step: 4 * 2 * 8 = 64 completions at 512 "
        "tokens, the same on every rank and microbatch.",
    "choose_the_unit.3":
        "At 1e-4 the z term's wrong normalization moves one gradient less than "
        "float32's parity tolerance; the trajectory compounds it over updates, and "
        "the uneven microbatches (1 to 6 sequences) weigh the per-microbatch means "
        "far apart.",
    "choose_the_unit.4":
        "A smaller budget fits fewer padded rows in a microbatch, so rank 1's "
        "sequences split into more microbatches than under 384.",
    "choose_the_unit.5":
        "Packed, a document is a run of supervised labels between boundaries: "
        "collate each microbatch into rows of 128 and count the runs.",
    # 13 adapting
    "adapting.predict_empty":
        "Rank 1 hands DDP a zero gradient and DDP still divides by W = 2, while "
        "the token mean divides by rank 0's tokens alone: the mean of means gets "
        "half.",
    "adapting.1":
        "Every token weighs 1 / N: (10 * 2 + 30 * 1) / 40 = 50 / 40 = 1.25.",
    "adapting.2":
        "(2 + 1) / 2 = 1.5: each document counts once, whatever its length.",
    "adapting.3":
        "DDP averages over all 3 ranks, the empty one adding a zero, so the mean "
        "of means is (S_0 / n + S_1 / n) / 3; the token mean is (S_0 + S_1) / (2 "
        "n): a ratio of 2/3.",
    "adapting.4":
        "Ignoring the first 20 positions takes their labels out of the count: "
        "count_tokens counts only the labels that are not -100.",
    # 14 capstone
    "capstone.predict":
        "One: no_sync. The step divides by a count that holds padding, by the "
        "rank's own tokens and again by the microbatches (parity, trajectory, "
        "accumulation and permutation fail), though it syncs once per window; "
        "the checkpoint loses the sampler and restores rank 0's RNG everywhere "
        "(resume); the evaluation averages rank means and keeps the repeats "
        "(evaluate_w2, evaluate_w3).",
    "capstone.1":
        "Under the mean of means a token of rank r weighs 1 / (W N_r): 1/40 "
        "against 1/200, five times heavier.",
    "capstone.2":
        "The loss sums the 100 supervised tokens but N counts 120 slots: every "
        "gradient is 100 / 120, about 0.833, of the exact one, and the factor "
        "moves with the padding from window to window.",
    "capstone.3":
        "The sampler pads 1,001 up to 1,008 = 8 * 126 with the first 7 "
        "indices: 7 sequences scored twice.",
    "capstone.4":
        "Dividing by the global N but not multiplying by W, then again by the "
        "microbatches, leaves a factor 1 / (W M), the same on every rank: parity "
        "and trajectory see the scale, accumulation_invariance sees M change; "
        "permutation and no_sync hold.",
}


@contextlib.contextmanager
def _no_run() -> Iterator[None]:
    """The chapters' run hidden: an answer that reads it raises
    FileNotFoundError, so the document never depends on runs/course."""
    real = paths.default_out
    with tempfile.TemporaryDirectory() as empty:
        paths.default_out = lambda name: Path(empty) / name  # type: ignore[assignment]
        try:
            yield
        finally:
            paths.default_out = real


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e6:
            return str(int(value)) if abs(value) < 10_000 else f"{int(value):,}"
        return f"{value:.6g}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(f"`{v}`" for v in sorted(map(str, value))) or "(none)"
    return f"`{value}`"


def answer_text(q: quiz.Question) -> str:
    """The answer as the document prints it (call it under ``_no_run``)."""
    try:
        value = q.expected()
    except FileNotFoundError as missing:
        return f"{FROM_RUN}: {q.hint} ({missing})"
    computed = " (computed from the config, the corpus or the installed " \
               "versions)" if callable(q.answer) else ""
    return _value(value) + computed


def _chapters() -> dict[str, str]:
    """slug -> notebook stem, e.g. ddp_parity -> 05_ddp_parity."""
    found = sorted((paths.project_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return {p.stem[3:]: p.stem for p in found}


HEADER = """# Worked solutions

For instructors and revisers: every graded question of the course, its
answer, and why. Generated by `make solutions` (`python -m
course_lib.course.solutions`) from `course_lib/course/quiz.py` and the
reasoning in `course_lib/course/solutions.py`; edit those, not this file.
No chapter imports the solutions.

An answer that a chapter reads from its own run (`runs/course`) is not
computed here, so this file is the same with or without a run: it says where
to read it. An answer computed from the config, the corpus or the installed
versions is computed.
"""


def render() -> str:
    chapters = _chapters()
    lines = [HEADER]
    current = None
    with _no_run():
        answers = {qid: answer_text(q) for qid, q in quiz.QUESTIONS.items()}
    for qid, q in quiz.QUESTIONS.items():
        slug = qid.split(".")[0]
        if slug != current:
            current = slug
            lines.append(f"## {chapters.get(slug, slug)}\n")
        options = q.choices()
        ask = q.prompt + (f" (options: {', '.join(options)})" if options else "")
        lines.append(f"### `{qid}`\n")
        lines.append(f"**Question.** {ask}\n")
        lines.append(f"**Answer.** {answers[qid]}\n")
        lines.append(f"**Why.** {REASONING.get(qid, '(no reasoning yet)')}\n")
    return "\n".join(lines)


def path() -> Path:
    return paths.project_root() / "docs" / "solutions.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write (default docs/solutions.md)")
    args = parser.parse_args(argv)
    target = args.out or path()
    missing = [q for q in quiz.QUESTIONS if q not in REASONING]
    stale = [q for q in REASONING if q not in quiz.QUESTIONS]
    target.parent.mkdir(parents=True, exist_ok=True)
    text = render()
    target.write_text(text)
    root = paths.project_root()
    shown = target.relative_to(root) if target.is_relative_to(root) else target
    print(f"wrote {shown}: {len(quiz.QUESTIONS)} questions, "
          f"{text.count(FROM_RUN)} of them {FROM_RUN}")
    for qid in missing:
        print(f"  no reasoning for {qid}", file=sys.stderr)
    for qid in stale:
        print(f"  reasoning for a question that no longer exists: {qid}", file=sys.stderr)
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())
