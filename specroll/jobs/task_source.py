"""The task a job trains on: prompts and reward functions, the embedded demo's or your own.

    task = load_task(config.task, max_digits=sources.max_digits)
    dataset = task.prompts(512, seed=0)          # TRL dataset rows' "prompt" values
    trainer = GRPOTrainer(..., reward_funcs=task.reward_funcs, ...)

Your own task is two dotted paths in the run config (`task.dataset`, `task.reward`, each
"package.module:name", importable where the job runs): `dataset(count, seed)` returns `count` prompts
in TRL's dataset format (strings or conversations), the same ones for the same seed; `reward` is a
TRL reward function, `reward(prompts, completions, **kwargs) -> list[float]`. Left unset, the job runs
the demo task (`specroll.demo`), the only place this package imports it from.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specroll.integrations.yaml_config import ConfigError

PROBE_DRAWS = 20  # fresh draws tried for probe prompts apart from the training ones


@dataclass
class Task:
    """`prompts(count, seed)` → prompts in the dataset's format; `reward_funcs` for `GRPOTrainer`."""

    prompts: Callable[[int, int], list[Any]]
    reward_funcs: Callable[..., list[float]] | list[Callable[..., list[float]]]


def load_task(settings: Any, max_digits: int, world: str = "chars") -> Task:
    """The run config's task (`TaskSettings`): your `dataset` and `reward`, or the demo's in `world`'s
    rendering (operands of up to `max_digits` digits, its reward weighed by `brevity` and `format_bonus`)."""
    if settings.dataset is not None:
        return Task(resolve(settings.dataset, "task.dataset"), resolve(settings.reward, "task.reward"))
    from specroll.demo.reward import RewardConfig, make_reward
    from specroll.demo.world import task_for

    make_prompts = task_for(world).make_prompts
    return Task(lambda count, seed: make_prompts(count, seed, max_digits),
                make_reward(RewardConfig(settings.brevity, settings.format_bonus), world))


def resolve(path: str, field: str) -> Any:
    """The object a dotted path names ("package.module:name" or "package.module.name")."""
    module_name, sep, name = path.partition(":")
    if not sep:
        module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{field}={path!r} is invalid: no importable object there ({err})") from err


def probe_prompts(task: Task, n: int, seed: int, training: list[Any]) -> list[Any]:
    """`n` task prompts none of which is among the `training` prompts (short demo sums repeat across draws)."""
    seen = {json.dumps(p, sort_keys=True) for p in training}
    chosen: list[Any] = []
    for draw in range(1, PROBE_DRAWS + 1):
        for prompt in task.prompts(4 * n, seed * 1_000 + draw):
            key = json.dumps(prompt, sort_keys=True)
            if key not in seen and len(chosen) < n:
                seen.add(key)
                chosen.append(prompt)
        if len(chosen) == n:
            return chosen
    raise ConfigError(f"probe.prompts={n} is invalid: the task gave {len(chosen)} prompts apart from the training "
                      f"ones in {PROBE_DRAWS} draws; use fewer, or probe.prompts: 0")
