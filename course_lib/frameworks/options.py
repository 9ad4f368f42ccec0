"""The configurations people train with: ``course-lib frameworks --with NAME``.

A framework's plain rows run its defaults. An ``Option`` is one configuration
on top of them (a LoRA adapter, gradient checkpointing, a collator, FSDP...):
each of its ``states`` is a row of the matrix, on every framework it applies
to, every model and every flag set of that framework. A state may set the
framework's own flags (``flags``: the row carries them), wrap the model before
the framework sees it (``model``: the reference is then the same wrapped
model), or hand the framework its own dataset and collator (``data``).

An option that cannot run here (a missing package, triton, CUDA) is not left
out: the framework itself refuses it while it is built, and the row is ``not
run`` with the framework's own reason. A new configuration is one ``Option``
and its entry in ``OPTIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib.frameworks import Captured
from course_lib.frameworks.window import Window, dispatched

State = dict[str, Any]


@dataclass(frozen=True)
class Option:
    name: str
    summary: str  # what it trains, in a few words (the CLI's help)
    frameworks: tuple[str, ...]  # the adapters it applies to
    states: tuple[State, ...]  # each a row
    package: str | None = None  # the distribution it runs, beyond the framework's
    # The framework's own flags a state sets (TrainingArguments'): in the row.
    flags: Callable[[State], dict[str, Any]] = field(default=lambda state: {})
    # The model, wrapped before the framework and the reference see it.
    model: Callable[[torch.nn.Module, State], torch.nn.Module] | None = None
    # (train dataset, collator) for the framework, from the window; a collator
    # of None: the framework's own, which prepares the rows itself (TRL).
    data: Callable[[Window, State, int], tuple[Any, Any]] | None = None
    # What the row says about the model as trained (a line each).
    notes: Callable[[torch.nn.Module, State], list[str]] = field(
        default=lambda model, state: [])
    # Why the run was not this configuration after all (the framework
    # dropped it without a word), from what it captured: the row is then
    # "not run", with that reason. None: it was.
    unmet: Callable[[Captured], str | None] = field(default=lambda captured: None)


class UnknownOption(ValueError):
    """A --with that names no configuration, or one no named framework takes."""


# --- lora: a PEFT adapter on the attention projections --------------------------------


def _attention_projections(model: torch.nn.Module) -> list[str]:
    """The full names of the linear maps inside each attention block: llama's
    q/k/v/o_proj, GPT-2's c_attn and attn.c_proj (not the MLP's c_proj)."""
    found = []
    for name, module in model.named_modules():
        parent = name.rpartition(".")[0].rpartition(".")[2]
        weight = getattr(module, "weight", None)
        if (("attn" in parent or "attention" in parent) and not list(module.children())
                and isinstance(weight, torch.Tensor) and weight.dim() == 2):
            found.append(name)
    return found


def _lora(model: torch.nn.Module, state: State) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = _attention_projections(model)
    if not targets:
        raise ValueError(f"lora: no attention projection in {type(model).__name__}")
    # init_lora_weights=False: B is random too, so both factors have gradients
    # (with PEFT's default B = 0, A's gradient is zero).
    config = LoraConfig(r=state["r"], lora_alpha=state["alpha"], lora_dropout=0.0,
                        target_modules=targets, init_lora_weights=False,
                        fan_in_fan_out=type(model).__name__.startswith("GPT2"))
    return get_peft_model(model, config)


def _trainable(model: torch.nn.Module, state: State) -> list[str]:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = getattr(model, "peft_config", {}).get("default")
    targets = sorted({str(n).rpartition(".")[2] for n in getattr(config, "target_modules", ())})
    return [f"LoRA r={state['r']}: the adapter's {trained} of {total} components "
            f"trained (on {', '.join(targets)}); the reference is the same wrapped model"]


LORA = Option("lora", "a PEFT LoRA adapter on the attention projections",
              ("hf", "trl", "trainer"), ({"r": 4, "alpha": 8},), "peft",
              model=_lora, notes=_trainable)


# --- gradient_checkpointing: the Trainer's flag, by use_reentrant ------------------------


def _checkpointing(state: State) -> dict[str, Any]:
    if state["use_reentrant"] == "default":
        return {"gradient_checkpointing": True}
    return {"gradient_checkpointing": True,
            "gradient_checkpointing_kwargs": {"use_reentrant": state["use_reentrant"]}}


CHECKPOINTING = Option(
    "gradient_checkpointing", "the Trainer's gradient_checkpointing, by use_reentrant",
    ("hf", "trl"),
    ({"use_reentrant": "default"}, {"use_reentrant": True}, {"use_reentrant": False}),
    flags=_checkpointing)


# --- collator: the Trainer fed unpadded rows through a collator of transformers ------------


def _collated(window: Window, state: State, vocab_size: int) -> tuple[Any, Any]:
    """Every row unpadded, without labels (the collator makes them), dealt as
    ``window.dispatched`` deals them; the collator that pads or flattens them."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

    from course_lib.frameworks.tokenizer import word_level

    def unpadded(mb: Any, row: int) -> dict:
        n = int(mb.attention_mask[row].sum())
        return {"input_ids": mb.input_ids[row, :n].tolist()}

    rows = dispatched(window, unpadded)
    if state["collator"] == "language_modeling":
        return rows, DataCollatorForLanguageModeling(word_level(vocab_size), mlm=False)
    return rows, DataCollatorWithFlattening()


