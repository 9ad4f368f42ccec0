"""Chapter 01's graded questions (``notebooks/01_mean_of_means.ipynb``)."""

from __future__ import annotations

from course_lib.course.grading import Question


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


def _plain_average_component(counts: tuple[int, ...] = (36, 12), k: int = 1) -> float:
    """01: component ``k`` of DDP's plain average (the mean of the ranks'
    gradients) for the three-logit classifier at z = 0, each rank's targets
    drawn as the gradient section draws them (seed 1, one ``randint`` per
    rank, rank 0 first): a rank's component is 1/3 minus its fraction of
    class-k targets."""
    from fractions import Fraction

    import torch

    gen = torch.Generator().manual_seed(1)  # torch.manual_seed(1)'s stream
    parts = [Fraction(1, 3) - Fraction(int((torch.randint(3, (n,), generator=gen)
                                            == k).sum()), n) for n in counts]
    return float(sum(parts) / len(parts))


def _targets_for_optimum(theta: float, others: int = 36) -> float:
    """How many +1 targets rank 0 needs, beside ``others`` targets -1 on rank 1,
    for the global mean's gradient to vanish at ``theta``: there theta is the
    token-weighted mean of the targets, (n - others) / (n + others)."""
    return others * (1 + theta) / (1 - theta)


