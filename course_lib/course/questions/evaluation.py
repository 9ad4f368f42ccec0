"""Chapter 07's graded questions (``notebooks/07_evaluation.ipynb``)."""

from __future__ import annotations

from functools import cache
from typing import Any

from course_lib.core import paths
from course_lib.core.edition import tr
from course_lib.course.grading import Question


def _hf_train_loss(average: bool = True) -> float:
    """07: the Trainer's logged training loss on the skewed window, with
    average_tokens_across_devices on (or off), as the committed
    data/frameworks-logging.json measured it (the Llama model)."""
    from course_lib.jobs.frameworks_logging import LoggingData

    return LoggingData.committed().run.row(
        "hf", "train loss", f"average_tokens_across_devices={average}", model="llama").value


def _rank_accuracy_gap() -> float:
    """07: on the chapter's 3-rank evaluation (runs/course/evaluate-3-ranks),
    the mean of the ranks' token accuracies, the repeats left out, minus the
    token accuracy, in percentage points."""
    from course_lib.jobs.evaluate import EvaluationReport

    out = paths.default_out("course") / "evaluate-3-ranks"
    if not EvaluationReport.exists(out):
        raise FileNotFoundError(tr("run the chapter's job first: no {name}.json yet")
                                .format(name=EvaluationReport.NAME))
    d = EvaluationReport.load(out).distributed
    if d is None:  # evaluated in one process: no ranks to combine
        raise FileNotFoundError(tr("run the chapter's job first: no {name}.json yet")
                                .format(name=EvaluationReport.NAME))
    return 100 * (d.mean_of_rank_means.token_accuracy - d.token_weighted.token_accuracy)


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


def _loss_per_token(world_size: int, positions_of) -> float:
    """07: the test loss per token of the chapters' step-100 model on
    ``world_size`` ranks, each scoring the test positions ``positions_of(n,
    world_size, rank)`` hands it, the ranks' [loss sum, tokens, correct] added."""
    import torch

    from course_lib.core import checkpoint
    from course_lib.core.evaluate import score
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
        positions = positions_of(len(test), world_size, rank)
        total += score(model, data, [test[p] for p in positions]).totals()
    return float(total[0] / total[1])


@cache
def _repeats_kept_loss(world_size: int) -> float:
    """07: the loss per token with DistributedSampler's repeats kept."""
    from course_lib.core.evaluate import shard

    return _loss_per_token(world_size, lambda n, w, r: shard(n, w, r)[0])


@cache
def _tail_dropped_loss(world_size: int) -> float:
    """07: the loss per token with DistributedSampler(drop_last=True): the
    tail that does not divide by the ranks is dropped."""
    from torch.utils.data import DistributedSampler

    return _loss_per_token(world_size, lambda n, w, r: list(DistributedSampler(
        range(n), num_replicas=w, rank=r, shuffle=False, drop_last=True)))  # type: ignore[arg-type]


@cache
def _test_targets(count: int) -> int:
    """07: the next-token targets of the first ``count`` test sequences."""
    from course_lib.course.api import corpus, load_config

    data = corpus(load_config())
    return sum(len(data.sequences[i]) - 1 for i in data.splits["test"][:count])


def _last_position(world_size: int, rank: int) -> int:
    """07: the test position that DistributedSampler hands ``rank`` last."""
    from course_lib.core.evaluate import shard
    from course_lib.course.api import corpus, load_config

    return shard(len(corpus(load_config()).splits["test"]), world_size, rank)[0][-1]


