"""Chapter 06's graded questions (``notebooks/06_checkpoint_resume.ipynb``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.course.grading import Question, from_run


def _reseeded_window(update: int) -> Callable[[Any], int]:
    """06: the window (from 0) the re-seeded sampler draws for ``update``. A
    checkpoint saved after the re-seeding keeps the re-seeded sampler, so a
    full resume from it goes on counting."""
    def get(r) -> int:
        first = r.ablations["sampler_from_seed"].first_window_after_resume
        return first + update - (r.resumed_from_step + 1)
    return get


QUESTIONS: dict[str, Question] = {
    "checkpoint_resume.predict": Question(
        "Which of the six resumes change the parameters at step 100?",
        "choices",
        ("model_only", "no_optimizer_state", "sampler_from_seed", "no_rng_state"),
        "for each piece, ask whether anything after step 50 reads it: which "
        "generator draws the dropout masks, and does a restored sampler need "
        "its seed once its generator's state is back?",
        options=("model_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state", "other Python RNG states", "another sampler seed"),
        reasoning=(
            "The four ablations: each drops one piece that the updates after step 50 "
            "read, the momentum (model_only, no_optimizer_state), the order of the "
            "windows (sampler_from_seed), the dropout masks (no_rng_state), and any "
            "one of them changes the parameters by step 100. Nothing in the step "
            "draws from Python's random (the sampler has its own generator), and "
            "load_state_dict restores the sampler's generator state and history "
            "without reading its saved seed, so other Python RNG states and "
            "another sampler seed leave step 100 bit for bit the same.")),
    "checkpoint_resume.1": Question(
        "Set the model's dropout to 0 and SGD's momentum to 0 "
        "(dataclasses.replace on cfg.model and cfg.train), then run "
        "stop_and_continuous and resume_check in a scratch folder: which "
        "ablations still change the parameters at step 100?", "choices",
        ("model_only", "sampler_from_seed"),
        "which piece of state did only the dropout masks read, and which one "
        "only the momentum? what does each ablation leave out?",
        options=("model_only", "no_optimizer_state", "sampler_from_seed",
                 "no_rng_state"),
        reasoning=(
            "Without dropout nothing after step 50 draws from the torch "
            "generators, so no_rng_state changes nothing; with momentum 0 SGD keeps "
            "no buffers (optimizer.pt holds no state to restore), so "
            "no_optimizer_state changes nothing either. The order of the windows "
            "still matters: sampler_from_seed replays windows 0, 1, ..., and "
            "model_only restarts the sampler too (measured: both differ by "
            "0.035, the other two are bit for bit the continuous run).")),
    "checkpoint_resume.2": Question(
        "A run resumes from step 50 with its sampler re-seeded, as in "
        "sampler_from_seed, and saves its checkpoints at steps 75 and 100 as "
        "usual. It is stopped after step 75, and a new job resumes from "
        "step-0075 with every part restored. Counting windows from 0 as the "
        "continuous run does (update 1 draws window 0): which window does "
        "update 80 draw?",
        "number", from_run("course_lib.jobs.resume:ResumeReport", _reseeded_window(80)),
        "what sampler state did the checkpoint at step 75 save, and which "
        "window had that sampler drawn last?",
        reasoning=(
            "The re-seeded sampler starts its order over: updates 51 to 75 draw "
            "windows 0 to 24, and the checkpoint at step 75 saves that sampler as it "
            "stands. The full resume restores it faithfully, so updates 76 to 80 "
            "draw windows 25 to 29: update 80 draws window 29, not 79, as a "
            "checkpoint saves the trajectory it is on, wrong or right.")),
    "checkpoint_resume.3": Question(
        "The run folder holds step-0025 and step-0050, and a restarted job "
        "saves step 50 again. It is killed between final.rename(old) and "
        "tmp.rename(final). The next start resumes from what "
        "checkpoint.latest_valid returns: from which step?", "number", 25,
        "at that moment, what is each folder called, and which names does "
        "latest_valid look at?",
        reasoning=(
            "Between the two renames the complete new checkpoint is step-0050.tmp and "
            "the old one step-0050.old; latest_valid looks at step-NNNN names only, "
            "so the newest it finds is step-0025, and the run resumes from step 25 "
            "(a valid copy of step 50 sits in step-0050.old, unused). That is the gap "
            "of the two renames: when the resumed run saves step 50 again, it deletes "
            "the left-over step-0050.tmp first and step-0050.old before its renames, "
            "so both complete copies are lost. A latest_valid that also tried "
            "step-NNNN.old folders, each complete when it was moved aside, would "
            "resume from step 50 instead.")),
    "checkpoint_resume.4": Question(
        "A run feeds DDP from torch's DistributedSampler instead of the "
        "course's sampler: the 1,024 train sequences, 2 ranks, each update 2 "
        "microbatches of 8 sequences per rank (accumulation 2), a new shuffle "
        "per epoch. It checkpoints after update 90 and resumes. Its loader "
        "has no state to restore, so the resume does what the Hugging Face "
        "Trainer does: it works out from the step which epoch it is in, calls "
        "set_epoch on it and skips the microbatches that epoch has already "
        "consumed. How many microbatches does each rank's loader skip?",
        "number", 52,
        "how many microbatches does one rank's loader yield per epoch, and so "
        "how many updates does an epoch hold? Then place update 90 in its epoch",
        reasoning=(
            "Each rank's share of an epoch is 1024 / 2 = 512 sequences, 64 "
            "microbatches of 8, so an epoch holds 64 / 2 = 32 updates. After 90 "
            "updates the run has done 2 whole epochs (64 updates) and 26 updates "
            "of the third, so the resume calls set_epoch(2), which deals the "
            "stopped run's shuffle again (DistributedSampler's order is a function "
            "of its seed and epoch alone), and skips 26 x 2 = 52 microbatches per "
            "rank, as the Trainer computes it: (step % updates per epoch) x "
            "accumulation. The course's sampler needs none of this arithmetic: "
            "it saves where its generator stands.")),
    "checkpoint_resume.5": Question(
        "A resume script loads model.pt and optimizer.pt on rank 0 only: rank 1 "
        "keeps the weights it was built with and a fresh SGD, with no momentum "
        "buffers. Then every rank wraps its model in DDP, as usual after loading, "
        "and training goes on from step 50. What is still wrong on rank 1 when "
        "update 51 runs?", "choice", "the momentum",
        "what does DDP send from rank 0 when it wraps the model (chapter 00), "
        "and is the optimizer part of the model?",
        options=("the weights", "the momentum", "the weights and the momentum",
                 "nothing"),
        reasoning=(
            "DDP's constructor broadcasts rank 0's parameters and buffers to every "
            "rank, so the wrap gives rank 1 the restored weights; the optimizer is "
            "not part of the module, and DDP never syncs it. Rank 1's fresh SGD "
            "steps along g_51 alone where rank 0 steps along 0.9 b_50 + g_51, so the "
            "replicas part at update 51 and, with no broadcast after the wrap, the "
            "two ranks train two models from then on. Every rank loads optimizer.pt "
            "(or rank 0 broadcasts its state), as the checkpoint's table says.")),
}
