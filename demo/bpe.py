"""The subword world's tokenizer: a byte-level BPE trained here with `tokenizers`, as a `PreTrainedTokenizerFast`.

Trained on a seeded corpus (`demo.corpus`: synthetic general text, plus the task's own text at a small
share, as a math task's words are in any real tokenizer's training data) to `vocab_size` entries
(32,768 by default), specials included. The pre-tokenizer is Qwen2's: digits are split one by one (so
arithmetic sees digits, and no merge crosses them), letters group into words with their leading space
or punctuation, and everything is bytes (no unknown characters). Special tokens, the chat template and
the no-BOS-on-encode convention are the character-level tokenizer's (`demo.tokenizer`), so the rest
of the demo reads both worlds alike: `<s><|user|>...<|assistant|>` with `add_generation_prompt=True`.

Generating the corpus and training take about 10 s on 2 cores at the full size, and training is
deterministic: the same seed and sizes give the same vocabulary and merges.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from . import story
from .corpus import general_text
from .task import Style
from .tokenizer import BOS, CHAT_TEMPLATE, EOS, PAD, ROLE_TOKENS, SPECIAL_TOKENS, UNK

VOCAB_SIZE = 32_768
CORPUS_SENTENCES = 120_000  # ~1.3M words over the lexicon's 86k types (and the task's text)
TASK_EXAMPLES = 20_000  # word problems with both solutions: ~10% of the corpus
# Qwen2's pre-tokenization pattern: contractions, words with one leading non-letter, single digits,
# punctuation runs, newlines, spaces.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def training_corpus(seed: int, num_sentences: int = CORPUS_SENTENCES,
                    task_examples: int = TASK_EXAMPLES) -> Iterator[str]:
    """The BPE's training text: general paragraphs, then word problems (prompt and both solutions)."""
    yield from general_text(num_sentences, seed)
    rng = random.Random(seed)
    for problem in story.make_problems(task_examples, seed=seed, max_digits=12):
        style = Style.COMPACT if rng.random() < 0.5 else Style.VERBOSE
        yield problem.text + "\n" + story.solution(problem, style)


def train_bpe(vocab_size: int = VOCAB_SIZE, seed: int = 0, num_sentences: int = CORPUS_SENTENCES,
              task_examples: int = TASK_EXAMPLES) -> PreTrainedTokenizerFast:
    """A freshly trained tokenizer of exactly `vocab_size` entries (ids: specials first, then the 256 bytes,
    then merges in the order learnt). Raises ValueError if the corpus is too small to learn that many."""
    specials = len(SPECIAL_TOKENS) + 256
    if not isinstance(vocab_size, int) or vocab_size <= specials:
        raise ValueError(f"vocab_size={vocab_size!r} is invalid: an int > {specials} (specials and bytes)")
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(training_corpus(seed, num_sentences, task_examples), trainer)
    if backend.get_vocab_size() != vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} is invalid for this corpus (num_sentences={num_sentences}, task_examples="
            f"{task_examples}): it holds only {backend.get_vocab_size()} entries' worth of merges; use a larger "
            "corpus or a smaller vocabulary"
        )
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return _wrap(backend)


@lru_cache(maxsize=2)
def _trained(vocab_size: int, seed: int) -> Tokenizer:
    return train_bpe(vocab_size, seed).backend_tokenizer


def build_bpe_tokenizer(vocab_size: int = VOCAB_SIZE, seed: int = 0) -> PreTrainedTokenizerFast:
    """The recipe's tokenizer at the default corpus size, trained once per process and size (a fresh
    wrapper per call, so a caller's changes to one never reach another)."""
    return _wrap(Tokenizer.from_str(_trained(vocab_size, seed).to_str()))


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS), chat_template=CHAT_TEMPLATE,
    )