QUESTIONS: dict[str, Question] = {
    "evaluation.predict_spread": Question(
        "Averaged over the test tokens, how does the trained model's spread "
        "term compare with the untrained model's?", "choice", "spread grows",
        "the spread is also the average of -log p_j over all 32 symbols, p the "
        "softmax: what does a model that is sure of the likely successors "
        "leave to the other symbols?",
        options=("spread shrinks", "spread stays about the same", "spread grows"),
        reasoning=(
            "It grows, from about 3.6 to about 5.9 nats: the spread is the average "
            "of -log p_j over all 32 symbols, and a trained model that is sure of "
            "the few likely successors gives the others tiny probabilities, each "
            "paying a large -log p_j. The knowledge term grows faster, so the loss, "
            "their difference, falls.")),
    "evaluation.predict": Question(
        "On 3 ranks, the one-process evaluation's 16,971 test tokens become "
        "how many when the ranks' token counts are added with the sampler's "
        "repeats kept?", "number",
        lambda: _test_targets(256) + _test_targets(2),
        "which positions does the sampler deal twice (the cell above), and "
        "how many next-token targets does each of those sequences hold?",
        reasoning=(
            "The sampler pads 256 to 258 with positions 0 and 1, so the sums with "
            "the repeats count those two sequences' targets twice: 16,971 plus the "
            "L - 1 targets of test sequences 0 and 1 (95 together), 17,066. Only the "
            "sums with the repeats dropped count every test token once with the "
            "same weight, and they equal the one-process value to float64 "
            "round-off; the mean of rank means weighs a token by 1 / (W N_r).")),
    "evaluation.predict_logging": Question(
        "The skewed window, 2 ranks: rank 0's microbatches hold N_0 = 31 "
        "tokens with loss sum S_0 = 180.324, rank 1's N_1 = 56 tokens with "
        "S_1 = 351.074. With average_tokens_across_devices=True, every rank's "
        "num_items_in_batch is 87, the window's tokens over both ranks. "
        "Following the three lines above, what training loss does the Trainer "
        "log?", "number", _hf_train_loss,
        "what does each rank hold once its loss, S_r / 87, is multiplied by "
        "loss_scale = 2? and what does .mean() over the gathered ranks then "
        "do with that 2?", rel_tol=2e-3,
        reasoning=(
            "The token mean, 531.398 / 87 = 6.1080: rank r's loss is S_r / 87, "
            "multiplied by loss_scale = W = 2, so rank 0 holds 2 * 180.324 / 87 = "
            "4.1454 and rank 1 holds 2 * 351.074 / 87 = 8.0707; the log's .mean() "
            "over the gathered ranks divides their sum by 2 again: (S_0 + S_1) / 87. "
            "The factor W is chapter 03's, and the mean undoes it.")),
    "evaluation.predict_logging_off": Question(
        "The same window with average_tokens_across_devices=False: every rank's "
        "num_items_in_batch is its own count, 31 on rank 0 and 56 on rank 1. "
        "Following the same lines, what training loss does the Trainer log?",
        "number", lambda: _hf_train_loss(False),
        "without the flag, does the loss_scale block run? What does each rank hold "
        "then, and what does .mean() over the two ranks make of it?", rel_tol=2e-3,
        reasoning=(
            "Without the flag the loss_scale block does not run, and each rank "
            "divides by its own count: rank 0 holds 180.324 / 31 = 5.8169 and rank 1 "
            "351.074 / 56 = 6.2692. The log's .mean() averages the two: (5.8169 + "
            "6.2692) / 2 = 6.0430, the mean of rank means, below the token mean 6.1080 "
            "because rank 0's 31 tokens, with the lower loss, get half the say.")),
    "evaluation.predict_shard": Question(
        "The test split holds 256 sequences, at positions 0 to 255. On 3 ranks, "
        "DistributedSampler (drop_last=False, shuffle=False) hands rank r the "
        "entries r, r + 3, r + 6, ... of its list. Which position does rank 2 "
        "score last?", "number",
        lambda: _last_position(3, 2),
        "3 does not divide 256: how long must the list be for every rank to run "
        "as many sequences, and which entries fill it?",
        reasoning=(
            "The sampler pads the list with its first entries until 3 divides it: "
            "258 = 3 * 86 entries, the last two being positions 0 and 1. Rank 2 takes "
            "entries 2, 5, ..., 257, so its last is position 1, which rank 1 also "
            "scores: two sequences are scored twice.")),
    "evaluation.1": Question(
        "From the course's train logs (logs/train-rank<R>.jsonl in the run "
        "folder): what is the training loss of updates 1 to 10 taken together, "
        "every supervised token of those ten windows counted once? (And why is "
        "it not the mean of the ten logged loss values?)", "number",
        lambda: _logged_token_mean(1, 10),
        "do the ten windows hold the same number of tokens? and what does each "
        "line's loss divide by?", rel_tol=1e-4,
        reasoning=(
            "Add local_loss_sum over both ranks and the ten updates, and divide by "
            "the sum of their local_tokens. The plain mean of the ten logged losses "
            "gives each window the same weight whatever its N, and the early windows "
            "differ enough in loss and size that it misses by about 0.6%.")),
    "evaluation.2": Question(
        "DistributedSampler(drop_last=True) drops the tail of the list instead "
        "of repeating its head. Score the test split on 6 ranks that way, in "
        "this process: for each rank r, score the test sequences at the "
        "positions DistributedSampler(range(256), num_replicas=6, rank=r, "
        "shuffle=False, drop_last=True) hands it, with "
        "course_lib.evaluation_job.score, and add the six ranks' "
        "scores.totals() (the [loss sum, token count, right predictions] that "
        "one all_reduce adds up). What loss per token do the sums give?",
        "number", lambda: _tail_dropped_loss(6),
        "how many positions does each rank get once the list is cut to a "
        "multiple of 6, and which test sequences does no rank score?",
        rel_tol=1e-4,
        reasoning=(
            "drop_last=True cuts the 256 positions to 6 x 42 = 252, so positions 252 "
            "to 255, the last four test sequences, are scored by no rank: the sums "
            "give 1.6091 per token, against the one-process 1.6076, 0.16 standard "
            "errors off. Dropping sequences biases the test loss as repeating them "
            "does, and the miss comes back on every run; shares ids[rank::W], as the "
            "chapter's recipe takes, score every sequence once, whatever W.")),
    "evaluation.3": Question(
        "Lightning's on_epoch sync with batch_size=<tokens> logs "
        "S / (W floor(N / W)), the token mean S / N times N / (W floor(N / W)). "
        "On W = 8 ranks, over every window size N from 1,000 to 1,100 tokens, "
        "what is the largest this factor gets? Derive it, then check your N "
        "with the chapter's sync on 8 fake ranks.", "number", 1007 / 1000,
        "write N = 8 q + k with 0 <= k < 8: the synced count keeps q, so the "
        "factor is N / (N - k). Which k makes it largest, and for which such N "
        "is N - k smallest?", rel_tol=1e-5,
        reasoning=(
            "1007 / 1000 = 1.007: with N = W q + k (0 <= k < W), the integer "
            "average of the counts keeps q = floor(N / W), so the logged value "
            "divides S by W q = N - k, and the factor is N / (N - k). It is 1 when "
            "W divides N, grows with k and shrinks with N: the worst case is "
            "k = W - 1 = 7 at the smallest such N, 1,007 = 8 x 125 + 7, whose count "
            "becomes 1,000, 0.7% short. The chapter's sync on 8 fake ranks whose "
            "counts add up to 1,007 prints 1.007; a float count (torchmetrics' "
            "MeanMetric) never truncates.")),
    "evaluation.4": Question(
        "Token accuracy is a ratio of sums too: right predictions over tokens. "
        "Write the mean of the ranks' accuracies minus the token accuracy with "
        "each rank's accuracy a_r and its share of the tokens N_r / N. Then "
        "compute it for the chapter's 3 ranks, the sampler's repeats left out: "
        "rank r scores the test ids ids[r::3], as the chapter's recipe did, with "
        "course_lib.evaluation_job.score. How many percentage points is the mean "
        "of the rank accuracies above the token accuracy (negative if below)?",
        "number", _rank_accuracy_gap,
        "the token accuracy weighs rank r's accuracy by N_r / N, their mean by "
        "1 / W; scores.totals() gives a rank's [loss sum, tokens, right "
        "predictions]", rel_tol=1e-3, abs_tol=1e-6,
        reasoning=(
            "The token accuracy is sum_r (N_r / N) a_r and the mean of the rank "
            "accuracies sum_r a_r / W, so their difference is sum_r (1 / W - N_r / N) "
            "a_r, zero when the ranks hold equal token counts or equal accuracies. "
            "On the chapter's 3 ranks the round-robin shares hold similar counts "
            "and accuracies, so the gap is a small fraction of a percentage point "
            "(read from the run); like the mean of rank means of the loss, it is a "
            "bias of the combination that no rerun averages away. Add the right "
            "predictions and the tokens over the ranks, then divide once.")),
    "evaluation.5": Question(
        "Evaluate the same checkpoint on 2 ranks (world_size=2). Which of the "
        "two wrong combinations still differs from the one-process value?",
        "choice", "mean of rank means",
        "does 2 divide 256? and do the even and the odd positions of the test "
        "split hold the same loss per token?",
        options=("sums with the repeats", "mean of rank means", "both", "neither"),
        reasoning=(
            "2 divides 256, so the sampler adds no repeat and the sums with repeats "
            "kept are the token-weighted ones; the even and odd positions hold "
            "different token counts and losses, so their means' average is not the "
            "token mean.")),
}
