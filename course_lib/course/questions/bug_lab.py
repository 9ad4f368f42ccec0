"""Chapter 05's graded questions (``notebooks/05_bug_lab.ipynb``)."""

from __future__ import annotations

from functools import cache

from course_lib.core import paths
from course_lib.core.edition import tr
from course_lib.course.grading import Question, check_names

# 05 bug_lab: the checks that compare a step with itself, never with the reference
REFERENCE_FREE = ("accumulation_invariance", "world_size_invariance",
                  "permutation_invariance", "no_sync")


# 05 bug_lab: what a step does when the ranks make different numbers of microbatches
UNEVEN_OUTCOMES = ("right gradient", "wrong gradient", "hang")


# 05 bug_lab: which of rank 1's calls rank 0's gradient sync meets, when a
# logging all_reduce follows every backward on the uneven layout
LOGGED_MEETS = ("rank 1's gradient sync", "rank 1's third logging all_reduce",
                "rank 1's fourth logging all_reduce", "rank 1's all_reduce of n")


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


def _padded_positions(layout: str) -> int:
    """05: N' of padding_counted in one of accumulation_invariance's layouts
    of the parity window (``1x16`` ...): every label position of the padded
    microbatches."""
    from course_lib.core.data import collate, parity_window
    from course_lib.course.api import corpus, load_config
    from course_lib.rank.harness import accumulation_layouts

    cfg = load_config()
    data = corpus(cfg)
    window = parity_window(cfg, data, cfg.train.world_size)
    return sum(int(collate(data, mb)[1].numel())
               for rank in accumulation_layouts(window)[layout] for mb in rank)


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


