"""Chapter 09's graded questions (``notebooks/09_choose_the_unit.ipynb``)."""

from __future__ import annotations

from functools import cache

from course_lib.course.grading import Question, check_names


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


QUESTIONS: dict[str, Question] = {
    "choose_the_unit.predict": Question(
        "Under the sequence mean, on the parity window (rank 0's sequences drawn "
        "from 16-64 tokens, rank 1's from 65-128): a token of the window's "
        "shortest sequence weighs how many times what a token of its longest "
        "weighs? (within 15% counts)", "number", lambda: _length_bias(2),
        "a sequence's tokens share one sequence's weight: how does a token's "
        "share grow as its sequence gets shorter?", rel_tol=0.15,
        reasoning=(
            "Under the sequence mean each of the K sequences gets the same total "
            "weight, shared among its n_s tokens: a token weighs 1 / (K n_s). The "
            "ratio is the longest supervised count over the shortest, 123 / 16 = "
            "7.69 on the parity window (the bands alone give about 128 / 16 = 8).")),
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
                 "penalty_on_rank_zero"),
        reasoning=(
            "Only penalty_every_microbatch. Added on every microbatch, the penalty "
            "counts M times, and accumulation_invariance changes M. The two others "
            "add it once per rank whatever M is (W times too strong, or on one rank "
            "only and divided by W in DDP's mean): only a reference, parity, sees "
            "them.")),
    "choose_the_unit.predict_packed": Question(
        "Packed rows, rows_as_documents: the sequence rule run unchanged, each "
        "row one sequence. One row holds a lone document of 12 tokens, another "
        "two documents, of 3 and 9 tokens. The 3-token document weighs what "
        "fraction of the lone one (a document's weight: the sum of its tokens' "
        "weights)?", "number", (3 / (3 + 9)) / (12 / 12),
        "each row gets one share, spread evenly over the row's tokens: what part "
        "of its row's tokens does each document hold?", rel_tol=1e-6,
        reasoning=(
            "A quarter, 0.25. The sequence rule gives every row the same weight, "
            "spread evenly over the row's tokens, so a document weighs its part of "
            "its row's tokens: 12 of 12 for the lone document, 3 of 3 + 9 = 12 for "
            "the short one, where the document objective gives every document the "
            "same weight. The packed rows hold from 1 to 4 documents of unequal "
            "lengths, so rows_as_documents fails parity; on rows of one sequence the "
            "same rule is exact, as the sequence objective's audit showed.")),
    "choose_the_unit.predict_rl": Question(
        "On the skewed window, against the advantage-weighted token mean: what "
        "are TRL's grpo, dr_grpo and dapo (steps_per_generation = GA)? Each "
        "option gives the three verdicts in that order, grpo / dr_grpo / dapo.",
        "choice", "biased / scaled / exact",
        "which of them averages each completion first, which divides by a "
        "number fixed in advance, and which counts the window's tokens?",
        options=("exact / exact / exact", "biased / scaled / exact",
                 "scaled / exact / biased", "biased / exact / scaled",
                 "exact / biased / exact"),
        reasoning=(
            "grpo averages each completion's tokens, then the completions: the "
            "sequence mean, biased for the token mean when the completions' lengths "
            "differ. dr_grpo divides the sum by a constant: every token weighs the "
            "same, times N / C, a scale. dapo divides by the window's token count, "
            "all-reduced: exact while steps_per_generation = GA.")),
    "choose_the_unit.1": Question(
        "W = 2, the weighted objective: the class weights of rank 0's supervised "
        "tokens sum to 2,100, rank 1's to 600. Each rank divides its weighted "
        "loss sum by its own sum of weights, and DDP averages the two ranks. A "
        "rank-1 token then weighs how many times what the weighted mean gives "
        "it?", "number", 2700 / 1200,
        "the weighted mean gives a token of class weight w the weight w / (sum "
        "of every weight); what does it get once its rank divides by its own "
        "sum and DDP by W?", rel_tol=1e-6,
        reasoning=(
            "The weighted mean gives a token of weight w the share w / 2,700. Divided "
            "by its rank's own sum, a rank-1 token gets w / 600, and DDP's mean over "
            "W = 2 halves it: w / 1,200, so 2,700 / 1,200 = 2.25 times its weight "
            "(and a rank-0 token 2,700 / 4,200 = 0.64). It is chapter 01's mean of "
            "rank means, with the sum of class weights as the count: the fix is the "
            "same, all-reduce the sum before dividing.")),
    "choose_the_unit.2": Question(
        "Dr. GRPO divides the step's loss sum by a constant C: the optimizer "
        "step's number of completions times the maximum completion length. A "
        "job was set up on 4 ranks x 2 microbatches x 8 completions, at most 512 "
        "tokens each, with that C. It moves to 8 ranks (still 2 microbatches of "
        "8 completions each) and completions of up to 1,024 tokens, and its "
        "config keeps the old C (a stack that reads C from its config; TRL's "
        "dr_grpo recomputes B·L_max and would adapt). Each update is then "
        "the right Dr. GRPO update times what factor?", "number",
        (8 * 2 * 8 * 1024) / (4 * 2 * 8 * 512),
        "work out the C the new job should use, then compare the two "
        "normalizers of the same loss sum", rel_tol=1e-9,
        reasoning=(
            "C covers the whole optimizer step: 4 * 2 * 8 = 64 completions at 512 "
            "tokens, 32,768, in the old job; 8 * 2 * 8 = 128 completions at 1,024 "
            "tokens, 131,072, in the new one. The same loss sum divided by the old "
            "C is 131,072 / 32,768 = 4 times the right update, at every step: a "
            "learning rate 4 times too large for SGD.")),
    "choose_the_unit.3": Question(
        "At PaLM's strength, zloss:0.0001, audited in float64 (dtype='float64'), "
        "where the rule's error is rounding alone: which checks catch "
        "zloss_mean_per_microbatch (this cell prints its source)? Predict first, from "
        "what each check varies; then audit it with every check (the skeleton "
        "in this cell).", "choices",
        ("parity", "trajectory", "accumulation_invariance", "permutation_invariance",
         "uneven_microbatches"),
        "the wrong term divides each microbatch's z sum by that microbatch's own "
        "token count: which checks put the sequences into other microbatches, "
        "and which keep every microbatch as it is?",
        options=check_names,
        reasoning=(
            "In float64 the wrong term, about 1e-6 of the gradient, is a million "
            "times the tolerance (atol 1e-12): parity sees it against the reference, "
            "and so does every check that puts the sequences into other microbatches "
            "(trajectory's new windows, accumulation_invariance's other splits, "
            "permutation_invariance's other ranks, uneven_microbatches' token budget), "
            "since each microbatch's z mean moves with its tokens. world_size_invariance "
            "keeps the same microbatches and only spreads them over 1, 2 or 4 ranks, "
            "where each still weighs 1 / (the window's microbatches), and no_sync "
            "checks a sync that is right: both pass. In float32 the same error sits "
            "near the tolerance's floor (atol 1e-6 plus rtol 1e-4 times the "
            "reference), flagged only at entries whose reference is small, so there "
            "rounding decides which checks flag it: audit a small term in float64.")),
    "choose_the_unit.4": Question(
        "TRL's dapo divides each optimizer step's loss sum by the generation "
        "batch's token count times GA / steps_per_generation. With "
        "steps_per_generation = 2 GA, the two steps of one generation batch "
        "train 300 and 500 tokens. Step 1's gradient is "
        "its own token mean's times what factor? (Then work out step 2's: over "
        "the two steps, which tokens count more?)", "number", 300 / 400,
        "the generation batch holds both steps' tokens: what does step 1 divide "
        "by, and what would its own token mean divide by?", rel_tol=1e-6,
        reasoning=(
            "The generation batch holds 300 + 500 = 800 tokens, and each step divides "
            "by half of them, 400; step 1's own token mean divides by 300. The factor "
            "is 300 / 400 = 0.75 (step 2's is 500 / 400 = 1.25): each step is a "
            "uniform scale of its own token mean, and over the run the steps are "
            "reweighted.")),
    "choose_the_unit.5": Question(
        "The chapter's packed window (document:128), under rows_as_documents "
        "(the sequence rule, each row one sequence): the heaviest document of "
        "the window weighs how many times the lightest (a document's weight: "
        "the sum of its tokens' weights)? The document objective makes it 1.",
        "number", lambda: _document_weight_ratio(128), "collate every "
        "microbatch of both ranks with packing, weigh the tokens with "
        "objectives.token_weights(objectives.parse('sequence'), labels), and "
        "sum them per document (objectives.documents)", rel_tol=1e-3,
        reasoning=(
            "rows_as_documents gives each row one share, spread over its tokens, so "
            "a document weighs (its tokens / its row's tokens) / K: a long document "
            "alone in its row is heavy, a short one among several is light. On the "
            "parity window packed into rows of 128 the heaviest over the lightest "
            "is 8.33, where the document objective gives every document the same "
            "weight (a ratio of 1): that spread is why rows_as_documents fails "
            "parity. (Wider rows do not help: a width of 256 gives 8.64, and the "
            "audit refuses it, since the model has 128 positions.)")),
}