def _attention(model: torch.nn.Module, state: State) -> list[str]:
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    said = {"language_modeling": "labels are the input ids, the padding masked (the "
            "window's masked prompts are supervised)",
            "flattening": "each microbatch one row of concatenated sequences, with "
            "position_ids and no attention mask; the reference is the model as fed "
            "(no cache: the mask of each sequence from its position_ids)"}
    return [f"{state['collator']}: {said[state['collator']]}; attention: {implementation}"]


COLLATOR = Option(
    "collator", "DataCollatorForLanguageModeling(mlm=False), DataCollatorWithFlattening",
    ("hf",), ({"collator": "language_modeling"}, {"collator": "flattening"}),
    # Each rank collates its own rows (the dispatcher would concatenate rows of
    # different lengths); IterableDatasetShard deals them in the same order.
    flags=lambda state: {"accelerator_config": {"dispatch_batches": False}},
    data=_collated, notes=_attention)


# --- TRL's own data preparation: completion_only, assistant_only, packing -----------------
#
# The window's rows as text, conversations or unpadded ids, which TRL
# tokenises, masks, packs and collates itself. The reference is built from
# the labels and masks the model was fed (``Captured.seen``), so the prompt's
# share, the packing and the masks TRL chose are all in it.


def _prepared_by_trl(window: Window, row_of: Callable[[Any, int], dict]) -> tuple[Any, Any]:
    """The rows ``row_of`` makes, in ``dispatched`` order, as the ``datasets``
    IterableDataset TRL requires; no collator, so TRL's own."""
    from datasets import IterableDataset

    rows = list(dispatched(window, row_of))
    return IterableDataset.from_generator(lambda: iter(rows)), None


def _ids(mb: Any, row: int) -> list[int]:
    return mb.input_ids[row, : int(mb.attention_mask[row].sum())].tolist()


