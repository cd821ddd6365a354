"""A task for the kill-and-resume tests (`task.dataset: "resume_task:prompts"`, `task.reward:
"resume_task:reward"`): the demo's addition prompts, and a reward every completion earns part of — the share of
its characters that are digits — so the tiny recipe's policy, which solves no sum, still gets a gradient at
every step (with the demo's own reward it gets 0 everywhere, and a policy that never moves would compare equal
whatever resume did)."""

from __future__ import annotations

from specroll.demo.reward import completion_text
from specroll.demo.world import task_for


def prompts(count: int, seed: int) -> list:
    return task_for("chars").make_prompts(count, seed, 2)


def reward(prompts: list, completions: list, **kwargs) -> list[float]:
    texts = [completion_text(c) for c in completions]
    return [sum(ch.isdigit() for ch in text) / (1 + len(text)) for text in texts]
