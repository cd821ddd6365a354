"""Synthetic "general text" for training the demo's byte-level BPE, and the lexicon the task draws from.

No text can be downloaded here, so the tokenizer's training corpus is generated: English function
words, a large lexicon of pronounceable pseudo-words (syllable chains: `brontaleth`, `skeamix`), names
(capitalised pseudo-words) and plural nouns, number words, digits and punctuation, in sentences whose
words are drawn with Zipf-distributed ranks — as word frequencies are in real text. The lexicon is big
enough (tens of thousands of types, most seen at least twice) that a 32k-entry BPE learns real merges
all the way down its merge list: whole frequent words, common syllable chains, capitalised and
space-prefixed variants.

The task (`demo.story`) draws its names and items from the same lexicon with the same Zipf ranks, so
its text uses a small part of the vocabulary with a long-tailed token frequency, as a math RL task
uses a small part of a 152k vocabulary.

Everything is a pure function of the seed: `Lexicon.make(seed)` and `general_text(n, seed)`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import lru_cache

ONSETS = ("", "b", "bl", "br", "c", "ch", "cl", "cr", "d", "dr", "f", "fl", "fr", "g", "gl", "gr", "h", "j",
          "k", "l", "m", "n", "p", "pl", "pr", "qu", "r", "s", "sc", "sh", "sk", "sl", "sm", "sn", "sp", "st",
          "str", "t", "th", "tr", "v", "w", "wh", "y", "z")
NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oa", "oo", "ou", "y")
CODAS = ("", "", "", "", "b", "ck", "d", "f", "g", "l", "ll", "m", "n", "nd", "ng", "nt", "p", "r", "rk",
         "rn", "s", "sh", "st", "t", "th", "x")
FUNCTION_WORDS = (
    "the", "of", "and", "to", "a", "in", "is", "it", "that", "was", "he", "for", "on", "are", "as", "with", "his",
    "they", "at", "be", "this", "from", "have", "or", "by", "one", "had", "not", "but", "what", "all", "were",
    "when", "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about",
    "how", "up", "out", "them", "then", "she", "many", "some", "so", "these", "would", "other", "into", "has",
    "more", "her", "two", "like", "him", "see", "time", "could", "no", "make", "than", "first", "been", "its",
    "who", "now", "people", "my", "made", "over", "did", "down", "only", "way", "find", "use", "may", "water",
    "long", "little", "very", "after", "words", "called", "just", "where", "most", "know", "get", "through", "back",
    "much", "before", "go", "good", "new", "write", "our", "used", "me", "man", "too", "any", "day", "same",
    "right", "look", "think", "also", "around", "another", "came", "come", "work", "three", "must", "because",
    "does", "part", "even", "place", "well", "such", "here", "take", "why", "help", "put", "different", "away",
    "again", "off", "went", "old", "number", "great", "tell", "men", "say", "small", "every", "found", "still",
    "between", "name", "should", "home", "big", "give", "air", "line", "set", "own", "under", "read", "last",
    "never", "us", "left", "end", "along", "while", "might", "next", "sound", "below", "saw", "something",
    "thought", "both", "few", "those", "always", "show", "large", "often", "together", "asked", "house", "world",
    "going", "want", "school", "important", "until", "form", "food", "keep", "children"
)
NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty",
    "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million", "billion", "half", "quarter",
    "dozen", "first", "second", "third"
)
ZIPF_EXPONENT = 1.07  # word-frequency exponent of English text (rank-frequency slope ~1)
LEXICON_SEED = 7_919  # the lexicon is fixed across recipes; the recipe's seed varies only the sentences


@dataclass(frozen=True)
class Lexicon:
    """Pseudo-words by frequency rank: `words` (common nouns, verbs, ...), `names`, `items` (plurals)."""

    words: tuple[str, ...]
    names: tuple[str, ...]
    items: tuple[str, ...]

    @classmethod
    def make(cls, num_words: int = 60_000, num_names: int = 20_000, num_items: int = 6_000,
             seed: int = LEXICON_SEED) -> Lexicon:
        """Distinct pseudo-words of 1-4 syllables (1-3 for names and items), shorter ones ranked more
        frequent on the whole (Zipf's law of abbreviation), with noise so that ranks mix lengths."""
        for name, value in (("num_words", num_words), ("num_names", num_names), ("num_items", num_items)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: an int >= 1")
        rng = random.Random(seed)
        taken = set(FUNCTION_WORDS) | set(NUMBER_WORDS)
        words = _by_length(rng, _distinct(rng, num_words, (1, 2, 2, 2, 3, 3, 4), taken))
        names = tuple(w.capitalize() for w in _by_length(rng, _distinct(rng, num_names, (1, 2, 2, 2, 3), taken)))
        items = tuple(w + "s" for w in _by_length(rng, _distinct(rng, num_items, (1, 1, 2, 2, 3), taken)))
        return cls(words, names, items)


@lru_cache(maxsize=2)
def default_lexicon() -> Lexicon:
    """The lexicon every recipe uses (built once per process: about a second)."""
    return Lexicon.make()


class ZipfSampler:
    """Draws items of a ranked sequence with P(rank r) ∝ r^-exponent (r = 1 is the most frequent)."""

    def __init__(self, items: tuple[str, ...], exponent: float = ZIPF_EXPONENT):
        if not items:
            raise ValueError("items is empty: a ZipfSampler needs at least one item")
        self.items = items
        self.cumulative = list(itertools.accumulate((r + 1) ** -exponent for r in range(len(items))))

    def draw(self, rng: random.Random, k: int = 1) -> list[str]:
        return rng.choices(self.items, cum_weights=self.cumulative, k=k)


def general_text(num_sentences: int, seed: int, lexicon: Lexicon | None = None) -> list[str]:
    """`num_sentences` sentences of synthetic text, one string per paragraph of 1-6 sentences."""
    if not isinstance(num_sentences, int) or num_sentences < 0:
        raise ValueError(f"num_sentences={num_sentences!r} is invalid: an int >= 0")
    lexicon = lexicon or default_lexicon()
    rng = random.Random(seed)
    words, names = ZipfSampler(lexicon.words), ZipfSampler(lexicon.names)
    items, function = ZipfSampler(lexicon.items), ZipfSampler(tuple(FUNCTION_WORDS), exponent=0.9)
    paragraphs, current = [], []
    for _ in range(num_sentences):
        current.append(_sentence(rng, words, names, items, function))
        if rng.random() < 0.25:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def _sentence(rng: random.Random, words: ZipfSampler, names: ZipfSampler, items: ZipfSampler,
              function: ZipfSampler) -> str:
    tokens = []
    for _ in range(rng.randint(4, 18)):
        kind = rng.random()
        if kind < 0.45:
            tokens.append(function.draw(rng)[0])
        elif kind < 0.80:
            tokens.append(words.draw(rng)[0])
        elif kind < 0.87:
            tokens.append(names.draw(rng)[0])
        elif kind < 0.93:
            tokens.append(items.draw(rng)[0])
        elif kind < 0.97:
            tokens.append(rng.choice(NUMBER_WORDS))
        else:
            tokens.append(str(int(10 ** rng.uniform(0, 6))))
        if rng.random() < 0.06:
            tokens[-1] += rng.choice((",", ",", ";", ":"))
    tokens[0] = tokens[0][0].upper() + tokens[0][1:]
    return " ".join(tokens).rstrip(",;:") + rng.choice((".", ".", ".", ".", "?", "!"))


def _distinct(rng: random.Random, n: int, syllable_counts: tuple[int, ...], taken: set[str]) -> tuple[str, ...]:
    """`n` new pseudo-words (added to `taken`), in the order drawn."""
    out = []
    while len(out) < n:
        word = "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
                       for _ in range(rng.choice(syllable_counts)))
        if len(word) >= 2 and word not in taken:
            taken.add(word)
            out.append(word)
    return tuple(out)


def _by_length(rng: random.Random, words: tuple[str, ...]) -> tuple[str, ...]:
    """`words` ranked by length plus Gaussian noise (sd 2.5 characters)."""
    keys = {w: len(w) + rng.gauss(0.0, 2.5) for w in words}
    return tuple(sorted(words, key=keys.__getitem__))
