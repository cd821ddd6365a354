"""The demo task: multi-digit addition worked by peeling columns off, in two styles.

A problem is `a+b`. The larger operand's digit count `n` is drawn with weight ∝ n^-1.5 and the work
grows like n², so most completions are short and a few are long: long-tailed lengths, as in
reasoning RL. A solution is one state per column — what is left of each operand, the carry and the
result digits so far — then the answer after `>`:

    verbose  (the majority of the SFT data)   "45+6 c1 r5;4+0 c1 r25;0+0 c0 r525;>525"
    compact  (the minority)                   "45+6|15;4+0|125;0+0|0525;>525"

Same algorithm, terser states: compact is about a quarter shorter. Every step reads only the state
before it, so a small model learns the task in minutes. The reward (`demo.reward`) pays for
brevity, so GRPO moves the policy from the majority style to the minority one: its output
distribution shifts, not just its accuracy, toward text the drafter saw little of when it was
distilled from the SFT policy. That drift is what online draft learning must repair.

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

# How fast the share of longer problems falls. The SFT models learn the format and short sums within
# the build's CPU budget, not long ones; at 1.0 the SFT target solved 18% at T = 1 (below the 20%
# an RL run needs), at 1.5 about half the problems have one digit. Part of the recipe's hash.
DIGITS_EXPONENT = 1.5
_PROBLEM_RE = re.compile(r"(\d+)\+(\d+)")
_LINE_RE = {
    "verbose": r"\d+\+\d+ c[01] r\d+;",
    "compact": r"\d+\+\d+\|[01]\d+;",
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
    a, b, carry, result = str(problem.a), str(problem.b), 0, ""
    lines = []
    while a or b:
        total = int(a[-1:] or 0) + int(b[-1:] or 0) + carry
        carry, result, a, b = total // 10, str(total % 10) + result, a[:-1], b[:-1]
        state = f" c{carry} r{result}" if style is Style.VERBOSE else f"|{carry}{result}"
        lines.append(f"{a or 0}+{b or 0}{state}")
    return ";".join(lines) + f";>{problem.answer}"


def max_completion_tokens(max_digits: int) -> int:
    """Tokens (= characters) for the longest canonical solution (verbose, all nines), EOS and slack."""
    nines = int("9" * max_digits)
    return len(solution(Problem(nines, nines), Style.VERBOSE)) + 1 + 8


def max_prompt_tokens(max_digits: int) -> int:
    """Tokens of the longest templated prompt: BOS, the user and assistant markers and `a+b`."""
    return 2 * max_digits + 4


def style_of(text: str) -> Style | None:
    """Which style's grammar `text` follows (right or wrong arithmetic), or None if neither."""
    for style in Style:
        if re.fullmatch(rf"(?:{_LINE_RE[style.value]})+>\d+", text):
            return style
    return None


def parse_problem(prompt: str | list[dict]) -> Problem:
    """The problem a prompt asks: a plain string, a chat-templated string, or chat messages.

    For messages the last user message is read; in a string the last `a+b` is. Raises ValueError
    when there is none — a prompt without a problem is a caller's bug, not a zero reward.
    """
    text = user_text(prompt)
    matches = _PROBLEM_RE.findall(text)
    if not matches:
        raise ValueError(f"prompt {text[:80]!r} holds no addition problem 'a+b'")
    a, b = matches[-1]
    return Problem(int(a), int(b))


def user_text(prompt: str | list[dict]) -> str:
    """The text a prompt asks about: a string as is, or the content of the last user message."""
    if isinstance(prompt, list):
        user = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return user[-1] if user else ""
    if isinstance(prompt, str):
        return prompt
    raise ValueError(f"prompt of type {type(prompt).__name__} is invalid: a str or a list of messages")


def to_messages(problem: Problem) -> list[dict[str, str]]:
    """A problem as TRL's conversational prompt: `[{"role": "user", "content": "457+68"}]`."""
    return [{"role": "user", "content": problem.text}]


def make_problems(n: int, seed: int, max_digits: int = 8) -> list[Problem]:
    """`n` problems, reproducible from `seed`; the larger operand has 1..max_digits digits (∝ d^-1.5)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r} is invalid: an int >= 0")
    if not isinstance(max_digits, int) or not 1 <= max_digits <= 18:
        raise ValueError(f"max_digits={max_digits!r} is invalid: an int in [1, 18]")
    rng = random.Random(seed)
    sizes = list(range(1, max_digits + 1))
    weights = [d**-DIGITS_EXPONENT for d in sizes]
    problems = []
    for _ in range(n):
        long_digits = rng.choices(sizes, weights)[0]
        short_digits = rng.randint(1, long_digits)
        a, b = _number(rng, long_digits), _number(rng, short_digits)
        problems.append(Problem(a, b) if rng.random() < 0.5 else Problem(b, a))
    return problems


def make_prompts(n: int, seed: int, max_digits: int = 8) -> list[list[dict[str, str]]]:
    """`n` conversational prompts (one user message each), e.g. a TRL dataset's `prompt` column."""
    return [to_messages(p) for p in make_problems(n, seed, max_digits)]


def _number(rng: random.Random, digits: int) -> int:
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)
