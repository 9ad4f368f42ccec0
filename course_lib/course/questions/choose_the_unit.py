"""Chapter 09's graded questions (``notebooks/09_choose_the_unit.ipynb``)."""

from __future__ import annotations

from functools import cache

from course_lib.core import paths
from course_lib.core.edition import tr
from course_lib.course.grading import Question, check_names


@cache
def _longest_sequence_weight(world_size: int = 2) -> float:
    """09: under the sequence mean, a token of the parity window's longest
    sequence weighs 1 / (K n_s), the token mean gives it 1 / N: the ratio is
    N / (K n_s), the mean supervised length over that sequence's."""
    from course_lib.core.data import parity_window
    from course_lib.course.api import corpus, load_config

    cfg = load_config()
    data = corpus(cfg)
    counts = [len(data.sequences[i]) - 1 for rank in parity_window(cfg, data, world_size)
              for mb in rank for i in mb]
    return sum(counts) / (len(counts) * max(counts))


def _zloss_audits() -> dict:
    """09, exercise 3: each check's verdict on zloss_mean_per_microbatch in
    float32 and in float64, read from the learner's two audits
    (``units/zloss-float32`` and ``units/zloss-float64`` of the run)."""
    from course_lib.jobs.audit import AuditReport

    found = {}
    for dtype in ("float32", "float64"):
        out = paths.default_out("course") / "units" / f"zloss-{dtype}"
        name = AuditReport.file_name("zloss_mean_per_microbatch")
        if not AuditReport.exists(out, name):
            raise FileNotFoundError(tr("run the chapter's job first: no {name}.json yet")
                                    .format(name=f"units/zloss-{dtype}/{name}"))
        found[dtype] = AuditReport.load(out, name).checks
    return found


def _hidden_by_float32() -> tuple[str, ...]:
    """09, exercise 3 (b): the checks that fail zloss_mean_per_microbatch in
    float64 and pass it in float32."""
    found = _zloss_audits()
    return tuple(c for c, r in found["float64"].items()
                 if not r.passed and found["float32"][c].passed)


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


@cache
def _dr_grpo_scale(world_size: int = 2) -> float:
    """09: a token's weight under TRL's dr_grpo on the parity window, after
    DDP's mean, over the token mean's 1 / N (every token weighs the same)."""
    from course_lib.core.data import collate, parity_window
    from course_lib.core.model import supervised_mask
    from course_lib.course.api import corpus, load_config
    from course_lib.steps.rl_recipes import trl_token_weights

    cfg = load_config()
    data = corpus(cfg)
    per_rank = [[collate(data, ids)[1] for ids in rank]
                for rank in parity_window(cfg, data, world_size)]
    weights = trl_token_weights("dr_grpo", per_rank)
    labels = [lb for rank in per_rank for lb in rank]
    found = [w[supervised_mask(lb)] for w, lb in zip(weights, labels, strict=True)]
    n = sum(int(f.numel()) for f in found)
    return float(max(f.max() for f in found)) * n


