"""Chapter 10's graded questions (``notebooks/10_capstone.ipynb``)."""

from __future__ import annotations

from course_lib.course.grading import Question

QUESTIONS: dict[str, Question] = {
    "capstone.predict": Question(
        "Read the script's four functions as a reviewer would: which of these "
        "does it get wrong?", "choices",
        ("the step's token count", "the step's scale", "the checkpoint's sampler",
         "the checkpoint's RNG states", "the evaluation's shares of the test set",
         "the evaluation's average"),
        "hold each against its chapter: what N counts, and on which ranks (02, "
        "03); what multiplies S_r (03); what no_sync() wraps (03, 05); what a "
        "resume must restore (06); which sequences each rank scores, and what is "
        "averaged (07)",
        options=("the step's token count", "the step's scale", "the step's sync",
                 "the checkpoint's model and optimizer", "the checkpoint's sampler",
                 "the checkpoint's RNG states", "the evaluation's shares of the test set",
                 "the evaluation's average"),
        reasoning=(
            "Six of the eight. The count takes labels.numel() (padding included) on "
            "this rank alone; the scale lacks the factor W and divides again by the "
            "microbatches; the checkpoint never saves the sampler (a resume draws the "
            "first windows again) and restores rank 0's RNG state on every rank; the "
            "evaluation's DistributedSampler scores 2 sequences twice at W = 3, and it "
            "averages rank means. The sync is right (no_sync() wraps the forward and "
            "the backward of every microbatch but the last), and so are the model and "
            "optimizer state: the grade fails every property but no_sync.")),
    "capstone.predict_count": Question(
        "The script with the checkpoint fix and only step's count fixed (N as "
        "the supervised labels, all-reduced over the ranks), the rest of step "
        "as it was: which of the five properties of step that failed still fail? "
        "(no_sync passed already)", "choice",
        "parity + trajectory + accumulation_invariance",
        "what is left in step: a factor the same on every rank, or one per rank? "
        "does it depend on the number of microbatches, and on how many there "
        "are in the whole window?",
        options=("none of them", "accumulation_invariance alone",
                 "parity + trajectory + accumulation_invariance",
                 "parity + trajectory + world_size_invariance", "all five"),
        reasoning=(
            "Dividing by the global N but not multiplying by W, then again by the "
            "microbatches, leaves a factor 1 / (W M), the same on every rank: parity "
            "and trajectory see the scale, accumulation_invariance sees M change. "
            "world_size_invariance keeps the window's microbatches and spreads them "
            "over 1, 2 or 4 ranks, so W M, the window's number of microbatches, "
            "never moves there: it passes, and so does permutation_invariance, "
            "since every rank carries the same factor.")),
    "capstone.predict_crash": Question(
        "Every process is killed while rank 0 is inside the torch.save of save "
        "at update 40; step-0020 is the last checkpoint saved before. The restart "
        "resumes from the newest step-* directory that holds a state.pt. With "
        "save as it is (the script's or the checkpoint fix's: they write alike), "
        "what does the restart load?", "choice",
        "a half-written step-0040",
        "what does dist.barrier() wait for, and what lies on disk under "
        "state.pt's final name the moment torch.save is killed?",
        options=("a whole step-0040", "a half-written step-0040", "step-0020"),
        reasoning=(
            "A half-written step-0040: torch.save writes state.pt under its final name "
            "as it goes, so the killed write leaves a truncated file there, and "
            "torch.load fails on it; the barrier only makes the other ranks wait for "
            "a write that finishes. The grader never interrupts a save, so it cannot "
            "see this. Renaming each file once whole is not enough, since a kill "
            "between rank 0's state.pt and rank 1's file leaves a step-0040 with a "
            "state.pt and no rank-1.pt; the fix is chapter 06's: every rank writes "
            "into step-0040.tmp, and rank 0 renames the folder once every file is "
            "in it, so the restart loads step-0020.")),
    "capstone.predict_empty": Question(
        "Two ranks; rank 1's window holds no supervised token, rank 0's does. "
        "Which of these steps still pass parity against the one-process token "
        "mean? mean of means (mean_of_means: each rank backprops S_r / N_r), post "
        "scale (post_scale, chapter 03, audited in 05: the raw sum S_r, the "
        "gradients scaled by W / N after the sync), local count (local_count: "
        "W * S_r / N_r, the count never all-reduced)",
        "choices", ("post scale", "local count"),
        "N = N_0 here, and an empty rank's gradient is a finite zero: write each "
        "step's update as a sum over the ranks and compare it with S_0 / N_0",
        options=("mean of means", "post scale", "local count"),
        reasoning=(
            "With N = N_0, rank 1's gradient is a finite zero in all three steps "
            "(its sum is 0; under mean_of_means and local_count its 0 / 0 loss is NaN, "
            "but cross-entropy's backward writes 0 for ignored targets). post_scale "
            "gives (S_0 + 0) / 2 * 2 / N_0 and local_count (2 S_0 / N_0 + 0) / 2, both "
            "S_0 / N_0 = S / N: they pass, local_count by accident, since N_0 = N; the "
            "mean of means gives S_0 / (2 N_0), half the update, and fails.")),
    "capstone.1": Question(
        "Two nodes of 4 ranks each. The step backprops W * S_r / N with W = 8, "
        "but N is all-reduced over a node-local process group only, so each "
        "rank divides by its own node's tokens. Node 0 holds three times node "
        "1's tokens. A token on node 1 weighs how many times the token mean's "
        "1/N? (Then a token on node 0: is the update a scale of the right one, "
        "or a bias?)", "number", (3 + 1) / 1,
        "DDP still averages over all 8 ranks: write the update as a sum over the "
        "two nodes, each node's sum divided by its own count, and put N_0 = 3 N_1",
        rel_tol=1e-6,
        reasoning=(
            "DDP averages the 8 ranks' W * S_r / N_k, which leaves S^(0) / N_0 + "
            "S^(1) / N_1: each node's own token mean, added. With N = N_0 + N_1 = 4 N_1, "
            "a node-1 token weighs 1 / N_1 = 4 / N and a node-0 token 1 / N_0 = (4/3) / "
            "N: the nodes' tokens weigh differently, a bias (even equal nodes would get "
            "the scale 2, the number of nodes), so N must be all-reduced over every node.")),
    "capstone.2": Question(
        "The count takes labels.numel(). Five windows, each one microbatch of 4 "
        "sequences padded to its longest, with these supervised tokens per "
        "sequence: (50, 50, 50, 50), (20, 40, 60, 80), (10, 20, 10, 80), "
        "(70, 80, 80, 90), (30, 60, 60, 90). Each window's update is the token "
        "mean's times a factor of its own: the largest of the five factors over "
        "the smallest?", "number", (200 / 200) / (120 / 320),
        "each window divides its loss sum by 4 times its longest sequence "
        "instead of by its supervised tokens N: what is N / numel in each?",
        rel_tol=1e-3,
        reasoning=(
            "Each window divides by 4 times its longest sequence, 200, 320, 320, 360 "
            "and 360 slots, for 200, 200, 120, 320 and 240 supervised tokens: the "
            "factors N / numel are 1, 0.625, 0.375, 0.889 and 0.667. The first "
            "window, with no padding, keeps the token mean's step, and the third, "
            "one long sequence among short ones, gets 0.375 of it: 1 / 0.375 = 2.67. "
            "Each window alone is only scaled, but over a run the padding reweights "
            "the windows, and those whose lengths differ most weigh least.")),
    "capstone.3": Question(
        "Convert the script's step to chapter 03's post_scale (audited in 05: "
        "backprop the raw sum S_r, then scale the gradients by W / N after the "
        "sync) and run the model and its loss in float16 (model.half(), no "
        "autocast, no GradScaler: unlike chapter 03's autocast, the loss itself is "
        "float16 here), whose largest value is 65,504; the loss starts "
        "near 3.6 nats per token. As a rank's window grows, which quantity overflows "
        "first, and before which call?", "choice", "S_r before backward()",
        "compare how fast each grows per supervised token: the loss sum, a "
        "logit's gradient (softmax minus one-hot), the count; and which one is "
        "computed first",
        options=("S_r before backward()", "the gradients in DDP's all-reduce",
                 "the gradients in the scale by W / N", "N in its all_reduce"),
        reasoning=(
            "S_r before backward(): the loss sum grows by about 3.6 per supervised "
            "token and passes 65,504 near 65,504 / 3.6 = 18,200 tokens on one rank, an "
            "inf loss in the forward; a logit's gradient grows by at most 1 per token, "
            "and N is an int64 count. Scale before the backward (W / N, as "
            "global_token does, keeps every value the size of a mean) or sum the loss "
            "in float32. Under float16 autocast, chapter 03's reading, the loss is "
            "float32 (autocast runs cross_entropy in float32) and S_r never overflows: "
            "the first overflow is then in the backward's float16 activation "
            "gradients, sums over the window's tokens (chapter 03's aside).")),
    "capstone.4": Question(
        "A 4-rank run of the fixed script is resumed on 2 ranks from its "
        "checkpoint. Which parts of the checkpoint can the 2-rank job load and "
        "use unchanged? (For each part you leave out, say first what in it "
        "depends on the 4 ranks.)", "choices", ("model weights", "optimizer state"),
        "which parts are the same on every rank and never mention W, and what "
        "does the course's sampler draw per rank? (make_sampler(cfg, corpus, 4) "
        "and (..., 2): draw, load one's state into the other, compare)",
        options=("model weights", "optimizer state", "sampler state",
                 "per-rank RNG states"),
        reasoning=(
            "The model weights and the optimizer state are the same on every rank and "
            "never depend on W: a 2-rank job loads them as they are. The course's "
            "sampler draws accumulation x batch sequences per rank from W length "
            "bands, so at W = 2 its state yields other, half-sized windows (32 "
            "sequences, 2 of them shared with the 4-rank run's next 64), and four "
            "ranks' dropout streams cannot become two: a resume on another world size "
            "needs a sampler that draws the global window, then splits it.")),
}
