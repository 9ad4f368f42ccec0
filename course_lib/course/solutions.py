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
        "The mean of means does not depend on the counts: the local means stay 2 "
        "and 1, so it is 1.5 whatever rank 1 holds. A gap of 0.3 asks for a "
        "global mean of 1.2 = (20 * 2 + n * 1) / (20 + n), so 24 + 1.2 n = 40 + n "
        "and n = 80. The bias is positive, where the 12/36 example's was "
        "negative: the mean of means leans toward the small rank's loss, here "
        "the larger one.",
    "mean_of_means.2":
        "The mean of means weighs the three ranks alike: (1 + 3 + 2) / 3 = 2, "
        "whatever the counts. With n tokens on rank 0 the global mean is "
        "(n + 108 + 48) / (n + 60); it equals 2 when n + 156 = 2n + 120, so "
        "n = 36. Rank 2's tokens already sit at 2, so rank 0's tokens of loss 1 "
        "must balance rank 1's tokens of loss 3: the ranks still hold 36, 36 "
        "and 24 tokens, and the bias hides.",
    "mean_of_means.3":
        "A token of rank r weighs 1 / (W N_r) under the mean of means and 1 / N "
        "under the global mean: the ratio is N / (W N_r). Setting "
        "100 / (4 N_r) = 5 gives N_r = 5. The ratio is above 1 exactly when "
        "N_r < N / W = 25: a rank with a fifth of the average rank's tokens "
        "gives each of them five times its due.",
    "mean_of_means.predict_gradient":
        "The 48-token gradient mixes the ranks' gradients with the token "
        "shares, as the loss does: 1/4 * 0.0833 + 3/4 * (-0.1111) = -0.0625 "
        "(the exact values are 1/12 and -1/9).",
    "mean_of_means.predict_theta_mom":
        "Each rank's mean pulls toward its own target, +1 or -1, and the mean of "
        "means gives each rank the same weight: the pulls cancel halfway, at 0.",
    "mean_of_means.predict_theta_global":
        "The token mean's minimum is the token-weighted mean of the targets, each "
        "rank's share of the tokens applied to its target: 1/4 * (+1) + 3/4 * (-1) "
        "= -0.5.",
    "mean_of_means.4":
        "The global gradient vanishes where theta is the token-weighted mean of "
        "the targets, (n - 36) / (n + 36). Setting it to -0.2 gives 1.2 n = 28.8, "
        "so n = 24.",
    "mean_of_means.5":
        "A rank's gradient is 2 (theta - m_r), with m_r the mean of its "
        "targets; rank 0's is 1, rank 1's is (t - 1) / 2, equal when t = 3. "
        "Rank 1's targets then spread around 1, so its loss is larger by their "
        "variance (4): the two objectives report different losses, yet any mix "
        "of two equal gradients is that gradient, so they train alike.",
    # 02 data and plan
    "data_and_plan.predict_ratio":
        "Both ranks draw as many sequences, so the ratio is that of their typical "
        "targets: about 96 in the band 65-128 against about 39 in 16-64, close to "
        "2.5; the plan's exact sums give the answer.",
    "data_and_plan.predict_labels":
        "Each label is the next token, so the last token of a row has no label: "
        "[7, 4, 9] gives the targets [4, 9] and [5, 2] gives [2]. The rows are "
        "padded to the longer one, 2 targets: labels of shape 2 x 2, whose one "
        "padded cell holds IGNORE_INDEX, so 3 supervised tokens.",
    "data_and_plan.1":
        "The mean of means is (2 + 1) / 2 = 1.5 in every window; the token mean "
        "is (2 N_0 + N_1) / N = 1 + N_0 / N. The gap, 0.5 - N_0 / N, is largest "
        "where rank 0 holds the smallest share of the window, which is the "
        "window of the largest ratio N_1 / N_0 (3.045x, step 22): 491 and 1495 "
        "tokens, 1986 in all, so the token mean is 1 + 491 / 1986 = 1.2472 and "
        "the mean of means reads 0.2528 too high. `max(0.5 - c[0] / sum(c) for c "
        "in per_window)` computes it; rank 0's few tokens, which carry the high "
        "loss, get half the say.",
    "data_and_plan.2":
        "The widest row has 30 tokens, so 29 targets; three rows padded to 29 "
        "make 87 label cells, of which only 9 + 19 + 29 = 57 are supervised: "
        "30 of the 87 cells, 34%, are padding.",
    "data_and_plan.3":
        "Counting len(sequence) adds one to N per sequence while the loss sums "
        "stay, so the token mean, and every gradient with it, scales by "
        "N / (N + R), with R the 32 sequences "
        "of step 0's window: 2283 / 2315. The factor holds within this window "
        "only; the next window has another N, hence another factor.",
    "data_and_plan.4":
        "The bands are 44-71 and 72-99 for ranks 1 and 2. Every rank draws as "
        "many sequences, so the ratio is that of typical targets: about 84.5 "
        "against 56.5, close to 1.5. The plan's exact sums give 1.490 (the "
        "rerun prints 2.913 and 1.955 against rank 0), less than the ends' "
        "3.885: neighbouring bands differ less.",
    # 03 global denominator
    "global_denominator.predict_factor":
        "DDP's average of the ranks' gradients is (1 / W) sum_r c grad S_r, and "
        "the goal is (1 / N) sum_r grad S_r: they agree when c / W = 1 / N, so c "
        "= W / N. 1 / N_r is the mean of means; 1 / N leaves DDP's 1 / W in "
        "place, a gradient W times too small; 1 / (W * N) divides by W twice.",
    "global_denominator.predict":
        "SGD, with or without momentum, is linear in the gradients: half the "
        "gradients, half of every update, 0.5. Adam divides the running mean m "
        "by the square root of the running mean v of the squares; halving every "
        "gradient halves m and sqrt(v) alike, and only Adam's small epsilon "
        "keeps the ratio from being exactly 1.",
    "global_denominator.1":
        "The empty rank still joins the all-reduce, so DDP still divides by W "
        "= 3; N = 300 + 500 + 0 = 800. The factor is W / N = 3 / 800 = "
        "0.00375: DDP's average, (1 / 3) (3 / 800) (grad S_0 + grad S_1 + 0), "
        "is grad (S_0 + S_1) / 800. Taking W = 2, the ranks that hold "
        "tokens, would make every gradient two thirds of the right one.",
    "global_denominator.2":
        "SGD moves w by lr * (g + weight_decay * w): under the rule 0.1 * (0.5 + "
        "0.1) = 0.06. With the trap the gradient halves but the decay term does "
        "not, 0.1 * (0.25 + 0.1) = 0.035, and the ratio is 0.35 / 0.6 = 0.583, "
        "not 0.5: with weight decay the trap is no longer a halved learning rate.",
    "global_denominator.3":
        "DDP arms a backward's reduction during the forward, and only for a "
        "forward run outside no_sync(). All four forwards ran inside it, so no "
        "backward synchronises, 0, not even the last one outside the context: "
        "the ranks keep their own accumulated gradients, step with different "
        "ones and silently drift apart.",
    "global_denominator.4":
        "Under the rule the norm, 1.5, exceeds max_norm, so clipping brings the "
        "gradient down to norm 1.0; the trapped gradient's norm, 0.75, is under "
        "max_norm and clipping leaves it alone. SGD's updates are lr times these: "
        "0.75 / 1.0 = 0.75, not 0.5 (had both norms exceeded max_norm, both would "
        "be clipped to 1.0 and the trap would not change the step at all).",
    # 04 two processes, one gradient
    "ddp_parity.predict":
        "Under the mean of means a rank-1 token weighs 1 / (W N_1) = 1 / (2 * "
        "1562); its due is 1 / N = 1 / 2283. The ratio N / (W N_1) = 2283 / 3124 "
        "is about 0.73: the long sequences count for less than their share, and "
        "a rank-0 token (N / (W N_0) = 2283 / 1442) for about 1.58 times its due.",
    "ddp_parity.predict_loss_gap":
        "With two ranks, mean of means - global mean = (1/2 - N_0 / N)(m_0 - "
        "m_1), m_r the local means, and 12 and 36 tokens make the factor 1/4: "
        "the hand example's means 1 and 3 give 0.5. The untrained model sits "
        "near the uniform guess on every token (local means about 3.57 and "
        "3.58), so the gap is about 0.003 nat, under 0.05 nat. The gradients "
        "still differ far beyond the tolerance, since the mean of means "
        "reweights every token whatever its loss.",
    "ddp_parity.1":
        "At W = 3 the by-hand script prints N = 3363 tokens, per rank [559, "
        "1090, 1714]: an even share is N / 3 = 1121. The mean of means weighs a "
        "rank-r token N / (W N_r) times its due: about 2.01, 1.03 and 0.65. "
        "Ranks 0 and 1 hold less than an even share, so both are over-weighted, "
        "rank 1 only just; rank 2 is under-weighted.",
    "ddp_parity.2":
        "allclose passes a component when |err| <= atol + rtol * |ref|, so each "
        "sampled component needs atol >= |err| - rtol * |ref|; the worst "
        "component sets the smallest atol.",
    "ddp_parity.3":
        "No. With 12 and 13 tokens N = 25, and the mean of means weighs a "
        "rank-0 token 1/24 and a rank-1 token 1/26 instead of 1/25: a 4% change "
        "of weight, far above what the check forgives as rounding. The run "
        "agrees: allclose=False.",
    "ddp_parity.4":
        "1/3: ranks 2 and 3 backprop 0 / 0, a NaN loss, yet their gradient is "
        "exactly zero (cross_entropy's backward writes 0 for every ignored "
        "label), and DDP still divides the sum by W = 4. Every rank holds "
        "(grad S_0 / 12 + grad S_1 / 36) / 4, so a rank-1 token weighs "
        "1 / (4 * 36) = 1/144 where its due is 1 / N = 1/48, a third (two thirds "
        "on two ranks), and a rank-0 token 48 / (4 * 12) = 1, its due by "
        "coincidence. The token rule is unchanged: 4 * S_r / 48, divided by 4.",
    "ddp_parity.5":
        "PASS, and the mean of means still fails (exit code 0): the forward now "
        "runs outside no_sync(), so DDP arms the sync in both microbatches and "
        "each rank all-reduces twice, the syncs pairing since both ranks make "
        "two microbatches. The first sync averages the first microbatch's "
        "gradients; the second averages the whole .grad, whose first part every "
        "rank already holds alike, so that part stays as it is and the second "
        "part gets averaged: the sum of the averages is the average of the sums. "
        "Only the communication is wasted, and a gradient check cannot see it.",
    # 05 bug lab
    "bug_lab.predict_no_sync_backward_only":
        "A hang: a forward outside no_sync() arms DDP's sync, so every "
        "microbatch all-reduces its gradients: rank 0 calls 3 all-reduces, rank "
        "1 calls 6. An all-reduce returns only when every rank has called it, and "
        "rank 0, out of microbatches, never calls a fourth: rank 1 waits in it, "
        "alone (in a training loop rank 0's next collective would pair with it, a "
        "mismatch); uneven_microbatches stops it after 10 s and names rank 1.",
    "bug_lab.predict_join_every_microbatch":
        "A wrong gradient, and no hang: Join lets rank 0, out of microbatches, "
        "answer rank 1's last three all-reduces with zeros. But rank 0 keeps what "
        "was synced after microbatch 3 and never receives rank 1's last three, "
        "and each of rank 1's extra syncs averages its whole accumulated gradient "
        "with zeros: both ranks end wrong, and different.",
    "bug_lab.predict_count_never_reset":
        "On the first window the count is right, so every one-window check "
        "passes; only trajectory runs later windows, where N has grown and the "
        "gradient fades.",
    "bug_lab.predict_forgot_world_size":
        "world_size_invariance only. S_r / N is the right gradient times 1/W. "
        "Accumulation and permutation invariance compare layouts at the same W, "
        "which share the factor, and no_sync compares the ranks with each other; "
        "world_size_invariance runs W = 1, 2 and 4, where the factor is 1, 1/2 "
        "and 1/4.",
    "bug_lab.1":
        "The running count at the third update is every token seen so far, "
        "2000 + 2400 + 1600 = 6000, where the rule divides by the window's own "
        "1600: the gradient is 1600 / 6000 = 0.267 of the reference's. (The "
        "first update is right: 2000 / 2000.)",
    "bug_lab.2":
        "Every rank runs as many microbatches as the longest one. At W = 4, "
        "re-batched by 384 padded tokens, the ranks make 2, 4, 5 and 6 "
        "microbatches: 4 + 2 + 1 + 0 = 7 empty ones.",
    "bug_lab.3":
        "uneven_microbatches only. The logged all-reduce touches no gradient, so "
        "every gradient check passes, and no_sync, which compares the ranks' "
        "gradients between microbatches, still sees them differ until the last "
        "one. On the uneven layout rank 0 calls 3 logging all-reduces and rank 1 "
        "calls 6, so rank 0's gradient sync meets rank 1's third logging "
        "all-reduce: the collectives differ and the launch fails (gloo aborts; "
        "with NCCL it may hang until the check's 10 s deadline).",
    "bug_lab.4":
        "Until rank 0 runs out both ranks sync and divide by 2, as in the "
        "chapter: both hold A, and rank 0 keeps it (scale 0.729, as printed). "
        "Rank 1 then syncs alone and divides by 1, so its last three "
        "microbatches h enter whole: rank 1 = A + h, while the reference halves "
        "every microbatch: ref = A + h / 2. So rank 1 = 2 ref - A, scale 2 - "
        "0.729 = 1.271 (the run gives 1.2707): the two ranks' mean is the "
        "reference, and neither rank holds it.",
    "bug_lab.5":
        "Every W forms the same microbatches: world_size_layout sorts the 32 "
        "sequences by length, gives each rank a contiguous slice and cuts it "
        "into microbatches of 8, so W = 1, 2 and 4 make the same four groups of "
        "8 sequences, with the same padding. N' and the factor N / N' are then "
        "the same at every W, and the gradients agree with each other, wrong "
        "alike (parity sees it); W does cancel, but that alone would not hold "
        "N' still, and regrouping (accumulation) or dealing the sequences "
        "otherwise (permutation) changes the padding, so those checks fail.",
    # 06 checkpoint resume
    "checkpoint_resume.predict":
        "The four ablations: each drops one piece that the updates after step 50 "
        "read, the momentum (model_only, no_optimizer_state), the order of the "
        "windows (sampler_from_seed), the dropout masks (no_rng_state), and any "
        "one of them changes the parameters by step 100. Nothing in the step "
        "draws from Python's random (the sampler has its own generator), so "
        "other Python RNG states leave step 100 bit for bit the same.",
    "checkpoint_resume.1":
        "Without dropout nothing after step 50 draws from the torch "
        "generators, so no_rng_state changes nothing; with momentum 0 SGD keeps "
        "no buffers (optimizer.pt holds no state to restore), so "
        "no_optimizer_state changes nothing either. The order of the windows "
        "still matters: sampler_from_seed replays windows 0, 1, ..., and "
        "model_only restarts the sampler too (measured: both differ by "
        "0.035, the other two are bit for bit the continuous run).",
    "checkpoint_resume.2":
        "The re-seeded sampler starts its order over: updates 51 to 75 draw "
        "windows 0 to 24, and the checkpoint at step 75 saves that sampler as it "
        "stands. The full resume restores it faithfully, so updates 76 to 80 "
        "draw windows 25 to 29: update 80 draws window 29, not 79, as a "
        "checkpoint saves the trajectory it is on, wrong or right.",
    "checkpoint_resume.3":
        "Between the two renames the complete new checkpoint is step-0050.tmp and "
        "the old one step-0050.old; latest_valid looks at step-NNNN names only, "
        "so the newest it finds is step-0025, and the run resumes from step 25 "
        "(a valid copy of step 50 sits in step-0050.old, unused).",
    "checkpoint_resume.4":
        "Killed during update 73, the run holds step-0025 and step-0050 (the "
        "save after update 75 never began), so latest_valid returns step-0050 "
        "and the new job's sampler stands at position 50. Its updates 51 to 72 "
        "draw windows 50 to 71 again and reach the killed job's step-72 state "
        "bit for bit: 22 finished updates redone, and update 73 (window 72) is "
        "then run to its end for the first time. Saving every k updates redoes "
        "at most k - 1 finished updates: the price of a checkpoint interval.",
    # 07 evaluation
    "evaluation.predict_spread":
        "It grows, from about 3.6 to about 5.9 nats: the spread is the average "
        "of -log p_j over all 32 symbols, and a trained model that is sure of "
        "the few likely successors gives the others tiny probabilities, each "
        "paying a large -log p_j. The knowledge term grows faster, so the loss, "
        "their difference, falls.",
    "evaluation.predict":
        "The sampler pads 256 to 258 with positions 0 and 1, so the sums with "
        "the repeats count those two sequences' targets twice: 16,971 plus the "
        "L - 1 targets of test sequences 0 and 1 (95 together), 17,066. Only the "
        "sums with the repeats dropped count every test token once with the "
        "same weight, and they equal the one-process value to float64 "
        "round-off; the mean of rank means weighs a token by 1 / (W N_r).",
    "evaluation.predict_logging":
        "The token mean, 531.39 / 87 = 6.108: rank r's loss is S_r / 87, "
        "multiplied by loss_scale = W = 2, so rank 0 holds 2 * 180.32 / 87 = "
        "4.145 and rank 1 holds 2 * 351.07 / 87 = 8.071; the log's .mean() over "
        "the gathered ranks divides their sum by 2 again: (4.145 + 8.071) / 2 = "
        "(S_0 + S_1) / 87. The factor W is chapter 03's, and the mean undoes it. "
        "Without the flag each rank divides by its own N_r and the log is the "
        "mean of rank means, (180.32 / 31 + 351.07 / 56) / 2 = 6.043.",
    "evaluation.predict_shard":
        "The sampler pads the list with its first entries until 3 divides it: "
        "258 = 3 * 86, so every rank gets 86, and two sequences are scored twice.",
    "evaluation.1":
        "Add local_loss_sum over both ranks and the ten updates, and divide by "
        "the sum of their local_tokens. The plain mean of the ten logged losses "
        "gives each window the same weight whatever its N, and the early windows "
        "differ enough in loss and size that it misses by about 0.6%.",
    "evaluation.2":
        "On 5 ranks the sampler pads 256 positions to 260 with positions 0 to "
        "3, so the sums with the repeats count those four sequences twice: "
        "27,778.78 nats over 17,254 tokens, 1.6100 per token, against the "
        "one-process 1.6076. Left out (the positions past 255, or "
        "scores.totals(~repeat) with shard's flags), the five ranks' totals "
        "add up to the one-process sums, loss and right predictions alike, to "
        "float64 round-off: a sum does not care how the sequences were split.",
    "evaluation.3":
        "129 / 128 = 1.0078: each rank's value * batch_size is its loss sum "
        "S_r, a float, and its batch_size N_r is an integer, so the sync's "
        "average over the 4 ranks gives S / 4 for the first and 129 / 4 = 32.25 "
        "for the second, which copy_ into the integer tensor truncates to 32. "
        "The logged value is (S / 4) / 32 = S / 128, the token mean S / 129 "
        "times 129 / 128. A float count (torchmetrics' MeanMetric) never "
        "truncates.",
    "evaluation.4":
        "Every target is distributed as pi (the sequences start from it), and "
        "the model predicts pi, so its expected loss is the entropy of pi, "
        "-sum pi log pi: between the floor (which uses the current token) and "
        "log 32 (which uses nothing).",
    "evaluation.5":
        "2 divides 256, so the sampler adds no repeat and the sums with repeats "
        "kept are the token-weighted ones; the even and odd positions hold "
        "different token counts and losses, so their means' average is not the "
        "token mean.",
    # 08 framework audit
    "framework_audit.predict":
        "A recipe is exact when every token of every window weighs 1 / N: fairseq "
        "(sums, then x W / N after DDP's mean), torchtitan on FSDP (S / N summed "
        "over the ranks) and Megatron's per-token path (sums, then / N). The others "
        "divide per microbatch, per rank, by a count taken before the shift, or by "
        "W once too often.",
    "framework_audit.predict_gpt2":
        "A GPT-2 built from its config has loss_type None, so _loss_shifts_labels "
        "is False and the count takes every label: each row supervised from its "
        "first label adds one the loss never uses, N' = N + R, gathered over the "
        "ranks. Every rank backprops W * S_r / N' with the same N', so the "
        "gradient is N / (N + R) times the token mean's, one factor for the whole "
        "window: uniformly scaled (from 4.48 on; the table of readings answers for "
        "the installed version).",
    "framework_audit.1":
        "Each window's update is its token-mean gradient times its own N / (N + R): "
        "1000 / 1016 for A (R = 16), 1000 / 1008 for B (R = 8). B weighs 1016 / "
        "1008 = 1.0079 times A: over a run the scale reweights the windows.",
    "framework_audit.2":
        "The Llama's loss shifts whatever labels it gets (_loss_shifts_labels is "
        "True) and the count takes labels[..., 1:], so labels already equal to "
        "input_ids[:, 1:] are counted L - 2 a row and scored as L - 2 targets, "
        "position t against input_ids[t + 2]. Count and targets agree, so every "
        "token weighs 1 / N: the token mean's weighting, of the wrong task "
        "(predicting two tokens ahead), which a check of weights alone cannot "
        "see and the loss, stalling high, shows. Shift in the data or in the "
        "loss, never both.",
    "framework_audit.3":
        "6: the override calls the model without num_items_in_batch, so each "
        "microbatch returns its own mean S / n; training_step, seeing a model that "
        "accepts loss kwargs and a count, takes the loss as already divided by N "
        "and skips the division by M; DDP averages the W ranks: S / (W n), and a "
        "token weighs 1 / (W n) = 1 / 200 = 6 / 1200. The audit names the formula: "
        "mean of microbatch means without 1/M.",
    "framework_audit.4":
        "1.5: with loss_is_scaled_for_ga = False, training_step divides the model's "
        "own mean S / n by M before the backward, and DDP averages the ranks: "
        "S / (W M n), and a token weighs 1 / (2 x 2 x 200) = 1 / 800 = 1.5 / 1200 "
        "(the audit: mean of microbatch means). The attribute restores the missing "
        "1/M of exercise 3, not the token mean: a token of a 100-token microbatch "
        "weighs 3 / N, so the weight still depends on its microbatch's count (a "
        "version without the attribute ignores it, and its run shows exercise 3's "
        "formula).",
    # 09 choose the unit
    "choose_the_unit.predict":
        "Under the sequence mean each of the K sequences gets the same total "
        "weight, shared among its n_s tokens: a token weighs 1 / (K n_s). The "
        "ratio is the longest supervised count over the shortest, 123 / 16 = "
        "7.69 on the parity window (the bands alone give about 128 / 16 = 8).",
    "choose_the_unit.predict_penalty":
        "Only penalty_every_microbatch. Added on every microbatch, the penalty "
        "counts M times, and accumulation_invariance changes M. The two others "
        "add it once per rank whatever M is (W times too strong, or on one rank "
        "only and divided by W in DDP's mean): only a reference, parity, sees "
        "them.",
    "choose_the_unit.predict_packed":
        "A quarter, 0.25. The sequence rule gives every row the same weight, "
        "spread evenly over the row's tokens, so a document weighs its part of "
        "its row's tokens: all of it alone, a quarter of it among four equal "
        "documents, where the document objective gives both the same weight. "
        "The packed rows hold from 1 to 4 documents, so rows_as_documents fails "
        "parity; on rows of one sequence the same rule is exact, as the sequence "
        "objective's audit showed.",
    "choose_the_unit.predict_rl":
        "grpo averages each completion's tokens, then the completions: the "
        "sequence mean, biased for the token mean when the completions' lengths "
        "differ. dr_grpo divides the sum by a constant: every token weighs the "
        "same, times N / C, a scale. dapo divides by the window's token count, "
        "all-reduced: exact while steps_per_generation = GA.",
    "choose_the_unit.1":
        "The weighted mean gives a token of weight w the share w / 2,700. Divided "
        "by its rank's own sum, a rank-1 token gets w / 600, and DDP's mean over "
        "W = 2 halves it: w / 1,200, so 2,700 / 1,200 = 2.25 times its weight "
        "(and a rank-0 token 2,700 / 4,200 = 0.64). It is chapter 01's mean of "
        "rank means, with the sum of class weights as the count: the fix is the "
        "same, all-reduce the sum before dividing.",
    "choose_the_unit.2":
        "C covers the whole optimizer step: 4 * 2 * 8 = 64 completions at 512 "
        "tokens, 32,768, in the old job; 8 * 2 * 8 = 128 completions at 1,024 "
        "tokens, 131,072, in the new one. The same loss sum divided by the old "
        "C is 131,072 / 32,768 = 4 times the right update, at every step: a "
        "learning rate 4 times too large for SGD.",
    "choose_the_unit.3":
        "At 1e-4 the z term's misweighting moves the parity window's gradient "
        "by 1.3e-6, inside float32's tolerance (atol 1e-6 + rtol 1e-4 x "
        "|reference|). trajectory draws a new window from the sampler at each of "
        "its 5 updates, with other microbatch sizes, and on some of them the "
        "error crosses the tolerance: with the weights frozen (lr 1e-9) it still "
        "fails, so the windows do it, not the updates. uneven_microbatches "
        "re-batches the window by a token budget, into microbatches of very "
        "different sizes, whose per-microbatch means weigh far apart.",
    "choose_the_unit.4":
        "The generation batch holds 300 + 500 = 800 tokens, and each step divides "
        "by half of them, 400; step 1's own token mean divides by 300. The factor "
        "is 300 / 400 = 0.75 (step 2's is 500 / 400 = 1.25): each step is a "
        "uniform scale of its own token mean, and over the run the steps are "
        "reweighted.",
    "choose_the_unit.5":
        "rows_as_documents gives each row one share, spread over its tokens, so "
        "a document weighs (its tokens / its row's tokens) / K: a long document "
        "alone in its row is heavy, a short one among several is light. On the "
        "parity window packed into rows of 128 the heaviest over the lightest "
        "is 8.33, where the document objective gives every document the same "
        "weight (a ratio of 1): that spread is why rows_as_documents fails "
        "parity. (Wider rows do not help: a width of 256 gives 8.64, and the "
        "audit refuses it, since the model has 128 positions.)",
    # 10 capstone
    "capstone.predict":
        "Six of the eight. The count takes labels.numel() (padding included) on "
        "this rank alone; the scale lacks the factor W and divides again by the "
        "microbatches; the checkpoint never saves the sampler (a resume draws the "
        "first windows again) and restores rank 0's RNG state on every rank; the "
        "evaluation's DistributedSampler scores 2 sequences twice at W = 3, and it "
        "averages rank means. The sync is right (no_sync() wraps the forward and "
        "the backward of every microbatch but the last), and so are the model and "
        "optimizer state: the grade fails every property but no_sync.",
    "capstone.predict_crash":
        "A half-written step-0040: torch.save writes state.pt under its final name "
        "as it goes, so the killed write leaves a truncated file there, and "
        "torch.load fails on it; the barrier only makes the other ranks wait for "
        "a write that finishes. The grader never interrupts a save, so it cannot "
        "see this. The fix writes state.pt.tmp and renames it with os.replace, "
        "atomic on one filesystem (chapter 06 renames a whole .tmp folder): the "
        "killed job leaves step-0040 without a state.pt, and the restart loads "
        "step-0020.",
    "capstone.predict_empty":
        "With N = N_0, rank 1's gradient is a finite zero in all three steps "
        "(its sum is 0; under mean_of_means and local_count its 0 / 0 loss is NaN, "
        "but cross-entropy's backward writes 0 for ignored targets). post_scale "
        "gives (S_0 + 0) / 2 * 2 / N_0 and local_count (2 S_0 / N_0 + 0) / 2, both "
        "S_0 / N_0 = S / N: they pass, local_count by accident, since N_0 = N; the "
        "mean of means gives S_0 / (2 N_0), half the update, and fails.",
    "capstone.1":
        "DDP averages the 8 ranks' W * S_r / N_k, which leaves S^(0) / N_0 + "
        "S^(1) / N_1: each node's own token mean, added. With N = N_0 + N_1 = 4 N_1, "
        "a node-1 token weighs 1 / N_1 = 4 / N and a node-0 token 1 / N_0 = (4/3) / "
        "N: the nodes' tokens weigh differently, a bias (even equal nodes would get "
        "the scale 2, the number of nodes), so N must be all-reduced over every node.",
    "capstone.2":
        "The count takes 120 slots in the first window and 200 in the second: "
        "their tokens weigh 1/120 and 1/200 where the token mean gives both "
        "1/100. Each window is only scaled (by 100/120 and 100/200), but a "
        "second-window token weighs 120 / 200 = 0.6 of a first-window one: over "
        "a run, the padding reweights the windows.",
    "capstone.3":
        "S_r before backward(): the loss sum grows by about 3.6 per supervised "
        "token and passes 65,504 near 65,504 / 3.6 = 18,200 tokens on one rank, an "
        "inf loss in the forward; a logit's gradient grows by at most 1 per token, "
        "and N is an int64 count. Scale before the backward (W / N, as "
        "global_token does, keeps every value the size of a mean) or sum the loss "
        "in float32. Under float16 autocast, chapter 03's reading, the loss is "
        "float32 (autocast runs cross_entropy in float32) and S_r never overflows: "
        "the first overflow is then in the backward's float16 activation "
        "gradients, sums over the window's tokens (chapter 03's aside).",
    "capstone.4":
        "Dividing by the global N but not multiplying by W, then again by the "
        "microbatches, leaves a factor 1 / (W M), the same on every rank: parity "
        "and trajectory see the scale, accumulation_invariance sees M change; "
        "permutation and no_sync hold.",
    "capstone.5":
        "The model weights and the optimizer state are the same on every rank and "
        "never depend on W: a 2-rank job loads them as they are. The course's "
        "sampler draws accumulation x batch sequences per rank from W length "
        "bands, so at W = 2 its state yields other, half-sized windows (32 "
        "sequences, 2 of them shared with the 4-rank run's next 64), and four "
        "ranks' dropout streams cannot become two: a resume on another world size "
        "needs a sampler that draws the global window, then splits it.",
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
    """slug -> notebook stem, e.g. ddp_parity -> 04_ddp_parity."""
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
