"""Chapter 03's graded questions (``notebooks/03_global_denominator.ipynb``)."""

from __future__ import annotations

from functools import cache

from course_lib.course.grading import Question

# 03: the chapter's toy gradients (its optimizer table), as the rule gives them
TOY_GRADIENTS = ((0.5, -1.0, 2.0), (0.3, 0.2, -1.5), (-0.4, 0.9, 1.0))


def _sgd_ratio(update: int, lr: float = 0.1, momentum: float = 0.9,
               decay: float = 0.1) -> float:
    """03: the first weight's trapped move over its right move on ``update``
    (1-based), under torch.optim.SGD's rule, from w = 1: d = g + decay * w,
    buf = momentum * buf + d (buf = d at first), w -= lr * buf."""
    def moves(factor: float) -> list[float]:
        w, buf, out = 1.0, 0.0, []
        for k, grads in enumerate(TOY_GRADIENTS):
            d = factor * grads[0] + decay * w
            buf = d if k == 0 else momentum * buf + d
            w -= lr * buf
            out.append(lr * buf)
        return out
    return moves(0.5)[update - 1] / moves(1.0)[update - 1]


@cache
def _window_tokens(step: int, world_size: int = 2) -> int:
    """03: N of the chapter's window ``step``, counted as the chapter counts
    it: every rank's supervised tokens in its collated microbatches."""
    from course_lib.core import data, model
    from course_lib.course.api import corpus, load_config

    cfg = load_config().with_world_size(world_size)
    sequences = corpus(cfg)
    window = data.make_plan(cfg, sequences, world_size)[step]
    return sum(int(model.count_tokens(data.collate(sequences, ids)[1]))
               for rank in window for ids in rank)


