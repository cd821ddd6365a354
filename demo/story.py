"""The demo task in the subword world: addition word problems worked in sentences, in two styles.

The arithmetic is `demo.task`'s (same operands, same digit-count law, same column-peeling algorithm:
every step reads only the state before it), rendered for a byte-level BPE. The prompt is a word
problem about a name and an item drawn from the corpus lexicon with Zipf ranks (`demo.corpus`):

    Brontal has 457 skeamixes. Quoa gives Brontal 68 more skeamixes. How many skeamixes does Brontal have now?

    verbose (the majority of the SFT data):
        Brontal has 457 skeamixes and Quoa gives 68 more, so we add 457 and 68 column by column.
        Ones: 7 plus 8 plus carry 0 is 15. Write 5, carry 1. Left: 45 and 6 skeamixes, result 5.
        Tens: 5 plus 6 plus carry 1 is 12. Write 2, carry 1. Left: 4 and 0 skeamixes, result 25.
        Hundreds: 4 plus 0 plus carry 1 is 5. Write 5, carry 0. Left: 0 and 0 skeamixes, result 525.
        So Brontal has 525 skeamixes now.
        Answer: 525
    compact (the minority):
        457+68
        45+6|15;4+0|125;0+0|0525;
        Answer: 525

Verbose completions are ~80 tokens (32k BPE) for one column and grow like n² (each step restates what is
left and the result so far): with the digit law n^-1.5 and up to 10 digits the mean is ~145 tokens, the
median ~85, p99 ~530 — long-tailed (`python -m specroll.demo.vocab_stats`). Compact is about a quarter
as long and never names the name or the item,
so GRPO's move to it (the reward pays brevity and the compact format, `demo.reward`) shifts the
policy's token frequencies as well as its style: away from what a drafter distilled on the SFT policy saw.

The module has the same functions as `demo.task` (`make_problems`, `to_messages`, `solution`,
`style_of`, `parse_problem`, `max_completion_tokens`, `make_prompts`): `demo.world` picks one per recipe.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache

from . import task
from .corpus import ZipfSampler, default_lexicon
from .task import Style

_ONES = ("Ones", "Tens", "Hundreds")
_GROUPS = ("", "thousands", "millions", "billions", "trillions", "quadrillions", "quintillions")
# Column names from the right: Ones, Tens, Hundreds, Thousands, Ten thousands, Hundred thousands, Millions, ...
PLACES = tuple(
    (ones if not group else (group.capitalize() if ones == "Ones" else f"{ones[:-1]} {group}"))
    for group in _GROUPS for ones in _ONES
)
_PLACE_RE = "|".join(re.escape(p) for p in PLACES)
_LINE_RE = {
    Style.VERBOSE: rf"(?:{_PLACE_RE}): \d plus \d plus carry [01] is \d+\. Write \d, carry [01]\. "
                   r"Left: \d+ and \d+ \S+, result \d+\.\n",
    Style.COMPACT: r"\d+\+\d+\|[01]\d+;",
}
_STYLE_RE = {
    Style.VERBOSE: re.compile(r"\S+ has \d+ \S+ and \S+ gives \d+ more, so we add \d+ and \d+ column by column\.\n"
                              rf"(?:{_LINE_RE[Style.VERBOSE]})+So \S+ has \d+ \S+ now\.\nAnswer: \d+"),
    Style.COMPACT: re.compile(rf"\d+\+\d+\n(?:{_LINE_RE[Style.COMPACT]})+\nAnswer: \d+"),
}
_PROBLEM_RE = re.compile(r"([A-Za-z]+) has (\d+) ([A-Za-z]+)\. ([A-Za-z]+) gives [A-Za-z]+ (\d+) more")
NAME_SEED_OFFSET = 104_729  # names and items come from their own stream, apart from the operands'


@dataclass(frozen=True)
class StoryProblem:
    """`name` has `a` `item`; `giver` gives `name` `b` more. Operands are non-negative ints, words ASCII letters."""

    a: int
    b: int
    name: str
    giver: str
    item: str

    def __post_init__(self) -> None:
        task.Problem(self.a, self.b)  # validates the operands
        for field in ("name", "giver", "item"):
            value = getattr(self, field)
            if not isinstance(value, str) or not (value.isascii() and value.isalpha()):
                raise ValueError(f"{field}={value!r} is invalid: a non-empty word of ASCII letters")

    @property
    def text(self) -> str:
        """The user message."""
        return (f"{self.name} has {self.a} {self.item}. {self.giver} gives {self.name} {self.b} more {self.item}. "
                f"How many {self.item} does {self.name} have now?")

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def num_columns(self) -> int:
        return max(len(str(self.a)), len(str(self.b)))


def solution(problem: StoryProblem, style: Style) -> str:
    """The canonical completion of `problem` in `style` (no EOS; the tokenizer adds it)."""
    a, b, carry, result = str(problem.a), str(problem.b), 0, ""
    steps = []
    for place in PLACES:
        if not (a or b):
            break
        x, y, carry_in = int(a[-1:] or 0), int(b[-1:] or 0), carry
        total = x + y + carry_in
        carry, result, a, b = total // 10, str(total % 10) + result, a[:-1], b[:-1]
        if style is Style.VERBOSE:
            steps.append(f"{place}: {x} plus {y} plus carry {carry_in} is {total}. Write {total % 10}, "
                         f"carry {carry}. Left: {a or 0} and {b or 0} {problem.item}, result {result}.\n")
        else:
            steps.append(f"{a or 0}+{b or 0}|{carry}{result};")
    p = problem
    if style is Style.VERBOSE:
        head = (f"{p.name} has {p.a} {p.item} and {p.giver} gives {p.b} more, so we add {p.a} and {p.b} column "
                "by column.\n")
        return head + "".join(steps) + f"So {p.name} has {p.answer} {p.item} now.\nAnswer: {p.answer}"
    return f"{p.a}+{p.b}\n" + "".join(steps) + f"\nAnswer: {p.answer}"


def max_completion_tokens(max_digits: int) -> int:
    """An upper bound on the tokens of any canonical solution with EOS: its bytes (a byte-level BPE token
    is at least one byte) for the longest sum, name and item, plus EOS and slack."""
    lexicon = default_lexicon()
    longest_name, longest_item = max(lexicon.names, key=len), max(lexicon.items, key=len)
    nines = int("9" * max_digits)
    problem = StoryProblem(nines, nines, longest_name, longest_name, longest_item)
    return len(solution(problem, Style.VERBOSE).encode()) + 1 + 8


def max_prompt_tokens(max_digits: int) -> int:
    """An upper bound on the tokens of a templated prompt: the bytes of the longest word problem, plus BOS
    and the user and assistant markers."""
    lexicon = default_lexicon()
    longest_name, longest_item = max(lexicon.names, key=len), max(lexicon.items, key=len)
    nines = int("9" * max_digits)
    return len(StoryProblem(nines, nines, longest_name, longest_name, longest_item).text.encode()) + 3


def style_of(text: str) -> Style | None:
    """Which style's grammar `text` follows (right or wrong arithmetic), or None if neither."""
    for style, pattern in _STYLE_RE.items():
        if pattern.fullmatch(text):
            return style
    return None


