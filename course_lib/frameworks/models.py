"""Tiny causal language models built from a config: no download, dropout 0.

``--model gpt2,llama`` names Hugging Face ``model_type``s. Any model_type
that ``AutoConfig.for_model`` knows can be named: its size fields are set
small when it has them (``SIZES``), and every dropout field is set to 0, so
the gradient is deterministic and the same on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Size fields, under the names the configs use for them, and a tiny value.
SIZES: dict[str, int] = {
    "n_layer": 2, "num_hidden_layers": 2, "n_embd": 32, "hidden_size": 32,
    "d_model": 32, "n_head": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 64, "n_inner": 64, "ffn_dim": 64, "d_ff": 64,
    "n_positions": 64, "max_position_embeddings": 64, "n_ctx": 64,
    "head_dim": 16,
}
# GPT-2 small (124M parameters) and medium (355M), for the scale benchmark.
GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
              "n_ctx": 1024}
GPT2_MEDIUM = {**GPT2_SMALL, "n_layer": 24, "n_embd": 1024, "n_head": 16}
SIZE_PRESETS: dict[str, dict[str, int] | None] = {
    "tiny": None, "gpt2-small": GPT2_SMALL, "gpt2-medium": GPT2_MEDIUM}


class UnknownModel(ValueError):
    """A --model that no installed transformers knows."""


def config(model_type: str, vocab_size: int, sizes: Mapping[str, float] | None = None) -> Any:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.for_model(model_type)
    except ValueError as exc:
        raise UnknownModel(f"--model: {model_type!r} is not a model_type this "
                           f"transformers knows ({exc})") from None
    for name, value in (sizes or SIZES).items():
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    for name in list(vars(cfg)):
        if "dropout" in name or name.endswith("_pdrop"):
            setattr(cfg, name, 0.0)
    cfg.vocab_size = vocab_size
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if hasattr(cfg, name):
            setattr(cfg, name, 0)
    return cfg


def build(model_type: str, vocab_size: int, seed: int,
          sizes: Mapping[str, float] | None = None) -> torch.nn.Module:
    """A freshly initialised causal LM, the same on every rank for one seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(model_type, vocab_size, sizes))
    return model.float()
