"""The demo's verifiable reward, in the shape TRL's `GRPOTrainer` calls reward functions.

    correctness = 0                                        unless the completion is exactly the
                                                           canonical solution, in either style
    correctness = (1 − brevity) + brevity · len(compact) / len(completion)     otherwise
    reward = correctness + format_bonus · [the completion follows the compact style's grammar]

So a correct compact solution scores 1.0 + format_bonus and a correct verbose one (a third longer or
more) about 0.7–0.8 with `brevity=1.0`. Correctness is strict on purpose: a right answer after wrong
work, an extra character, a truncated (overlong) completion or an empty one all score 0. The brevity
term and the format bonus (a format reward, as RL recipes for reasoning models use) are the levers
that move GRPO's policy from the SFT data's majority style (verbose) to its minority style (compact):
the bonus pays on every compact sample, right or wrong, so a group of G samples carries the style
signal even when none of them is correct. `brevity=0, format_bonus=0` rewards correctness alone.

Usage::

    trainer = GRPOTrainer(..., reward_funcs=[make_reward()])
    make_reward()(prompts=[[{"role": "user", "content": "2+3"}]],
                  completions=[[{"role": "assistant", "content": "0+0|05;>5"}]])   # [1.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .task import Problem, Style, parse_problem, solution, style_of

RewardFunc = Callable[..., list[float]]


@dataclass(frozen=True)
class RewardConfig:
    """`brevity` in [0, 1]: weight of the length ratio; `format_bonus` >= 0: paid for the compact
    style's grammar; `max_completion_chars`: longer scores 0."""

    brevity: float = 1.0
    format_bonus: float = 0.0
    max_completion_chars: int = 512

    def __post_init__(self) -> None:
        if not isinstance(self.brevity, (int, float)) or not 0.0 <= self.brevity <= 1.0:
            raise ValueError(f"brevity={self.brevity!r} is invalid: a number in [0, 1]")
        if not isinstance(self.format_bonus, (int, float)) or self.format_bonus < 0:
            raise ValueError(f"format_bonus={self.format_bonus!r} is invalid: a number >= 0")
        if not isinstance(self.max_completion_chars, int) or self.max_completion_chars < 1:
            raise ValueError(f"max_completion_chars={self.max_completion_chars!r} is invalid: an int >= 1")


def score(problem: Problem, text: str, config: RewardConfig | None = None) -> float:
    """Reward of one completion `text` (special tokens already stripped) for `problem`."""
    config = config or RewardConfig()
    text = text.rstrip()
    if not text or len(text) > config.max_completion_chars:
        return 0.0
    bonus = config.format_bonus if style_of(text) is Style.COMPACT else 0.0
    if text not in (solution(problem, Style.VERBOSE), solution(problem, Style.COMPACT)):
        return bonus
    shortest = len(solution(problem, Style.COMPACT))
    return (1.0 - config.brevity) + config.brevity * shortest / len(text) + bonus


def completion_text(completion: str | Sequence[dict]) -> str:
    """The text of a completion: a string, or TRL's conversational `[{"role", "content"}, ...]`."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and all(isinstance(m, dict) for m in completion):
        return "".join(str(m.get("content", "")) for m in completion if m.get("role", "assistant") == "assistant")
    raise ValueError(
        f"completion of type {type(completion).__name__} is invalid: a str or a list of {{'role', 'content'}} dicts"
    )


def make_reward(config: RewardConfig | None = None) -> RewardFunc:
    """A TRL reward function `reward(prompts, completions, **kwargs) -> list[float]`.

    Extra dataset columns TRL passes as keyword arguments are ignored: the problem is read back from
    the prompt, so the function works for plain and conversational datasets alike.
    """
    config = config or RewardConfig()

    def arithmetic_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions: they must pair up")
        return [score(parse_problem(p), completion_text(c), config) for p, c in zip(prompts, completions)]

    return arithmetic_reward


arithmetic_reward: RewardFunc = make_reward()