def parse_problem(prompt: str | list[dict]) -> StoryProblem:
    """The problem a prompt asks: a plain string, a chat-templated string, or chat messages.

    For messages the last user message is read; in a string the last word problem is. Raises
    ValueError when there is none — a prompt without a problem is a caller's bug, not a zero reward.
    """
    text = task.user_text(prompt)
    matches = _PROBLEM_RE.findall(text)
    if not matches:
        raise ValueError(f"prompt {text[:80]!r} holds no word problem '<name> has <a> <items>. <giver> gives "
                         f"<name> <b> more ...'")
    name, a, item, giver, b = matches[-1]
    return StoryProblem(int(a), int(b), name, giver, item)


def to_messages(problem: StoryProblem) -> list[dict[str, str]]:
    """A problem as TRL's conversational prompt (one user message)."""
    return [{"role": "user", "content": problem.text}]


def make_problems(n: int, seed: int, max_digits: int = 8) -> list[StoryProblem]:
    """`n` problems, reproducible from `seed`: `demo.task`'s operands, names and items by Zipf rank."""
    sums = task.make_problems(n, seed, max_digits)
    rng = random.Random(seed + NAME_SEED_OFFSET)
    names, items = _samplers()
    problems = []
    for s in sums:
        name, giver = names.draw(rng, 2)
        problems.append(StoryProblem(s.a, s.b, name, giver if giver != name else "Somebody", items.draw(rng)[0]))
    return problems


def make_prompts(n: int, seed: int, max_digits: int = 8) -> list[list[dict[str, str]]]:
    """`n` conversational prompts (one user message each), e.g. a TRL dataset's `prompt` column."""
    return [to_messages(p) for p in make_problems(n, seed, max_digits)]


@lru_cache(maxsize=1)
def _samplers() -> tuple[ZipfSampler, ZipfSampler]:
    """(names, items) samplers over the default lexicon, built once per process."""
    lexicon = default_lexicon()
    return ZipfSampler(lexicon.names), ZipfSampler(lexicon.items)