QUESTIONS: dict[str, Question] = {
    "global_denominator.predict_factor": Question(
        "Every rank r backprops its loss sum times one factor c: L_r = c * S_r. "
        "DDP averages the ranks' gradients. Which c makes that average the "
        "gradient of the global token mean, sum_r S_r / N?", "choice", "W / N",
        "write DDP's average (1 / W) * sum_r of the gradient of c * S_r, and "
        "compare it with the gradient of sum_r S_r / N: what must c * (1 / W) "
        "equal?",
        options=("1 / N_r", "1 / N", "W / N", "1 / (W * N)"),
        reasoning=(
            "DDP's average of the ranks' gradients is (1 / W) sum_r c grad S_r, and "
            "the goal is (1 / N) sum_r grad S_r: they agree when c / W = 1 / N, so c "
            "= W / N. 1 / N_r is the mean of means; 1 / N leaves DDP's 1 / W in "
            "place, a gradient W times too small; 1 / (W * N) divides by W twice.")),
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
                 "SGD 1 and Adam 0.5", "SGD 1 and Adam 1"),
        reasoning=(
            "SGD, with or without momentum, is linear in the gradients: half the "
            "gradients, half of every update, 0.5. Adam divides the running mean m "
            "by the square root of the running mean v of the squares; halving every "
            "gradient halves m and sqrt(v) alike, and only Adam's small epsilon "
            "keeps the ratio from being exactly 1.")),
    "global_denominator.1": Question(
        "Three ranks share a window. Ranks 0 and 1 hold 300 and 500 supervised "
        "tokens; rank 2 drew only padding (0 supervised tokens), yet it runs "
        "its forwards and backwards and joins DDP's all-reduce. By what factor "
        "must rank 0 multiply its loss sums?",
        "number", 3 / 800,
        "DDP divides by the number of processes in the all-reduce, whatever "
        "they hold; N counts tokens, not ranks", rel_tol=1e-3,
        reasoning=(
            "The empty rank still joins the all-reduce, so DDP still divides by W "
            "= 3; N = 300 + 500 + 0 = 800. The factor is W / N = 3 / 800 = "
            "0.00375: DDP's average, (1 / 3) (3 / 800) (grad S_0 + grad S_1 + 0), "
            "is grad (S_0 + S_1) / 800. Taking W = 2, the ranks that hold "
            "tokens, would make every gradient two thirds of the right one.")),
    "global_denominator.2": Question(
        "SGD with lr = 0.1, momentum = 0.9 and weight_decay = 0.1 (torch adds "
        "weight_decay * w to the gradient before the momentum), on the chapter's "
        "toy gradients right and trapped, from w = 1. Derive by hand the first "
        "weight's trapped update over its right update on update 1 (its "
        "gradient there is 0.5 under the rule); then run updates_of with this "
        "optimizer to confirm it. What is that ratio on update 3?", "number",
        lambda: _sgd_ratio(3),
        "on update 1 the step is lr * (g + weight_decay * w) in both runs, and "
        "the trap halves g, not the decay term; after that, build the optimizer "
        "as a lambda, as in the chapter's table, and divide updates_of(make, "
        "trapped) by updates_of(make, right)",
        reasoning=(
            "Update 1 by hand: 0.1 * (0.5 + 0.1) = 0.06 under the rule, 0.1 * (0.25 + "
            "0.1) = 0.035 with the trap, a ratio of 0.583, not 0.5: the trap halves "
            "the loss's gradient, not the decay term. After that the weights differ, "
            "so do their decay terms, and momentum carries them along: updates_of "
            "gives 0.583, 0.601 and 0.754 on the first weight. With weight decay the "
            "trap is no longer a halved learning rate, nor any one factor.")),
    "global_denominator.3": Question(
        "post_scale with the clip in the wrong place: every rank backprops its "
        "raw loss sums, and the loop calls clip_grad_norm_(params, "
        "max_norm=1.0) after the window's sync but before multiplying .grad by "
        "W / N. On the chapter's window (W = 2, N = 2283) the right gradient "
        "has norm about 0.74. What is the norm of the gradient the optimizer "
        "gets?",
        "number", 2 / 2283,
        "after DDP's mean, .grad holds sum_r S_r / W: how many times the right "
        "gradient is that, and is its norm above max_norm? Then apply the "
        "scaling", rel_tol=1e-3,
        reasoning=(
            "Before the scaling, .grad holds DDP's mean of the raw sums, N / W = "
            "1141.5 times the right gradient: norm about 841, far above max_norm, so "
            "clipping brings it down to 1.0, and the scaling by W / N then leaves "
            "2 / 2283 = 0.000876, about 840 times shorter than the right 0.74. The "
            "same happens on every step whose raw norm exceeds max_norm, which is "
            "nearly every step: a learning rate silently cut by hundreds; clipped "
            "after the scaling, the norm 0.74 is under max_norm and stays as it is.")),
    "global_denominator.4": Question(
        "Plain SGD after clip_grad_norm_(params, max_norm=1.0). Under the rule "
        "the gradient is [0.9, 1.2], of norm 1.5. With the extra / accumulation "
        "of 2 microbatches, the update's length is what fraction of the "
        "update's length under the rule?", "number", 0.75,
        "clipping rescales a gradient only when its norm exceeds max_norm: "
        "clip each of the two gradients first", rel_tol=1e-3,
        reasoning=(
            "Under the rule the norm, 1.5, exceeds max_norm, so clipping brings the "
            "gradient down to norm 1.0; the trapped gradient's norm, 0.75, is under "
            "max_norm and clipping leaves it alone. SGD's updates are lr times these: "
            "0.75 / 1.0 = 0.75, not 0.5 (had both norms exceeded max_norm, both would "
            "be clipped to 1.0 and the trap would not change the step at all).")),
    "global_denominator.5": Question(
        "Counting first makes every rank wait for an all_reduce before its first "
        "backward. A colleague hides that wait: each window backprops W * S_mb / N "
        "with the N all-reduced during the window before. Set step = 1 in the "
        "parameters cell and run the chapter again; then set N = 2283, window "
        "0's count, and run ddp_average(\"global_token\"). What is the norm of "
        "that gradient divided by the norm of ref, window 1's reference? Predict "
        "it from window 1's count first.", "number",
        lambda: _window_tokens(1) / _window_tokens(0),
        "the stale N changes one factor, W / N, on every microbatch of every "
        "rank: which N does window 1's reference divide by?", rel_tol=1e-3,
        reasoning=(
            "Every microbatch backprops S_mb * W / 2283 where the rule uses W / N_1, "
            "with N_1 = 2337 for window 1: one factor on every component, so the "
            "gradient is the reference times 2337 / 2283 = 1.024, too long although "
            "nothing was divided twice. That factor follows the counts from window "
            "to window, so over a run it reweights the windows: count before the "
            "first backward, or backprop the raw sums and scale after (post_scale)."
        )),
}
