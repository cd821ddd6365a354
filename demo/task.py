"""The demo task: multi-digit addition with a column-by-column scratchpad, in two styles.

A problem is `a+b`. The larger operand's digit count `n` is drawn with weight ∝ 1/n, so most
problems are small and a few are long: completion lengths are long-tailed, as in reasoning RL.
A solution works the columns from the least significant digit, then gives the answer after `>`:

    verbose  (the majority of the SFT data)   "7+8+0=15 5+6+1=12 4+0+1=5 >525"
    compact  (the minority)                   "51 21 50 >525"

Verbose writes each column's digits, carry-in and sum; compact writes only the sum digit and the
carry-out. Both are exact and checkable. The reward (`demo.reward`) pays a correct compact solution
more than a correct verbose one (it pays for brevity), so GRPO moves the policy from the majority
style to the minority one: its output distribution shifts, not just its accuracy, and a drafter
fitted to the SFT policy (mostly verbose) falls behind. That drift is what online draft learning
must repair.

Usage::

    problems = make_problems(64, seed=0)
    prompts = [to_messages(p) for p in problems]        # TRL conversational prompts
    text = solution(problems[0], Style.COMPACT)
"""

from __future__ import annotations

import enum
import random
import re
from dataclasses import dataclass

_PROBLEM_RE = re.compile(r"(\d+)\+(\d+)")
_STYLE_RE = {
    "verbose": re.compile(r"(?:\d\+\d\+[01]=\d{1,2} )+>\d+"),
    "compact": re.compile(r"(?:\d[01] )+>\d+"),
}


class Style(enum.Enum):
    """How a solution writes its columns (see the module docstring)."""

    VERBOSE = "verbose"
    COMPACT = "compact"


@dataclass(frozen=True)
class Problem:
    """One addition problem `a + b` with non-negative integer operands."""

    a: int
    b: int

    def __post_init__(self) -> None:
        for name, value in (("a", self.a), ("b", self.b)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: a non-negative int is required")

    @property
    def text(self) -> str:
        """The user message: `"457+68"`."""
        return f"{self.a}+{self.b}"

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def num_columns(self) -> int:
        return max(len(str(self.a)), len(str(self.b)))


def solution(problem: Problem, style: Style) -> str:
    """The canonical completion of `problem` in `style` (no EOS; the tokenizer adds it)."""
    width = problem.num_columns
    xs = [int(d) for d in reversed(str(problem.a).zfill(width))]
    ys = [int(d) for d in reversed(str(problem.b).zfill(width))]
    columns, carry = [], 0
    for x, y in zip(xs, ys):
        total = x + y + carry
        columns.append(f"{x}+{y}+{carry}={total}" if style is Style.VERBOSE else f"{total % 10}{total // 10}")
        carry = total // 10
    return " ".join(columns) + f" >{problem.answer}"


def style_of(text: str) -> Style | None:
    """Which style's grammar `text` follows (right or wrong arithmetic), or None if neither."""
    for style in Style:
        if _STYLE_RE[style.value].fullmatch(text):
            return style
    return None


def parse_problem(prompt: str | list[dict]) -> Problem:
    """The problem a prompt asks: a plain string, a chat-templated string, or chat messages.

    For messages the last user message is read; in a string the last `a+b` is. Raises ValueError
    when there is none — a prompt without a problem is a caller's bug, not a zero reward.
    """
    if isinstance(prompt, list):
        user = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        text = user[-1] if user else ""
    elif isinstance(prompt, str):
        text = prompt
    else:
        raise ValueError(f"prompt of type {type(prompt).__name__} is invalid: a str or a list of messages")
    matches = _PROBLEM_RE.findall(text)
    if not matches:
        raise ValueError(f"prompt {text[:80]!r} holds no addition problem 'a+b'")
    a, b = matches[-1]
    return Problem(int(a), int(b))


def to_messages(problem: Problem) -> list[dict[str, str]]:
    """A problem as TRL's conversational prompt: `[{"role": "user", "content": "457+68"}]`."""
    return [{"role": "user", "content": problem.text}]


def make_problems(n: int, seed: int, max_digits: int = 10) -> list[Problem]:
    """`n` problems, reproducible from `seed`; the larger operand has 1..max_digits digits (∝ 1/d)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r} is invalid: an int >= 0")
    if not isinstance(max_digits, int) or not 1 <= max_digits <= 18:
        raise ValueError(f"max_digits={max_digits!r} is invalid: an int in [1, 18]")
    rng = random.Random(seed)
    sizes = list(range(1, max_digits + 1))
    weights = [1.0 / d for d in sizes]
    problems = []
    for _ in range(n):
        long_digits = rng.choices(sizes, weights)[0]
        short_digits = rng.randint(1, long_digits)
        a, b = _number(rng, long_digits), _number(rng, short_digits)
        problems.append(Problem(a, b) if rng.random() < 0.5 else Problem(b, a))
    return problems


def make_prompts(n: int, seed: int, max_digits: int = 10) -> list[list[dict[str, str]]]:
    """`n` conversational prompts (one user message each), e.g. a TRL dataset's `prompt` column."""
    return [to_messages(p) for p in make_problems(n, seed, max_digits)]


def _number(rng: random.Random, digits: int) -> int:
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)
