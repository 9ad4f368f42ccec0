"""Chapter 08's graded questions (``notebooks/08_framework_audit.ipynb``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from course_lib.course.grading import Question, from_run


def _representative() -> tuple[str, ...]:
    """The recipes chapter 08 reads before it runs them."""
    from course_lib.steps.recipes import REPRESENTATIVE

    return REPRESENTATIVE


def _exact_recipes() -> list[str]:
    from course_lib.steps.recipes import trains_the_token_mean

    return [name for name in _representative() if trains_the_token_mean(name)]


def _live_scale(model: str) -> Callable[[Any], float]:
    """08: the scale c = <g, g*> / <g*, g*> that the live run measured on
    rank 0 for the installed Trainer on ``model``, average_tokens_across_devices on."""
    def get(report) -> float:
        row = next(r for r in report.rows if (r.framework, r.model) == ("hf", model)
                   and r.flags.get("average_tokens_across_devices") is True)
        return row.ranks[0].scale
    return get


@cache
def _last_label_masked_scale(world_size: int = 2) -> float:
    """08, exercise 5: the installed Trainer's scale N / (N + R) on a GPT-2
    (counted before the shift) once a collator sets each row's last label
    to -100, as mask_last_label does: the live window, masked, then counted."""
    import dataclasses

    from course_lib.core.data import IGNORE_INDEX
    from course_lib.course.api import corpus, load_config
    from course_lib.frameworks import window as fw_window
    from course_lib.jobs.frameworks import FrameworksJob

    spec = FrameworksJob([])  # the live run's window shape
    shape = fw_window.WindowShape(world_size, spec.microbatches, spec.batch_size,
                                  spec.length, spec.seed)
    window = fw_window.build(shape, corpus(load_config()).source)

    def mask_last_label(mb: fw_window.Microbatch) -> fw_window.Microbatch:
        labels = mb.labels.clone()
        last = mb.attention_mask.sum(1) - 1  # each row's last token
        labels[range(len(last)), last] = IGNORE_INDEX
        return dataclasses.replace(mb, labels=labels)

    counts = fw_window.counts([[mask_last_label(mb) for mb in rank] for rank in window])
    return counts.N / (counts.N + counts.R)


# 08, exercises 3 and 4: the window their prompts give
W, M, N = 2, 2, 1200


QUESTIONS: dict[str, Question] = {
    "framework_audit.predict": Question(
        "Which of these eight recipes train the global token mean, leaving "
        "exactly the reference gradient whatever the token counts?", "choices",
        lambda: _exact_recipes(),
        "an exact recipe weighs every token 1/N on every window: which "
        "backprop and reduction pairs give W * S / N after DDP's average?",
        options=_representative,
        reasoning=(
            "A recipe is exact when every token of every window weighs 1 / N: fairseq "
            "(sums, then x W / N after DDP's mean), torchtitan on FSDP (S / N summed "
            "over the ranks) and Megatron's per-token path (sums, then / N). The others "
            "divide per microbatch, per rank, by a count taken before the shift, or by "
            "W once too often.")),
    "framework_audit.predict_gpt2": Question(
        "A GPT-2 built from its config is a GPT2LMHeadModel, and its forward "
        "takes **kwargs. In the live run, your installed Trainer trains it with "
        "average_tokens_across_devices on, on the window whose N and R are "
        "printed above. The audit measures c = <g, g*> / <g*, g*>, the scale of "
        "its gradient g along the token mean's g* (c = 1 when g is g*): what c "
        "will it measure?",
        "number", from_run("course_lib.jobs.frameworks:FrameworksReport", _live_scale("gpt2")),
        "which loss_type does its class name give it? Does _loss_shifts_labels "
        "hold, and which labels does the count take then? How many more than N "
        "does it find, and what is left of W * S_r / count after DDP's mean?",
        rel_tol=1e-3,
        reasoning=(
            "A GPT-2 built from its config has loss_type None, so _loss_shifts_labels "
            "is False and the count takes every label: each row whose first label is "
            "not -100 adds one that no position predicts, N' = N + R, gathered over "
            "the ranks. Every rank backprops W * S_r / N' with the same N', so DDP's mean "
            "leaves N / (N + R) times the token mean's gradient, one factor for the "
            "whole window: 87 / 91 = 0.956 on the live window (N = 87, R = 4; from "
            "4.48 on, and the run answers for the installed version).")),
    "framework_audit.1": Question(
        "A GPT-2 built from its config (loss_type None, not fixed) on "
        "transformers >= 5.10.1, average_tokens_across_devices on. Window A: "
        "16 rows, none begins with a masked prompt, N = 1,000 after the shift. "
        "Window B: 16 rows, 8 of them begin with a masked prompt, N = 1,000. "
        "With SGD, how much more does window B's update weigh than window A's "
        "(c_B / c_A)?",
        "number", 1016 / 1008,
        "each window's update is scaled by its own N / (N + R): count R in each "
        "window first", rel_tol=1e-6,
        reasoning=(
            "Each window's update is its token-mean gradient times its own N / (N + R): "
            "1000 / 1016 for A (R = 16), 1000 / 1008 for B (R = 8). B weighs 1016 / "
            "1008 = 1.0079 times A: over a run the scale reweights the windows.")),
    "framework_audit.2": Question(
        "Your own collator shifts the labels itself, as chapter 02's does: "
        "labels = input_ids[:, 1:], padded with -100 at the end of each row. "
        "You pass it to the installed Trainer with a Llama, "
        "average_tokens_across_devices on. From the lines printed in this "
        "chapter, for a sequence of L tokens (its labels: the L - 1 next "
        "tokens, then one -100): how many labels does the count take, how many "
        "targets does the loss train, and which token does position t learn?",
        "choice",
        "b) L - 2 counted; L - 2 targets; t learns token t + 2",
        "the model's loss shifts whatever labels it gets (_loss_shifts_labels "
        "is True for a Llama), and the count takes labels[..., 1:]: apply both "
        "to labels that are already shifted once",
        options=("a) L - 1 counted; L - 1 targets; t learns token t + 1",
                 "b) L - 2 counted; L - 2 targets; t learns token t + 2",
                 "c) L - 1 counted; L - 2 targets; t learns token t + 2",
                 "d) L - 2 counted; L - 1 targets; t learns token t + 1"),
        reasoning=(
            "The Llama's loss shifts whatever labels it gets (_loss_shifts_labels is "
            "True) and the count takes labels[..., 1:], so labels already equal to "
            "input_ids[:, 1:] are counted L - 2 a row and scored as L - 2 targets, "
            "position t against input_ids[t + 2]; count and targets agree, so every "
            "token weighs 1 / N: the token mean's weighting, of the wrong task "
            "(predicting two tokens ahead), which a check of weights alone cannot "
            "see and the loss, stalling high, shows. Shift in the data or in the "
            "loss, never both: a collator that shifts can pass its labels as "
            "shift_labels, which the count takes as given (the expression's first "
            "branch) and ForCausalLMLoss uses without shifting them again.")),
    "framework_audit.3": Question(
        "my_trainer.py also defines make_mean_trainer, whose compute_loss "
        "returns the model's own mean loss. Derive it from the Trainer's lines "
        "printed in this chapter, before any audit: on W = 2 ranks, M = 2 "
        "microbatches per rank and a window of N = 1,200 supervised tokens, a "
        "token of a microbatch with n = 100 supervised tokens weighs how many "
        "times 1/N (its weight under the token mean) in the gradient? Then "
        "audit make_mean_trainer: its matches column names the formula to "
        "confirm.", "number", N / (W * 100),
        "the override calls the model without num_items_in_batch, so the model "
        "returns its own mean S / n. Does training_step still divide by M when "
        "the model accepts loss kwargs and a count was made? And DDP averages "
        "the W ranks.", rel_tol=1e-6,
        reasoning=(
            "6: the override calls the model without num_items_in_batch, so each "
            "microbatch returns its own mean S / n; training_step, seeing a model that "
            "accepts loss kwargs and a count, takes the loss as already divided by N "
            "and skips the division by M; DDP averages the W ranks: S / (W n), and a "
            "token weighs 1 / (W n) = 1 / 200 = 6 / 1200. The audit names the formula: "
            "mean of microbatch means without 1/M.")),
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
        "the audit shows what yours does.)", "number", N / (W * M * 200),
        "False says the loss is not yet scaled for accumulation: what does "
        "training_step then do to it before the backward? The model still "
        "returns its own mean over its microbatch, and DDP averages the ranks.",
        rel_tol=1e-6,
        reasoning=(
            "1.5: with loss_is_scaled_for_ga = False, training_step divides the model's "
            "own mean S / n by M before the backward, and DDP averages the ranks: "
            "S / (W M n), and a token weighs 1 / (2 x 2 x 200) = 1 / 800 = 1.5 / 1200 "
            "(the audit: mean of microbatch means). The attribute restores the missing "
            "1/M of exercise 3, not the token mean: a token of a 100-token microbatch "
            "weighs 3 / N, so the weight still depends on its microbatch's count (a "
            "version without the attribute ignores it, and its run shows exercise 3's "
            "formula).")),
    "framework_audit.5": Question(
        "The installed Trainer counts a GPT-2 built from its config before the "
        "shift: labels.ne(-100) over every label. Your collator sets each row's "
        "last label to -100 (the end of every sequence goes untrained). Write "
        "make_masked_trainer (the plain Trainer with that collator; uncomment the "
        "lines). Before you audit it on a GPT-2, on the chapter's window of 2 "
        "ranks (8 rows, N = 87 supervised targets, R = 4, as printed for "
        "world_size = 2): what c will the audit measure? (Its g* is the token "
        "mean of the targets your collator leaves, not of the window's 87.)",
        "number", lambda: _last_label_masked_scale(2),
        "which target reads a row's last label once the model's loss has shifted "
        "the labels? Recount the targets and the labels the count takes, then "
        "divide as the Trainer does", rel_tol=1e-3,
        reasoning=(
            "79 / 83 = 0.9518: the model's loss scores position t on label t + 1, so "
            "a row's last label is a real target; masking it removes one target per "
            "row, N = 87 - 8 = 79, and one label from the count, which takes every "
            "label: 91 - 8 = 83 = 79 + R, R unchanged (no row's first label moved), "
            "so every rank backprops W * S_r / 83 and c = 79 / 83 (the audit: scaled "
            "x0.9518, counted before the shift). A mask moves the count and the "
            "targets together everywhere but at a row's first label: only R, the "
            "first labels counted and never scored, scales the gradient.")),
}
