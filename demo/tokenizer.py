"""The demo's character-level tokenizer: a real `PreTrainedTokenizerFast` built with `tokenizers`.

One token per printable ASCII character (plus newline), and special tokens `<pad>`, `<s>` (BOS),
`</s>` (EOS), `<unk>` and the role markers `<|system|>`, `<|user|>`, `<|assistant|>`. The vocabulary
is a BPE model with no merges — so every character is its own token, anything else is `<unk>` —
and the `Fuse` decoder joins tokens back without spaces.

The chat template renders `<s><|user|>457+68<|assistant|>` for TRL's conversational prompts with
`add_generation_prompt=True`, and closes assistant turns with `</s>`. Encoding adds no BOS by
itself: the template does, so a templated prompt never gets two.
"""

from __future__ import annotations

import string

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh tokenizer; ids are fixed (specials first, then `CHARACTERS` in order)."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
    )


def encode_prompt(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversational prompt, ready for generation (ends with `<|assistant|>`)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
