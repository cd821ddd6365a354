"""The `RolloutBackend` protocol: what the TRL hook and the main job need from a rollout service.

Two implementations stand behind it: an in-process one (one `SpecEngine` plus an online
`DraftLearner` in the trainer's process) and a Ray one (a controller over `RolloutWorker` actors and
a `DraftLearner` actor). Callers never know which they hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from specroll.rollout import Rollout, SamplingParams


class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        """Complete every prompt n times; results in input order, a prompt's n samples consecutive.

        All n samples of one prompt (a GRPO group) are generated on the same engine.
        """
        ...

    def sync_policy(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Load new policy weights on every engine; returns the seconds it took."""
        ...

    def learner_round(self) -> Any:
        """Run one online draft-learning round on what the rollouts revealed so far; publish the new
        drafter to every engine if it measured better. Returns the learner's report."""
        ...

    def metrics(self) -> dict[str, float]:
        """Latest rollout/drafter numbers (tokens/s, acceptance, mean accepted length, γ, versions)."""
        ...

    def shutdown(self) -> None:
        ...