QUESTIONS: dict[str, Question] = {
    "choose_the_unit.predict": Question(
        "Under the sequence mean, on the parity window (32 sequences, rank 0's "
        "drawn from 16-64 tokens, rank 1's from 65-128): a token of the window's "
        "longest sequence weighs what fraction of what the token mean gives it "
        "(its weight times N)? (within 15% counts)", "number",
        lambda: _longest_sequence_weight(2),
        "under the sequence mean a token of sequence s weighs 1 / (K n_s), under "
        "the token mean 1 / N: write their ratio with N / K, the mean supervised "
        "length, and estimate both lengths from the bands", rel_tol=0.15,
        reasoning=(
            "Under the sequence mean each of the K sequences gets the same total "
            "weight, shared among its n_s tokens: a token weighs 1 / (K n_s), which is "
            "N / (K n_s) times the token mean's 1 / N, the mean supervised length over "
            "its own. The bands give a mean length near (40 + 96) / 2 = 68 and a longest "
            "sequence near 127 tokens: about 0.54. On the window itself, 2283 / 32 = "
            "71.3 over 123, 0.580: the longest sequence's tokens count little more "
            "than half of what the token mean gives them, the shortest's 4.46 times.")),
    "choose_the_unit.predict_penalty": Question(
        "Three ways to place the L2 penalty wrongly: penalty_every_microbatch "
        "(weight 1 on every microbatch), penalty_times_world_size (W on each "
        "rank's last microbatch) and penalty_on_rank_zero (1 on rank 0's last "
        "microbatch alone). world_size_invariance runs the same 4 microbatches "
        "on 1, 2 and 4 ranks and compares the gradients with each other, with "
        "no reference. Which of the three does it catch?", "choices",
        ("penalty_every_microbatch", "penalty_times_world_size", "penalty_on_rank_zero"),
        "after DDP's mean over W ranks, how many times does each placement count "
        "the penalty, as W goes 1, 2, 4 with 4 / W microbatches per rank?",
        options=("penalty_every_microbatch", "penalty_times_world_size",
                 "penalty_on_rank_zero"),
        reasoning=(
            "All three: after DDP's mean, penalty_every_microbatch counts the penalty "
            "4 / W times (once on each of a rank's 4 / W microbatches: 4, 2, then 1), "
            "penalty_times_world_size W times and penalty_on_rank_zero 1 / W times, so "
            "each count moves with W and the three layouts' gradients differ. "
            "accumulation_invariance, which changes only "
            "the microbatches per rank, catches penalty_every_microbatch alone: the "
            "two others add the penalty once per rank whatever that number is.")),
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
        "On the skewed window (the parity window: 32 completions, N = 2283 "
        "tokens) with L_max = 128: TRL's dr_grpo gradient is the "
        "advantage-weighted token mean's times what factor?", "number",
        lambda: _dr_grpo_scale(2),
        "dr_grpo divides every token's term by the same W·M·B·L_max; the token "
        "mean divides it by N: what is the ratio of the two weights?", rel_tol=0.01,
        reasoning=(
            "After DDP's mean every token weighs 1 / (W·M·B·L_max), the same for "
            "all, where the token mean gives 1 / N: a uniform scale, N / "
            "(W·M·B·L_max), the mean completion length over L_max. With 32 "
            "completions and L_max = 128 that is 2283 / 4096 = 0.557 on the skewed "
            "window (512 / 4096 = 0.125 on the balanced one): another step size, "
            "one that moves with N from window to window.")),
    "choose_the_unit.1": Question(
        "W = 2, the weighted objective. Rank 0 holds 1,000 supervised tokens "
        "whose class weights sum to 2,100, rank 1 holds 300 whose weights sum "
        "to 600. A step reuses the token mean's rule: it all-reduces the token "
        "count N, not the sum of weights, and each rank backprops W times its "
        "weighted loss sum over N. Against the weighted mean, a token of class "
        "weight w then weighs how many times as much?", "number", 2700 / 1300,
        "write a token's weight under each, after DDP's mean: w over the "
        "window's sum of weights for the objective, and for the step? Then ask "
        "whether the factor depends on the rank", rel_tol=1e-3,
        reasoning=(
            "The weighted mean gives a token of weight w the share w / 2,700, and the "
            "step W · w / N on its rank, which DDP's mean over W leaves at w / N = "
            "w / 1,300 on either rank: every weight is multiplied by 2,700 / 1,300 = "
            "2.08, the window's mean class weight. The gradient is scaled, not biased "
            "(chapter 08's verdicts), but the factor moves with each window's mix of "
            "classes, so over a run the windows are reweighted: all-reduce the sum of "
            "weights, in float64, and divide by it.")),
    "choose_the_unit.2": Question(
        "Dr. GRPO divides the step's loss sum by a constant C: the optimizer "
        "step's number of completions times the maximum completion length. A "
        "job was set up on 4 ranks x 2 microbatches x 8 completions, at most 512 "
        "tokens each, with that C. It moves to 8 ranks (still 2 microbatches of "
        "8 completions each) and completions of up to 1,024 tokens, and its "
        "config keeps the old C (a stack that reads C from its config; TRL's "
        "dr_grpo recomputes its completions per microbatch times the maximum "
        "completion length, and would adapt). Under SGD, each update is then the "
        "right Dr. GRPO update times what factor? Then, from chapter 03, before "
        "you check: would the same stale C change a run under Adam?", "number",
        (8 * 2 * 8 * 1024) / (4 * 2 * 8 * 512),
        "work out the C the new job should use, then compare the two "
        "normalizers of the same loss sum", rel_tol=1e-9,
        reasoning=(
            "C covers the whole optimizer step: 4 * 2 * 8 = 64 completions at 512 "
            "tokens, 32,768, in the old job; 8 * 2 * 8 = 128 completions at 1,024 "
            "tokens, 131,072, in the new one. The same loss sum divided by the old "
            "C is 131,072 / 32,768 = 4 times the right update, at every step: a "
            "learning rate 4 times too large for SGD. Under Adam the factor cancels "
            "(up to its epsilon): Adam divides each update by the gradient's own "
            "running size, so the stale C hides, as chapter 03's constant factor "
            "did; clipping or a coupled weight decay can show it again.")),
    "choose_the_unit.predict_float64": Question(
        "Exercise 3 (a), derived before you run the audits: "
        "zloss_mean_per_microbatch at zloss:0.0001, audited with every check "
        "in float64, where a right rule leaves only rounding. Which checks fail "
        "it?",
        "choices", ("parity", "trajectory", "accumulation_invariance",
                    "permutation_invariance", "uneven_microbatches"),
        "the wrong part weighs a token's z by 1 / (W M n_mb): which checks put "
        "the tokens into other microbatches, and so move each microbatch's z "
        "mean?",
        options=check_names,
        reasoning=(
            "In float64 the wrong term, about 1e-6 of the gradient, is a million "
            "times the tolerance (atol 1e-12): parity fails, and so does every check "
            "that puts the sequences into other microbatches (trajectory, "
            "accumulation_invariance, permutation_invariance, uneven_microbatches), "
            "since each microbatch's z mean moves with its tokens. "
            "world_size_invariance keeps the same microbatches over 1, 2 or 4 ranks, "
            "and no_sync checks a sync that is right: both pass. The float64 audit "
            "of the exercise measures the same list.")),
    "choose_the_unit.3": Question(
        "zloss_mean_per_microbatch (this cell prints its source) at PaLM's "
        "strength, zloss:0.0001, audited with every check in float64 and in "
        "float32. (a) Derive, before you run: which checks fail it in float64, "
        "where a right rule leaves only rounding? Ask whether a check's layouts "
        "change which tokens share a microbatch, and so each microbatch's z "
        "mean. Write your list, then run the two audits: the float64 one checks "
        "it. (b) Measured, not derived: of those checks, which pass it in "
        "float32? The z-loss section held the wrong part against float32's "
        "tolerance for parity alone, at 0.827 of it, and each check compares "
        "its own gradients.",
        "choices", _hidden_by_float32,
        "for (a), the wrong part weighs a token's z by 1 / (W M n_mb): which "
        "checks change the tokens a microbatch holds? For (b), compare your two "
        "audits check by check",
        options=check_names,
        reasoning=(
            "(a) In float64 the wrong term, about 1e-6 of the gradient, is a million "
            "times the tolerance (atol 1e-12): parity fails, and so does every check "
            "that puts the sequences into other microbatches (trajectory, "
            "accumulation_invariance, permutation_invariance, uneven_microbatches), "
            "since each microbatch's z mean moves with its tokens; "
            "world_size_invariance keeps the same microbatches over 1, 2 or 4 ranks "
            "and no_sync checks a sync that is right: both pass. (b) In float32 the "
            "same wrong part sits near the tolerance (0.827 of it for parity in the "
            "chapter's cell), so each check's own comparison decides: on the course's "
            "CPU run trajectory, whose five updates add up the error, and "
            "uneven_microbatches still fail, and the answer is parity, "
            "accumulation_invariance and permutation_invariance. Rounding may move a "
            "check across on another machine, hence an answer read from your two "
            "audits; a small term is audited in float64.")),
    "choose_the_unit.4": Question(
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
    "choose_the_unit.5": Question(
        "Three jobs. (a) Fine-tuning on sampled answers with a per-token reward "
        "mask: the tokens a checker rejects are masked out of the labels, and a "
        "kept token of answer s must weigh 1 / (G k_s), where G counts the "
        "window's answers with a kept token and k_s is answer s's kept tokens. "
        "(b) Supervised fine-tuning on multi-turn chats, one chat per row, the "
        "user's turns masked, each "
        "assistant turn counting once. (c) A classifier whose rare label is one "
        "example in 50, the two labels weighing the same in total: the rare "
        "label's class weight over the common one's? Which unit fits each job, in "
        "the order a / b / c, and what does every rank all-reduce before its "
        "backward (in brackets)?", "choice",
        "sequence (K) / document (the turns) / weighted, 49 (Σ w)",
        "for (a), match 1 / (G k_s) with a token's weight under each unit of the "
        "chapter; for (b), ask what must count once and whether a row is still one "
        "example; for (c), write each label's total weight over 50 examples and "
        "set the two equal",
        options=("sequence (K) / document (the turns) / weighted, 49 (Σ w)",
                 "token (N) / sequence (K) / weighted, 49 (Σ w)",
                 "sequence (K) / sequence (K) / weighted, 50 (Σ w)",
                 "sequence (nothing) / document (the turns) / weighted, 49 (nothing)",
                 "sequence (K) / document (the turns) / weighted, 50 (Σ w)"),
        reasoning=(
            "(a) The sequence mean: 1 / (G k_s) is its 1 / (K n_s) once the mask has "
            "removed the rejected tokens, for the mask changes which tokens are "
            "supervised, not the unit: each answer gets one share, an answer with no "
            "kept token drops out of K, and the ranks all-reduce K, the answers (the "
            "token mean would give every kept token 1 / N); (b) the document "
            "objective without packing: each assistant turn is a run of supervised "
            "labels between masked ones, "
            "so the ranks all-reduce the turns found in the labels, where the "
            "sequence rule would weigh a turn by its part of its chat. (c) Over 50 "
            "examples the rare label totals w_rare × 1 and the common one "
            "w_common × 49, so equal totals need a ratio of 49, not 50, and Σ w "
            "depends on how many rare labels each rank drew, so the ranks "
            "all-reduce it, in float64. A rank that divides by its own count trains "
            "a mean of rank means (chapter 01).")),
}