def _words(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def _prompt_length(ids: list[int]) -> int:
    """From 1 to half the row, from its content: the prompt's share moves from
    row to row (so each rank's count N_r does), the same on every rank."""
    return 1 + sum(ids) % (len(ids) // 2)


def _prompt_completion(mb: Any, row: int) -> dict:
    ids = _ids(mb, row)
    p = _prompt_length(ids)
    # The completion's leading space: joined, the two are the row's text.
    return {"prompt": _words(ids[:p]), "completion": " " + _words(ids[p:])}


def _conversation(mb: Any, row: int) -> dict:
    """Four turns, user and assistant in turn: the prompt, then the rest in thirds."""
    ids = _ids(mb, row)
    p = _prompt_length(ids)
    third = (len(ids) - p) // 3  # at least 1: the rest is half the row or more (>= 6)
    cuts = [0, p, p + third, p + 2 * third, len(ids)]
    roles = ("user", "assistant", "user", "assistant")
    return {"messages": [{"role": role, "content": _words(ids[a:b])}
                         for role, a, b in zip(roles, cuts, cuts[1:], strict=False)]}


def _labelled(mb: Any, row: int) -> dict:
    """Unpadded ids with the window's own labels (its masked prompts): TRL
    leaves a labels column as it is, and packs both."""
    n = int(mb.attention_mask[row].sum())
    return {"input_ids": mb.input_ids[row, :n].tolist(), "labels": mb.labels[row, :n].tolist()}


def _loss_on(flag: str, said: dict[bool, str]) -> Callable[[torch.nn.Module, State], list[str]]:
    def notes(model: torch.nn.Module, state: State) -> list[str]:
        return [f"{flag}={state[flag]}: {said[state[flag]]}; TRL tokenised the rows and "
                "built the labels: the reference is built from the labels it fed"]
    return notes


COMPLETION_ONLY = Option(
    "completion_only", "TRL's completion_only_loss on prompt-completion rows, on and off",
    ("trl",),
    ({"completion_only_loss": True}, {"completion_only_loss": False}),
    flags=lambda state: dict(state),
    data=lambda window, state, vocab_size: _prepared_by_trl(window, _prompt_completion),
    notes=_loss_on("completion_only_loss", {
        True: "each row a prompt of 1 to n/2 tokens and its completion (TRL adds the EOS), "
              "the prompt's labels masked", False: "the same rows, every label supervised"}))
ASSISTANT_ONLY = Option(
    "assistant_only", "TRL's assistant_only_loss on conversations, on and off, with a chat "
    "template of its own that marks the assistant's turns", ("trl",),
    ({"assistant_only_loss": True}, {"assistant_only_loss": False}),
    flags=lambda state: dict(state),
    data=lambda window, state, vocab_size: _prepared_by_trl(window, _conversation),
    notes=_loss_on("assistant_only_loss", {
        True: "each row four turns (user, assistant, user, assistant), rendered by the "
              "tokenizer's own chat template, the users' labels masked",
        False: "the same conversations, every label supervised"}))


# The packed rows: as long as the window's (whose sequences are shorter, so
# that some rows hold two), one a microbatch, so that the window's sequences
# fill a step's W x M rows and none is dealt twice (accelerate's shard would
# complete a short last batch with the first rows again).
PACKED = {"packing": True, "max_length": 24, "per_device_train_batch_size": 1}


# SFTConfig's packing_strategy choices (TRL 1.16), as its help says them.
STRATEGIES = {"bfd": "best-fit decreasing, the overflow truncated",
              "bfd_split": "best-fit decreasing, the overflow split into sequences of its own",
              "wrapped": "the sequences concatenated and cut every max_length tokens"}


def _packing(state: State) -> dict[str, Any]:
    if "packing_strategy" in state:
        return {**PACKED, **state}
    # Unpacked, TRL refuses a max_length it would not enforce, and says to unset it.
    return {**state, "max_length": None}


def _isolated(model: torch.nn.Module) -> bool:
    """Whether two sequences packed in one row, fed as TRL feeds them
    padding-free (position_ids restarting, no attention mask, no cache), stay
    apart: the second's logits are those it has alone."""
    device = next(model.parameters()).device
    ids = torch.arange(1, 8, device=device)[None]
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]], device=device)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 3:]
        alone = model(input_ids=ids[:, 3:], use_cache=False).logits[0]
    return bool(torch.allclose(packed.float(), alone.float(), atol=1e-4))


def _packed(model: torch.nn.Module, state: State) -> list[str]:
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    strategy = state.get("packing_strategy")
    fed = (f"packing {strategy}: {STRATEGIES.get(strategy, strategy)}, one row of up to "
           f"{PACKED['max_length']} tokens a microbatch" if strategy else
           "padding_free: each microbatch's rows flattened into one row, unpacked")
    if strategy == "wrapped":  # no sequence boundary survives: one sequence to the model
        apart = ("a row is one sequence to the model (a mask of ones, positions running "
                 "on): its pieces attend to each other, and the reference is the model as fed")
    elif _isolated(model):
        apart = ("fed padding-free (position_ids), each sequence attends to itself only: "
                 "transformers masks by the position_ids")
    else:
        apart = ("fed padding-free (position_ids), the sequences of a row attend to each "
                 "other: the reference is the model as fed")
    return [f"{fed}; attention: {implementation}: {apart}"]


PACKING = Option(
    "packing", "TRL's packing, by packing_strategy (bfd, bfd_split, wrapped), and "
    "padding_free", ("trl",),
    (*({"packing_strategy": strategy} for strategy in STRATEGIES),
     {"padding_free": True}),
    flags=_packing,
    data=lambda window, state, vocab_size: _prepared_by_trl(window, _labelled),
    notes=_packed)


