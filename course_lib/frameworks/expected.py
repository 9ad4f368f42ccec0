"""What the sources say each framework trains, by version, model and flag:
the table that a run of the real code confirms or corrects.

``expected(...)`` names the candidate formula (``candidates``) that the
reading predicts; ``tests/test_frameworks.py`` compares it with the run.
Where a run disagreed with ``../shared/research/peer-recipes.md``, the run
won, and the entry says what the reading had missed.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from course_lib.frameworks.candidates import EXACT

# Hugging Face models whose ``loss_type`` resolves to ``ForCausalLMLoss``,
# which decides (from 5.10.1, #46204) whether the Trainer counts the labels
# after the shift. Measured with models built from a config: a
# ``LlamaForCausalLM`` does; a ``GPT2LMHeadModel`` has ``loss_type`` None, so
# the Trainer still counts before the shift (the reading assumed every
# causal LM did; peer-recipes-rl.md's correction was right).
SHIFTS_LABELS = {"llama": True, "gpt2": False}


# Models whose forward took the Trainer's loss kwargs (num_items_in_batch)
# in 4.46.x: the others still returned a per-microbatch mean (#35438).
TOOK_LOSS_KWARGS_4_46 = {"llama": True, "gpt2": False}


def _hf(version: str, model: str, average_tokens: bool) -> str | None:
    """transformers' Trainer, by version (peer-recipes.md section 2)."""
    v = Version(version)
    kwargs = TOOK_LOSS_KWARGS_4_46.get(model, True)
    if v < Version("4.46.0"):
        return "mean of microbatch means"  # the model's mean, / GA by accelerate
    if v < Version("4.46.2"):  # #34191: S / N_r, post-shift, local
        return "mean of rank means" if kwargs else "mean of microbatch means without 1/M"
    if v < Version("4.46.3"):
        return None  # no_sync inverted (#34645): the ranks disagree, no formula
    if v < Version("4.48.0") and not kwargs:
        return "mean of microbatch means without 1/M"  # no / GA anywhere (#35438)
    post_shift = v >= Version("5.10.1") and SHIFTS_LABELS.get(model, False)
    if average_tokens:  # W S / N' on every rank, N' gathered
        return EXACT.name if post_shift else "counted before the shift"
    # S / N_r', N_r' this rank's own count
    return "mean of rank means" if post_shift else "mean of rank means counted before the shift"


def expected(framework: str, version: str, model: str, flags: dict[str, Any],
             stack: dict[str, str] | None = None) -> str | None:
    """The candidate the reading predicts, or None where it says nothing.
    ``stack``: the versions installed beside it (TRL runs transformers')."""
    if framework == "hf":
        default = Version(version) >= Version("4.54.0")  # #39395
        return _hf(version, model, bool(flags.get("average_tokens_across_devices", default)))
    if framework in ("trl", "unsloth"):
        # SFTTrainer is the HF Trainer's loop; its loss divides by the same
        # num_items_in_batch (trl 1.16 sft_trainer.compute_loss). Unsloth's
        # patched get_batch_samples counts as the Trainer does (measured on
        # 2026.10.9 with transformers 5.17.0: the same formulas).
        hf = (stack or {}).get("transformers")
        if hf is None:
            return None
        return _hf(hf, model, bool(flags.get("average_tokens_across_devices", True)))
    if framework == "accelerate":
        # accumulate(): the model's mean loss, / GA in accelerator.backward;
        # the docs recipe counts labels.ne(-100) before a causal LM's shift.
        return {"accumulate": "mean of microbatch means",
                "docs_recipe": "counted before the shift"}[flags.get("recipe", "accumulate")]
    if framework == "lightning":
        # ClosureResult divides the user's (mean) loss by accumulate_grad_batches.
        return "mean of microbatch means"
    return None
