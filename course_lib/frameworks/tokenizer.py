"""A word-level tokenizer over the window's token ids, built in memory: TRL and
transformers' collators want one, and nothing may be downloaded. A text is
the ids written out, ``"3 17 5"``; id 0 (PAD) is ``<pad>``, which also ends a
sequence, as GPT-2's one token does both."""

from __future__ import annotations

from typing import Any

PAD_TOKEN = "<pad>"  # not "0": a special token is matched inside words, and "10" held it

# Its own chat template (``--with assistant_only``): the turns in order, each
# assistant turn with its end-of-sequence token inside ``{% generation %}``,
# the markers TRL's assistant_only_loss reads the assistant's tokens from.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}{{ ' ' }}"
    "{%- else -%}{{ message['content'] }}{{ ' ' }}{%- endif -%}"
    "{%- endfor -%}")


def word_level(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD_TOKEN: 0, **{str(i): i for i in range(1, vocab_size)}}
    words = Tokenizer(WordLevel(vocab, unk_token=PAD_TOKEN))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token=PAD_TOKEN,
                                        eos_token=PAD_TOKEN, unk_token=PAD_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
