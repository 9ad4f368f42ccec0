"""Chapter 02's graded questions (``notebooks/02_data_and_plan.ipynb``)."""

from __future__ import annotations

from course_lib.course.grading import Question


def _windows_above(per_token: tuple[float, ...], gap: float) -> int:
    """How many windows of the 2-rank plan have a mean of means above the
    token mean by more than ``gap``, when every supervised token of rank r
    has the loss ``per_token[r]``."""
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
    return sum(bias > gap for bias in biases)


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


def _rank0_weight_w4() -> float:
    """At W = 4, a rank-0 token's weight under the mean of means over its
    weight under the token mean, N / (W N_0), from the whole plan's sums."""
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config().with_world_size(4)
    data = corpus(cfg)
    plan = make_plan(cfg, data, 4)
    totals = [sum(len(data.sequences[i]) - 1 for window in plan
                  for mb in window[r] for i in mb) for r in range(4)]
    return sum(totals) / (4 * totals[0])


def _length_count_error() -> float:
    """How much too small the gradient is, as a fraction, when N counts
    len(sequence) instead of the supervised positions (len - 1): R / (N + R)
    over the whole plan, R its sequences. A window of k times as many
    sequences from the same bands has the same value: R cancels."""
    from course_lib.core.data import make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    ids = [i for window in make_plan(cfg, data, cfg.train.world_size)
           for rank in window for mb in rank for i in mb]
    right = sum(len(data.sequences[i]) - 1 for i in ids)
    return len(ids) / (right + len(ids))


# The untrained loss's options: contiguous bands, in nats per token, that
# cover every value a loss can take.
UNTRAINED_BANDS = ((1.5, "under 1.5 nats"), (3.0, "1.5 to 3 nats"),
                   (4.5, "3 to 4.5 nats"), (float("inf"), "over 4.5 nats"))


def _untrained_band() -> str:
    """The band of the chapter's untrained loss: the model at its initial
    weights, in eval mode, on rank 0's first microbatch of the 2-rank plan."""
    import torch

    from course_lib.core import model
    from course_lib.core.data import collate, make_plan
    from course_lib.course.api import corpus, load_config

    cfg = load_config().with_world_size(2)
    data = corpus(cfg)
    inputs, labels = collate(data, make_plan(cfg, data, 2)[0][0][0])
    with torch.no_grad():
        logits = model.build_model(cfg).eval()(inputs)
        loss = float(model.loss_sum(logits, labels) / model.count_tokens(labels))
    return next(band for top, band in UNTRAINED_BANDS if loss < top)


