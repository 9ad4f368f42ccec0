"""Chapter 04's graded questions (``notebooks/04_ddp_parity.ipynb``)."""

from __future__ import annotations

from functools import cache

from course_lib.course.grading import Question, from_run

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


# 04: the supervised tokens the prediction adds to rank 1
GROWN = 500


def _mom_weight(rank: int, world_size: int, grow: tuple[int, ...] = ()) -> float:
    """04: a token of ``rank`` under the mean of means weighs 1 / (W N_r); in
    units of its due 1 / N, that is N / (W N_r). ``grow``: tokens added to
    each rank first."""
    counts = [n + (grow[r] if r < len(grow) else 0)
              for r, n in enumerate(_rank_tokens(world_size))]
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


QUESTIONS: dict[str, Question] = {
    "ddp_parity.predict": Question(
        "On the parity window (W = 2), rank 1 draws 500 more supervised tokens "
        "and rank 0 keeps its own. Under the mean of means, what multiple of "
        "its due weight 1 / N does a rank-0 token get then?", "number",
        lambda: _mom_weight(0, 2, grow=(0, GROWN)),
        "under the mean of means a token of rank r weighs 1 / (W * N_r), and its "
        "due is 1 / N: which of the two does rank 1's growth change?",
        rel_tol=0.01,
        reasoning=(
            "Under the mean of means a rank-0 token weighs 1 / (W N_0) = 1 / (2 * "
            "721), whatever rank 1 holds; its due, 1 / N, shrinks as N grows from "
            "2283 to 2783. The ratio N / (W N_0) = 2783 / 1442 is about 1.93, up from "
            "1.58: growing the long rank over-weights the short one further, and a "
            "rank-1 token falls from 0.73 to 2783 / 4124, about 0.67, of its due.")),
    "ddp_parity.predict_loss_gap": Question(
        "The skewed scenario (12 and 36 tokens) on the real, untrained model: "
        "how far apart are the mean of means and the global mean of its "
        "losses?", "choice",
        from_run("course_lib.jobs.exercise:ExerciseReport", _loss_gap_band),
        "with two ranks the gap is (1/2 - N_0 / N) times the difference of the "
        "two local means: how different are an untrained model's losses per "
        "token on two ranks?", options=LOSS_GAP_BANDS,
        reasoning=(
            "With two ranks, mean of means - global mean = (1/2 - N_0 / N)(m_0 - "
            "m_1), m_r the local means, and 12 and 36 tokens make the factor 1/4: "
            "the hand example's means 1 and 3 give 0.5. The untrained model sits "
            "near the uniform guess on every token (local means about 3.57 and "
            "3.58), so the gap is about 0.003 nat, under 0.05 nat. The gradients "
            "still differ far beyond the tolerance, since the mean of means "
            "reweights every token whatever its loss.")),
    "ddp_parity.1": Question(
        "Launch the by-hand script on 3 ranks (--nproc-per-node=3): its parity "
        "window then holds other sequences. Under the mean of means, the tokens "
        "of which ranks weigh more than their due 1 / N?", "choices",
        lambda: _overweighted(3),
        "a token of rank r weighs 1 / (W * N_r) under the mean of means: "
        "compare each rank's count with an even share, N / W",
        options=("rank 0", "rank 1", "rank 2"),
        reasoning=(
            "At W = 3 the by-hand script prints N = 3363 tokens, per rank [559, "
            "1090, 1714]: an even share is N / 3 = 1121. The mean of means weighs a "
            "rank-r token N / (W N_r) times its due: about 2.01, 1.03 and 0.65. "
            "Ranks 0 and 1 hold less than an even share, so both are over-weighted, "
            "rank 1 only just; rank 2 is under-weighted.")),
    "ddp_parity.2": Question(
        "Keep rtol = 1e-4 and raise atol only: on the components sampled in "
        "report.grad_sample, the smallest atol that lets the mean of means "
        "pass?", "number",
        from_run("course_lib.jobs.parity:ParityReport", _atol_to_pass),
        "solve the allclose inequality for atol, one component at a time: the "
        "worst component decides", rel_tol=0.05,
        reasoning=(
            "allclose passes a component when |err| <= atol + rtol * |ref|, so each "
            "sampled component needs atol >= |err| - rtol * |ref|; the worst "
            "component sets the smallest atol.")),
    "ddp_parity.3": Question(
        "The 12 -> 36 experiment with rank 1 at 13 tokens, one more than rank "
        "0, and atol raised a thousandfold, to 1e-3 (rtol stays 1e-4): does the "
        "mean of means pass the gradient check? Run it, and read its largest "
        "error and its failing components.", "choice", "no",
        "a token's weight moves by about 4%: how large is 4% of the largest "
        "gradient components, next to 1e-3? The run's max_abs_err says",
        options=("yes", "no"),
        reasoning=(
            "No: with 12 and 13 tokens N = 25, and the mean of means weighs a "
            "rank-0 token 1/24 and a rank-1 token 1/26 instead of 1/25, about 4% "
            "off. Its gradient misses the reference by 3.7% of its length, with a "
            "largest error of 9.19e-03: 569 of the 112,480 components still fail "
            "at atol = 1e-3. Only a tolerance ten thousand times the default, "
            "1e-2, would let one token of imbalance through.")),
    "ddp_parity.4": Question(
        "Two ranks join the skewed scenario (12 and 36 tokens), so W = 4, but "
        "their microbatches hold no supervised token (all prompt); they run "
        "their forward and backward like the others. Under the mean of means, "
        "after DDP's sync, what multiple of its due weight 1 / N does a rank-1 "
        "token get?", "number", 1 / 3,
        "an empty rank's loss is 0 / 0 = NaN, but what does its .grad hold? Run "
        "the commented lines; then write what DDP sums, what it divides by, and N",
        rel_tol=0.01,
        reasoning=(
            "1/3: ranks 2 and 3 backprop 0 / 0, a NaN loss, yet their gradient is "
            "exactly zero (cross_entropy's backward writes 0 for every ignored "
            "label), and DDP still divides the sum by W = 4. Every rank holds "
            "(grad S_0 / 12 + grad S_1 / 36) / 4, so a rank-1 token weighs "
            "1 / (4 * 36) = 1/144 where its due is 1 / N = 1/48, a third (two thirds "
            "on two ranks), and a rank-0 token 48 / (4 * 12) = 1, its due by "
            "coincidence. The token rule is unchanged: 4 * S_r / 48, divided by 4.")),
    "ddp_parity.5": Question(
        "Break the by-hand script: move its forward, s = loss_sum(model, "
        "inputs, labels), out of the with block, so that no_sync() wraps only "
        "the scaling and loss.backward(). On the same two ranks, what does the "
        "broken script print for global_token? Predict, then run it.",
        "choice", "PASS",
        "DDP arms a backward's sync during the forward: which microbatches now "
        "sync, and does averaging again a part that every rank already holds "
        "alike change it?", options=("PASS", "FAIL", "the job hangs"),
        reasoning=(
            "PASS, and the mean of means still fails (exit code 0): the forward now "
            "runs outside no_sync(), so DDP arms the sync in both microbatches and "
            "each rank all-reduces twice, the syncs pairing since both ranks make "
            "two microbatches. The first sync averages the first microbatch's "
            "gradients; the second averages the whole .grad, whose first part every "
            "rank already holds alike, so that part stays as it is and the second "
            "part gets averaged: the sum of the averages is the average of the sums. "
            "Only the communication is wasted, and a gradient check cannot see it.")),
}