QUESTIONS: dict[str, Question] = {
    "bug_lab.predict_no_sync_backward_only": Question(
        "On the uneven layout (rank 1 makes more microbatches than rank 0), "
        "no_sync() around the backward only: does the step give the right "
        "gradient, a wrong gradient, or hang?", "choice", "hang",
        "which microbatches sync when the forward runs outside no_sync()? Count "
        "each rank's all-reduces: one returns only when every rank has called "
        "it. Follow rank 1 into its fourth microbatch, when rank 0 has none left",
        options=UNEVEN_OUTCOMES,
        reasoning=(
            "A hang: a forward outside no_sync() arms DDP's sync, so every "
            "microbatch all-reduces its gradients: rank 0 calls 3 all-reduces, rank "
            "1 calls 6. An all-reduce returns only when every rank has called it, and "
            "rank 0, out of microbatches, never calls a fourth: rank 1 waits in it, "
            "alone (in a training loop rank 0's next collective would pair with it, a "
            "mismatch); uneven_microbatches stops it after 10 s and names rank 1.")),
    "bug_lab.predict_join_every_microbatch": Question(
        "The same layout, no no_sync() at all, and the loop wrapped in Join: "
        "the right gradient, a wrong gradient, or hang?", "choice",
        "wrong gradient",
        "under Join, a rank that has run out still joins the others' syncs: what "
        "can it put into a gradient all-reduce, and what does DDP divide the sum "
        "by? Then follow both ranks: does rank 0 ever receive rank 1's last "
        "microbatches, and what does each of rank 1's extra syncs do to what was "
        "synced before?",
        options=UNEVEN_OUTCOMES,
        reasoning=(
            "A wrong gradient, and no hang: Join lets rank 0, out of microbatches, "
            "answer rank 1's last three all-reduces with zeros. But rank 0 keeps what "
            "was synced after microbatch 3 and never receives rank 1's last three, "
            "and each of rank 1's extra syncs averages its whole accumulated gradient "
            "with zeros: both ranks end wrong, and different.")),
    "bug_lab.predict_count_never_reset": Question(
        "A token count kept on the model, never reset between windows: which "
        "checks catch it?",
        "choices", ("trajectory",), "which checks look past the first window?",
        options=check_names,
        reasoning=(
            "On the first window the count is right, so every one-window check "
            "passes; only trajectory runs later windows, where N has grown and the "
            "gradient fades.")),
    "bug_lab.predict_forgot_world_size": Question(
        "W forgotten (each rank backprops S_r / N): of the four checks that "
        "never look at the reference, which catch it?", "choices",
        ("world_size_invariance",),
        "the gradient is the right one times 1/W: which of these comparisons "
        "would see that factor move?", options=REFERENCE_FREE,
        reasoning=(
            "world_size_invariance only. S_r / N is the right gradient times 1/W. "
            "Accumulation and permutation invariance compare layouts at the same W, "
            "which share the factor, and no_sync compares the ranks with each other; "
            "world_size_invariance runs W = 1, 2 and 4, where the factor is 1, 1/2 "
            "and 1/4.")),
    "bug_lab.1": Question(
        "count_never_reset keeps its running count on the model. Suppose every "
        "window holds the same number of supervised tokens. Under plain SGD, "
        "the bug turns the config's constant learning rate lr into a schedule: "
        "what is it at update k? Over trajectory's 5 updates, what is the sum "
        "of the effective learning rates, in units of lr (the rule's: 5)?",
        "number", sum(1 / k for k in range(1, 6)),
        "write the count the step divides by at update k, against the window's "
        "own count that the rule divides by; SGD's update is linear in the "
        "gradient", rel_tol=1e-3,
        reasoning=(
            "With n tokens in every window, the running count at update k is k n, "
            "where the rule divides by n: the gradient is 1 / k of the reference's "
            "at the same weights, and under SGD that is a learning rate lr / k, a "
            "1/k decay that nobody asked for. Over 5 updates: 1 + 1/2 + 1/3 + 1/4 + "
            "1/5 = 137 / 60, about 2.28 lr where the rule takes 5 lr. trajectory, "
            "comparing each update's gradient with the reference at the same "
            "weights, sees a relative error of 1 - 1/k: 0 on update 1, then 0.5, "
            "0.67, 0.75 and 0.8, so it catches the bug from update 2 on.")),
    "bug_lab.2": Question(
        "pad_to_longest_rank at W = 4. Estimate it before any run: at W = 4 "
        "chapter 02 cuts the lengths 16-128 into four bands of equal width, "
        "each rank holds 16 sequences of the parity window from its band, and "
        "uneven_microbatches re-batches them by 384 padded tokens (a "
        "microbatch's rows times its longest row). How many empty microbatches "
        "do the four ranks run, all together (within 2 counts)? Then re-batch "
        "parity_window(cfg, corpus, 4) with uneven_layout and the chapter's "
        "budget, and count them exactly.", "number",
        lambda: _padding(4),
        "a rank whose sequences reach length L fits about 384 // L of them in a "
        "microbatch: count each rank's microbatches from its band, then what "
        "each one lacks against the longest rank", rel_tol=0, abs_tol=2,
        reasoning=(
            "Every rank runs as many microbatches as the longest one. From the "
            "bands' tops, 43, 71, 99 and 128 tokens, a microbatch holds 8, 5, 3 and "
            "3 rows, so 16 sequences make 2, 4, 6 and 6 microbatches: 4 + 2 + 0 + 0 "
            "= 6 empty ones. Re-batched for real the ranks make 2, 4, 5 and 6 (rank "
            "2's shorter sequences fit 4 to a microbatch): 4 + 2 + 1 + 0 = 7.")),
    "bug_lab.3": Question(
        "Log the loss as many training loops do: in your finished "
        "my_step_fixed, after each microbatch's backward, add "
        "dist.all_reduce(s.detach().clone()). On the chapter's uneven layout "
        "(rank 0 makes 3 microbatches, rank 1 makes 6), write each rank's "
        "collectives in order: the k-th call of rank 0 meets the k-th call of "
        "rank 1. Which of rank 1's calls does rank 0's gradient sync meet? Then "
        "audit your version with [\"uneven_microbatches\"] and read the end of "
        "its logs/torchrun.log.", "choice", LOGGED_MEETS[1],
        "rank 0 logs after its first two backwards, and syncs the gradients "
        "inside its third backward, before that microbatch's logging "
        "all-reduce: which call is that for rank 0, and what is rank 1's call "
        "of the same number?", options=LOGGED_MEETS,
        reasoning=(
            "Rank 0 calls log 1, log 2, then its gradient sync inside the third "
            "backward, then log 3 and the count; rank 1 calls log 1 to log 5 before "
            "its sync. So rank 0's third call, the sync of a bucket of 112,480 "
            "numbers, meets rank 1's third logging all_reduce, of one number: gloo "
            "aborts on the size mismatch (torchrun.log: \"Received data size doesn't "
            "match expected size\"), and uneven_microbatches fails, while every other "
            "check passes, since on even ranks the calls pair (with NCCL the mismatch "
            "may hang until the check's 10 s deadline).")),
    "bug_lab.4": Question(
        "Join on uneven ranks, with a flag. Change your finished "
        "my_step_fixed: drop no_sync(), so that every microbatch syncs, and put "
        "the for loop inside with Join([model], "
        "divide_by_initial_world_size=False); the count's all-reduce and the "
        "scaling stay after the with block. With that flag each sync divides by "
        "the number of ranks still running (2, then 1 once rank 0 has run out) "
        "instead of by W = 2. On the chapter's uneven layout, rank 0's gradient "
        "projected on the reference keeps the scale the chapter printed for "
        "join_every_microbatch. Derive rank 1's scale from it; then audit your "
        "version with [\"uneven_microbatches\"] and project each rank's saved "
        "gradient on the reference, as the chapter does.",
        "number", _join_alone_scale,
        "rank 0 keeps A, what was synced when it ran out; rank 1 then adds its "
        "last three microbatches alone, divided by 1, where the reference "
        "divides every microbatch by W: write both ranks and the reference "
        "from A and those three", rel_tol=1e-3,
        reasoning=(
            "Until rank 0 runs out both ranks sync and divide by 2, as in the "
            "chapter: both hold A, and rank 0 keeps it (scale 0.729, as printed). "
            "Rank 1 then syncs alone and divides by 1, so its last three "
            "microbatches h enter whole: rank 1 = A + h, while the reference halves "
            "every microbatch: ref = A + h / 2. So rank 1 = 2 ref - A, scale 2 - "
            "0.729 = 1.271 (the run gives 1.2707): the two ranks' mean is the "
            "reference, and neither rank holds it.")),
    "bug_lab.5": Question(
        "padding_counted divides by N', every label position of the padded "
        "microbatches, instead of N. accumulation_invariance runs the parity "
        "window as 1x16, 2x8, 4x4 and 16x1. By what factor does "
        "padding_counted's gradient change from 1x16 to 16x1 (its gradient at "
        "16x1 over its gradient at 1x16)? Say first what N' is at 16x1, without "
        "a run; then count N' at 1x16 with collate. Why world_size_invariance, "
        "which keeps the same four microbatches of 8 at every W, passes it is "
        "then yours to explain.", "number",
        lambda: _padded_positions("1x16") / _padded_positions("16x1"),
        "its gradient is the reference's times N / N', and the reference is the "
        "same in every layout (the same 32 sequences): compare N' in the two. "
        "collate pads every microbatch to its longest sequence: what is there to "
        "pad in a microbatch of one sequence?",
        rel_tol=1e-3,
        reasoning=(
            "1.297 (2960 / 2283): at 16x1 every microbatch holds one sequence, so "
            "nothing is padded and N' = N = 2283, while at 1x16 each rank's 16 "
            "sequences are padded to its longest, 63 and 124 tokens, so N' = 16 x "
            "(62 + 123) = 2960, the gradient is N / N' = 0.771 times the reference's, "
            "and accumulation_invariance fails. world_size_invariance keeps the same "
            "four microbatches of 8 at W = 1, 2 and 4 (the sequences come sorted by "
            "length, and each rank takes a contiguous slice), so N' = 2736 at every "
            "W: its gradients agree, wrong alike (N / N' = 2445 / 2736 = 0.894), and "
            "it passes; parity sees the factor.")),
}
