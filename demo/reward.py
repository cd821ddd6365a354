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

The same reward serves both worlds (`demo.world`): `world="chars"` scores `demo.task`'s renderings,
`world="bpe"` `demo.story`'s (the problem read back from the word problem in the prompt).

Usage::

    trainer = GRPOTrainer(..., reward_funcs=[make_reward()])
    make_reward()(prompts=[[{"role": "user", "content": "2+3"}]],
                  completions=[[{"role": "assistant", "content": "0+0|05;>5"}]])   # [1.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .task import Style
from .world import task_for

RewardFunc = Callable[..., list[float]]
# Longer completions score 0 unless `RewardConfig.max_completion_chars` says otherwise: above every
# canonical solution of up to 18-digit sums in the chars world, 12-digit ones in the bpe world.
MAX_COMPLETION_CHARS = {"chars": 512, "bpe": 4096}


@dataclass(frozen=True)
class RewardConfig:
    """`brevity` in [0, 1]: weight of the length ratio; `format_bonus` >= 0: paid for the compact
    style's grammar; `max_completion_chars`: longer scores 0 (None: the world's, `MAX_COMPLETION_CHARS`)."""

    brevity: float = 1.0
    format_bonus: float = 0.0
    max_completion_chars: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.brevity, (int, float)) or not 0.0 <= self.brevity <= 1.0:
            raise ValueError(f"brevity={self.brevity!r} is invalid: a number in [0, 1]")
        if not isinstance(self.format_bonus, (int, float)) or self.format_bonus < 0:
            raise ValueError(f"format_bonus={self.format_bonus!r} is invalid: a number >= 0")
        limit = self.max_completion_chars
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_completion_chars={limit!r} is invalid: an int >= 1 or None")


def score(problem: Any, text: str, config: RewardConfig | None = None, world: str = "chars") -> float:
    """Reward of one completion `text` (special tokens already stripped) for `problem` of `world`'s task."""
    config = config or RewardConfig()
    task = task_for(world)
    text = text.rstrip()
    if not text or len(text) > (config.max_completion_chars or MAX_COMPLETION_CHARS[world]):
        return 0.0
    bonus = config.format_bonus if task.style_of(text) is Style.COMPACT else 0.0
    if text not in (task.solution(problem, Style.VERBOSE), task.solution(problem, Style.COMPACT)):
        return bonus
    shortest = len(task.solution(problem, Style.COMPACT))
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


def make_reward(config: RewardConfig | None = None, world: str = "chars") -> RewardFunc:
    """A TRL reward function `reward(prompts, completions, **kwargs) -> list[float]` for `world`'s task.

    Extra dataset columns TRL passes as keyword arguments are ignored: the problem is read back from
    the prompt, so the function works for plain and conversational datasets alike.
    """
    config = config or RewardConfig()
    task = task_for(world)

    def arithmetic_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions: they must pair up")
        return [score(task.parse_problem(p), completion_text(c), config, world) for p, c in zip(prompts, completions)]

    return arithmetic_reward


arithmetic_reward: RewardFunc = make_reward()