QUESTIONS: dict[str, Question] = {
    "mean_of_means.predict_mom": Question(
        "Rank 0: 12 tokens of loss 1; rank 1: 36 tokens of loss 3. "
        "The mean of the two local means?", "number", 2.0,
        "average the two local means, one per rank",
        reasoning=(
            "The local means are 1 and 3; DDP averages the two means, so 2, whatever "
            "the counts behind them.")),
    "mean_of_means.predict_global": Question(
        "Same ranks: the mean over all 48 tokens?", "number", 2.5,
        "add every token's loss, then divide by every token",
        reasoning=(
            "The 48 tokens sum to 12 * 1 + 36 * 3 = 120, and 120 / 48 = 2.5: the busy "
            "rank's tokens pull the mean toward its loss of 3.")),
    "mean_of_means.1": Question(
        "Rank 0 holds 20 tokens of loss 2; every token of rank 1 has loss 1. "
        "How many tokens must rank 1 hold for the mean of means to exceed the "
        "global token mean by exactly 0.3?", "number", 80,
        "which of the two means moves when rank 1's count changes? Find the "
        "global mean that the gap asks for, then the count that gives it",
        reasoning=(
            "The mean of means does not depend on the counts: the local means stay 2 "
            "and 1, so it is 1.5 whatever rank 1 holds. A gap of 0.3 asks for a "
            "global mean of 1.2 = (20 * 2 + n * 1) / (20 + n), so 24 + 1.2 n = 40 + n "
            "and n = 80. The bias is positive, where the 12/36 example's was "
            "negative: the mean of means leans toward the small rank's loss, here "
            "the larger one.")),
    "mean_of_means.2": Question(
        "From the start position (12 tokens of loss 1, 36 of loss 3), raise W "
        "to 3: rank 2 comes in with 24 tokens of loss 2. Rank 0 keeps its loss "
        "of 1: how many tokens must it hold for the bias (mean of means - "
        "global mean) to vanish? Derive it, then set the slider to check.",
        "number", lambda: _explorer_balance(3),
        "the counts do not move the mean of means; find the count that brings "
        "the global mean to it",
        reasoning=(
            "The mean of means weighs the three ranks alike: (1 + 3 + 2) / 3 = 2, "
            "whatever the counts. With n tokens on rank 0 the global mean is "
            "(n + 108 + 48) / (n + 60); it equals 2 when n + 156 = 2n + 120, so "
            "n = 36. Rank 2's tokens already sit at 2, so rank 0's tokens of loss 1 "
            "must balance rank 1's tokens of loss 3: the ranks still hold 36, 36 "
            "and 24 tokens, and the bias hides.")),
    "mean_of_means.3": Question(
        "The gradient section with its counts swapped: after "
        "torch.manual_seed(1), rank 0 draws 36 targets and rank 1 draws 12 "
        "(one torch.randint per rank, rank 0 first), the same 48 targets cut "
        "the other way. What is the class-1 component (the second) of DDP's "
        "plain average, the mean of the two ranks' gradients? Count each "
        "rank's targets per class, then apply the rule.", "number",
        _plain_average_component,
        "a rank's component is 1/3 minus its own fraction of class-1 "
        "targets, and DDP gives the two ranks the same say whatever their "
        "counts", abs_tol=1e-3,
        reasoning=(
            "The draw gives rank 0 13, 10 and 13 targets of classes 0, 1 and 2, "
            "and rank 1 6, 0 and 6: their class-1 components are 1/3 - 10/36 = "
            "1/18 and 1/3 - 0/12 = 1/3, and DDP's plain average is 7/36 = 0.1944 "
            "(0.1111 with the counts 12 and 36). The 48 targets are the same (one "
            "stream, cut at 36 instead of 12), so the 48-token mean's component "
            "stays 1/3 - 10/48 = 0.125: only the mean of means moves with the split.")),
    "mean_of_means.predict_gradient": Question(
        "At z = 0 the gradient of a mean over targets is, for class k, 1/3 "
        "minus the fraction of those targets equal to k. From each rank's "
        "counts per class: the first component of the gradient of the mean "
        "over all 48 tokens?", "number", -0.0625,
        "count the class-0 targets of both ranks together, then take their "
        "fraction of all 48 targets", abs_tol=1e-3,
        reasoning=(
            "Class 0 holds 3 of rank 0's targets and 16 of rank 1's, 19 of the 48, "
            "so the first component is 1/3 - 19/48 = -3/48 = -0.0625. It is also "
            "the token-share mix of the ranks' own gradients, "
            "1/4 * (1/3 - 3/12) + 3/4 * (1/3 - 16/36) = 1/4 * 1/12 - 3/4 * 1/9.")),
    "mean_of_means.predict_theta_mom": Question(
        "Theta example: at which theta is the mean-of-means gradient zero?",
        "number", 0.0, "each rank's mean pulls toward its own target, +1 or -1",
        reasoning=(
            "Each rank's mean pulls toward its own target, +1 or -1, and the mean of "
            "means gives each rank the same weight: the pulls cancel halfway, at 0.")),
    "mean_of_means.predict_theta_global": Question(
        "At which theta is the global gradient zero?", "number", -0.5,
        "the token-weighted average of the targets: 12 of +1, 36 of -1",
        reasoning=(
            "The token mean's minimum is the token-weighted mean of the targets, each "
            "rank's share of the tokens applied to its target: 1/4 * (+1) + 3/4 * (-1) "
            "= -0.5.")),
    "mean_of_means.4": Question(
        "Theta example, rank 1 keeps its 36 targets -1: how many targets +1 "
        "must rank 0 hold for the global gradient to vanish at theta = -0.2? "
        "Derive n, then check it with widgets.ThetaExplorer(theta=-0.2, "
        "counts=(n, 36)), or without a kernel widgets.theta_state(-0.2, "
        "counts=(n, 36)).",
        "number", lambda: _targets_for_optimum(-0.2),
        "where the global gradient vanishes, theta is the token-weighted "
        "average of the targets",
        reasoning=(
            "The global gradient vanishes where theta is the token-weighted mean of "
            "the targets, (n - 36) / (n + 36). Setting it to -0.2 gives 1.2 n = 28.8, "
            "so n = 24.")),
    "mean_of_means.5": Question(
        "Theta example: rank 0 keeps its 12 targets +1; rank 1 holds 36 "
        "targets, 18 of them -1 and 18 equal to t. Which t makes the two "
        "ranks' gradients equal at every theta? Set it in the cell and run "
        "it: the losses differ, the gradients agree.", "number", 3.0,
        "a rank's gradient, 2 (theta - its mean target), depends on its "
        "targets only through their mean",
        reasoning=(
            "A rank's gradient is 2 (theta - m_r), with m_r the mean of its "
            "targets; rank 0's is 1, rank 1's is (t - 1) / 2, equal when t = 3. "
            "Rank 1's targets then spread around 1, so its loss is larger by their "
            "variance (4): the two objectives report different losses, yet any mix "
            "of two equal gradients is that gradient, so they train alike.")),
}