QUESTIONS: dict[str, Question] = {
    "data_and_plan.predict_ratio": Question(
        "Both ranks draw the same number of sequences per window, rank 0 from "
        "lengths 16-64 and rank 1 from 65-128. Over the whole plan, how many "
        "times as many supervised tokens as rank 0 does rank 1 hold? (within "
        "10% counts)", "number", _plan_token_ratio,
        "same number of sequences on both ranks: compare a typical length "
        "of each band", rel_tol=0.1,
        reasoning=(
            "Both ranks draw as many sequences, so the ratio is that of their typical "
            "targets: about 96 in the band 65-128 against about 39 in 16-64, close to "
            "2.5; the plan's exact sums give the answer.")),
    "data_and_plan.predict_labels": Question(
        "The miniature batch [7, 4, 9] and [5, 2] goes through data.collate. "
        "What is the shape of its labels (rows x columns), and how many of "
        "their cells are supervised tokens?", "choice", "2 x 2 and 3",
        "each label is the next token: which position of a row has none? "
        "Count the targets of each row, then pad to the longer one",
        options=("2 x 3 and 5", "2 x 3 and 3", "2 x 2 and 4", "2 x 2 and 3"),
        reasoning=(
            "Each label is the next token, so the last token of a row has no label: "
            "[7, 4, 9] gives the targets [4, 9] and [5, 2] gives [2]. The rows are "
            "padded to the longer one, 2 targets: labels of shape 2 x 2, whose one "
            "padded cell holds IGNORE_INDEX, so 3 supervised tokens.")),
    "data_and_plan.predict_untrained": Question(
        "The untrained model reads rank 0's microbatch. What is its loss, the "
        "mean cross-entropy over the supervised tokens, in nats per token?",
        "choice", _untrained_band,
        "its weights are small and random, so its 32 scores at a position are "
        "nearly equal: what does a guess spread evenly over 32 symbols pay "
        "for the right one?",
        options=tuple(band for _, band in UNTRAINED_BANDS),
        reasoning=(
            "Small random weights give nearly equal scores, so the model spreads "
            "its probability almost evenly over the 32 symbols and pays about "
            "-ln(1/32) = ln 32 = 3.47 nats per token: 3 to 4.5 nats. Its scores "
            "are not exactly equal, which costs a little more (3.67); only "
            "training brings it down, toward the entropy floor, 1.53.")),
    "data_and_plan.1": Question(
        "A made-up loss: in every window, each supervised token of rank 0 has "
        "loss 2.0 and each token of rank 1 has loss 1.0. Write the gap, mean "
        "of means minus global token mean, as a function of rank 0's share "
        "N_0 / N of the window's tokens; then count, from the plan's token "
        "counts (per_window), the windows whose gap exceeds 0.22.",
        "number", lambda: _windows_above((2.0, 1.0), 0.22),
        "the mean of means gives each rank half the say, the token mean "
        "gives rank r its share N_r / N. Below which share of rank 0 does "
        "the gap exceed 0.22?", rel_tol=0,
        reasoning=(
            "The mean of means is (2 + 1) / 2 = 1.5 in every window; the token mean "
            "is (2 N_0 + N_1) / N = 1 + N_0 / N, so the gap is 0.5 - N_0 / N, and "
            "it exceeds 0.22 exactly where rank 0 holds less than 0.28 of the "
            "window's tokens, that is where N_1 / N_0 exceeds 0.72 / 0.28 = 2.571. "
            "`sum(c[0] / sum(c) < 0.28 for c in per_window)` counts 29 of the 100 "
            "windows (the largest gap, 0.2528, is in the window of ratio 3.045); in "
            "each, rank 0's few tokens, which carry the high loss, get half the "
            "say.")),
    "data_and_plan.2": Question(
        "Sequences of lengths 10, 20 and 30 go through data.collate as one "
        "microbatch: what fraction of its label cells is padding?", "number",
        30 / 87, "count the label cells (rows times the widest row's targets), "
        "then the supervised ones (each row's targets)", rel_tol=0.01,
        reasoning=(
            "The widest row has 30 tokens, so 29 targets; three rows padded to 29 "
            "make 87 label cells, of which only 9 + 19 + 29 = 57 are supervised: "
            "30 of the 87 cells, 34%, are padding.")),
    "data_and_plan.3": Question(
        "Suppose N counted len(sequence) per sequence instead of its supervised "
        "positions: the loss sums stay, N grows by one per sequence, so a "
        "window's token mean, and its gradient, is scaled by N / (N + R), R the "
        "window's sequences. Now a config whose windows hold four times as many "
        "sequences, from the same bands: does the window size matter? By what "
        "fraction would a typical window's gradient be too small (0.01 is "
        "1%)? Derive it from the bands "
        "(within 10% counts), then check it against the plan's totals.",
        "number", _length_count_error,
        "write N as R times the mean number of targets per sequence, m: what "
        "is left of R in R / (N + R)? Estimate m from a typical length of each "
        "band", rel_tol=0.1,
        reasoning=(
            "The error is 1 - N / (N + R) = R / (N + R). With m the mean number of "
            "targets per sequence, N = R m, so the error is 1 / (m + 1): R cancels, "
            "and four times as many sequences per window leave it as it is (they "
            "only narrow its wobble from window to window). The bands give m about "
            "(39 + 95.5) / 2 = 67.25, so 1 / 68.25 = 0.0147, a gradient 1.5% too "
            "small; the plan's totals, 215,815 supervised tokens in 3,200 "
            "sequences, give 3200 / 219,015 = 0.0146.")),
    "data_and_plan.4": Question(
        "With world_size = 4 the length range 16-128 splits into four even "
        "bands, and every rank draws as many sequences per window. The mean "
        "of means gives each rank's mean 1/W of the say; the token mean gives "
        "each token 1/N. Over the whole plan, a rank-0 token's weight under "
        "the mean of means is how many times its weight under the token mean? "
        "Estimate it from the bands before any run (within 5% counts); then "
        "set world_size = 4 in the parameters cell, run the chapter again and "
        "compute it from totals (the prose keeps describing W = 2).",
        "number", _rank0_weight_w4,
        "rank 0's mean, 1/W of the say, is shared by its N_0 tokens: a token "
        "weighs 1/(W N_0) there and 1/N under the token mean. Estimate each "
        "N_r from a typical target count of band r", rel_tol=0.05,
        reasoning=(
            "A rank-0 token weighs 1 / (W N_0) under the mean of means and 1 / N "
            "under the token mean, so N / (W N_0) times as much. Every rank draws "
            "as many sequences, so N_r follows a typical target count of band r: "
            "the bands 16-43, 44-71, 72-99 and 100-128 give about 28.5, 56.5, 84.5 "
            "and 113 targets, and (28.5 + 56.5 + 84.5 + 113) / (4 x 28.5) = 2.48. "
            "The plan's sums (totals: 46,564 tokens on rank 0 of 454,121) give "
            "2.438, against 1.727 at W = 2: the more ranks, the narrower rank 0's "
            "band and the shorter its sequences against the mean, so the more its "
            "few tokens are over-weighted.")),
}
