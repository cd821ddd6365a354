"""DraftLearnerActor: the online draft learner (`specroll.online_drafter.DraftLearner`) as a Ray actor.

The controller forwards each round's rollout ObjectRefs (the learner pulls them from the object
store itself, so rollouts do not pass through the driver twice), then queues `probe` (refs to the
probe rollouts idle workers are generating) and `train_round` without waiting: an actor runs its
calls in order, so the probe scores the drafter that served the step before the round replaces it,
and the whole round runs while the trainer updates the policy. The drafter weights live here; when
the round's report says the version moved, the controller fetches `published_state_dict` and syncs
it to the workers. The learner is not restarted on failure: losing it costs learning, never
rollouts, and the controller reports it.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from transformers import AutoModelForCausalLM

from specroll.online_drafter import DraftLearner, LearnerConfig


@ray.remote
class DraftLearnerActor:
    def __init__(self, drafter_path: str, config: LearnerConfig, dtype: torch.dtype = torch.float32):
        drafter = AutoModelForCausalLM.from_pretrained(drafter_path, dtype=dtype)
        self.learner = DraftLearner(drafter, config)
        self.num_rollouts = 0  # added since start, from every controller (every rank of a shared service)
        self.num_rounds = 0

    def add_rollouts(self, batches: list[ray.ObjectRef]) -> int:
        """Add the rollouts of a round (refs to workers' `generate` results); returns how many."""
        rollouts = [r for batch in ray.get(batches) for r in batch.rollouts]
        self.learner.add_rollouts(rollouts)
        self.num_rollouts += len(rollouts)
        return len(rollouts)

    def train_round(self, budget_s: float | None, break_even: float | None) -> Any:
        """One distillation round; returns the learner's `LearnerReport`."""
        self.num_rounds += 1
        return self.learner.train_round(budget_s, break_even)

    def counts(self) -> dict[str, int]:
        """Rollouts added and rounds run since the actor started."""
        return {"rollouts": self.num_rollouts, "rounds": self.num_rounds}

    def probe(self, batches: list[ray.ObjectRef]) -> Any:
        """Score served vs frozen on probe rollouts (refs to workers' `generate` results); never buffered."""
        return self.learner.probe([r for batch in ray.get(batches) for r in batch.rollouts])

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter weights of the latest published version (what workers should serve)."""
        return self.learner.published_state_dict()
