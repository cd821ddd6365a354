"""The demo's worlds: which tokenizer and which rendering of the addition task a recipe builds on.

    chars  `demo.tokenizer` (one token per character, ~100 entries) and `demo.task` ("45+6 c1 r5;...")
    bpe    `demo.bpe` (a byte-level BPE of 32,768 entries) and `demo.story` (word problems worked in sentences)

Both task modules offer the same functions (`DemoTask`), so the build, the sampler and the reward read
either world alike: `task_for(world)`, `tokenizer_for(recipe)`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from . import story, task
from .task import Style

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

WORLDS = ("chars", "bpe")


class DemoTask(Protocol):
    """What a world's task module provides (module-level functions, typed here once)."""

    def make_problems(self, n: int, seed: int, max_digits: int = 8) -> list[Any]: ...
    def make_prompts(self, n: int, seed: int, max_digits: int = 8) -> list[list[dict[str, str]]]: ...
    def to_messages(self, problem: Any) -> list[dict[str, str]]: ...
    def solution(self, problem: Any, style: Style) -> str: ...
    def style_of(self, text: str) -> Style | None: ...
    def parse_problem(self, prompt: str | list[dict]) -> Any: ...
    def max_completion_tokens(self, max_digits: int) -> int: ...
    def max_prompt_tokens(self, max_digits: int) -> int: ...


_TASKS: dict[str, ModuleType] = {"chars": task, "bpe": story}


def task_for(world: str) -> DemoTask:
    """The task module of `world` ("chars" or "bpe")."""
    if world not in _TASKS:
        raise ValueError(f"world={world!r} is invalid: one of {WORLDS}")
    return _TASKS[world]


def tokenizer_for(world: str, vocab_size: int | None = None, seed: int = 0) -> PreTrainedTokenizerFast:
    """A fresh tokenizer of `world`: the character-level one, or the BPE of `vocab_size` entries trained
    with `seed` (once per process; a few seconds)."""
    if world == "chars":
        from .tokenizer import build_tokenizer

        return build_tokenizer()
    if world == "bpe":
        from .bpe import VOCAB_SIZE, build_bpe_tokenizer

        return build_bpe_tokenizer(vocab_size or VOCAB_SIZE, seed)
    raise ValueError(f"world={world!r} is invalid: one of {WORLDS}")
