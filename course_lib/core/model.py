"""A tiny causal transformer LM and its summed token loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.core.config import Config
from course_lib.core.data import IGNORE_INDEX


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in (q, k, v))
        # Right padding + causal mask: real positions never attend to padding.
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        out: torch.Tensor = x + self.drop(self.ff(self.ln2(x)))
        return out


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, max_length: int, d_model: int,
                 n_layers: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.tok = nn.Embedding(vocab_size + 1, d_model)  # +1: the padding id
        self.pos = nn.Embedding(max_length, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)
        )
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.tok(inputs) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


def build_model(cfg: Config, dtype: torch.dtype | None = None) -> TinyLM:
    """The initial model: the same weights for a given seed, whatever the rank."""
    m, d = cfg.model, cfg.data
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = TinyLM(d.vocab_size, d.max_length, m.d_model, m.n_layers,
                       m.n_heads, m.d_ff, m.dropout)
    return model.to(dtype or getattr(torch, cfg.train.dtype))


def supervised_mask(labels: torch.Tensor) -> torch.Tensor:
    """The positions the loss uses: the one definition of a token."""
    return labels != IGNORE_INDEX


def count_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Supervised tokens, as an int64 tensor on the labels' device."""
    return supervised_mask(labels).sum()


def count_before_shift(labels: torch.Tensor) -> torch.Tensor:
    """Labels counted before the next-token shift, as some trainers do: one
    more per row whose first label is supervised (that row's first token is
    never predicted). The HF Trainer's ``batch["labels"].ne(-100).sum()``
    on a model whose ``loss_type`` is None (a GPT-2 built from its config):
    chapter 08 measures it, release by release."""
    return count_tokens(labels) + count_tokens(labels[:, :1])


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """SUM of token cross-entropies over supervised positions (never a mean)."""
    mask = supervised_mask(labels)
    per_token = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return (per_token * mask.flatten()).sum()