# --- the rest: a flag each, refused by the framework where it cannot run -------------------


# What accelerate ran instead of FSDP, as a row's reason says it (and chapter
# 08 rewords it in the learner's language).
UNSHARDED = "accelerate {version} ran {ran} here, not FSDP"


def _unsharded(captured: Captured) -> str | None:
    """FSDP asked for, and no parameter sharded at the optimizer step: say
    what accelerate ran instead."""
    if captured.sharded:
        return None
    from accelerate import __version__
    from accelerate.state import AcceleratorState

    ran = AcceleratorState().distributed_type
    return (f"fsdp: {UNSHARDED.format(version=__version__, ran=ran)}: no parameter was "
            "sharded at the optimizer step (it keeps the FSDP plugin only on a GPU-like "
            "device), so this was plain DDP")


FSDP = Option("fsdp", "accelerate's FSDP2 through the Trainer, the sharded gradient "
              "gathered", ("hf",), ({"version": 2},),
              flags=lambda state: {"fsdp": True, "fsdp_config": {"version": state["version"]}},
              unmet=_unsharded)
DEEPSPEED = Option("deepspeed", "DeepSpeed ZeRO stage 2 through the Trainer", ("hf",),
                   ({"zero_stage": 2},), "deepspeed",
                   flags=lambda state: {"deepspeed": {
                       "zero_optimization": {"stage": state["zero_stage"]},
                       "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto",
                       "train_batch_size": "auto", "gradient_clipping": "auto"}})
LIGER = Option("liger", "Liger's fused linear cross-entropy (use_liger_kernel)", ("hf",),
               ({"use_liger_kernel": True},), "liger-kernel", flags=lambda state: dict(state))
def _fresh_dynamo(model: torch.nn.Module, state: State) -> torch.nn.Module:
    """Dynamo's caches emptied, so that this row compiles its own graphs (an
    earlier row's would serve it, and nothing would show it compiled)."""
    import torch._dynamo

    torch._dynamo.reset()
    return model


COMPILE = Option("compile", "torch.compile through the Trainer (torch_compile)", ("hf",),
                 ({"torch_compile": True},), flags=lambda state: dict(state),
                 model=_fresh_dynamo,
                 unmet=lambda captured: None if captured.compiled else
                 "compile: dynamo compiled no graph while the Trainer trained")


OPTIONS: dict[str, Option] = {o.name: o for o in (
    LORA, CHECKPOINTING, COLLATOR, FSDP, DEEPSPEED, LIGER, COMPILE, COMPLETION_ONLY,
    ASSISTANT_ONLY, PACKING)}
NAMES: tuple[str, ...] = tuple(OPTIONS)


def parse(text: str | None, frameworks: list[str]) -> list[str]:
    """``--with a,b``: the options, each applying to one named framework at least."""
    names = list(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    for name in names:
        if name not in OPTIONS:
            raise UnknownOption(f"--with: unknown configuration {name!r} "
                                f"(choose from {', '.join(NAMES)})")
        if not set(OPTIONS[name].frameworks) & set(frameworks):
            raise UnknownOption(f"--with {name}: applies to "
                                f"{', '.join(OPTIONS[name].frameworks)}, "
                                f"not to {', '.join(frameworks)}")
    return names


def wrap(uses: dict[str, State], model: torch.nn.Module) -> torch.nn.Module:
    """The model as the configuration trains it."""
    for name, state in uses.items():
        build = OPTIONS[name].model
        if build is not None:
            model = build(model, state)
    return model


def data(uses: dict[str, State], window: Window, vocab_size: int
         ) -> tuple[Any, Any] | None:
    """(train dataset, collator) of the configuration, or None: the window as is."""
    for name, state in uses.items():
        make = OPTIONS[name].data
        if make is not None:
            return make(window, state, vocab_size)
    return None


def unmet(uses: dict[str, State], captured: Captured) -> str:
    """Why the run was not the configuration asked for, or ""."""
    return "; ".join(filter(None, (OPTIONS[name].unmet(captured) for name in uses)))


def notes(uses: dict[str, State], model: torch.nn.Module) -> list[str]:
    return [line for name, state in uses.items() for line in OPTIONS[name].notes(model, state)]
