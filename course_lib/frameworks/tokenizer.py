"""A word-level tokenizer over the window's token ids, built in memory: TRL and
transformers' collators want one, and nothing may be downloaded. Id 0 (PAD)
pads."""

from __future__ import annotations

from typing import Any


def word_level(vocab_size: int) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(vocab_size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="0")),
                                   pad_token="0", eos_token="0", unk_token="0")
