"""LocalBackend: the in-process `RolloutBackend` — one `SpecEngine` and, optionally, a `DraftLearner`.

For one machine without Ray (tests, notebooks, a single-GPU run)::

    backend = LocalBackend.from_models(target, drafter, EngineConfig(gamma="auto"), LearnerConfig())
    trainer = GRPOTrainer(..., rollout_func=SpecrollRolloutFunc(backend))

Every rollout batch is handed to the learner's buffer; `learner_round` distils the learner's own
copy of the drafter and loads it into the engine only when the learner published a new version,
so a round that measured worse never changes what the engine drafts with.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from specroll.rollout import EngineConfig, EngineStats, Rollout, SamplingParams, SpecEngine

from .backend import name_prompt_ids, raise_for_errors


class LocalBackend:
    """Runs rollouts on an engine in this process; implements `RolloutBackend`."""

    def __init__(self, engine: SpecEngine, learner: Any | None = None):
        self.engine = engine
        self.learner = learner
        self.last_stats = EngineStats()
        self.last_sync_s = 0.0

    @classmethod
    def from_models(
        cls,
        target: PreTrainedModel,
        drafter: PreTrainedModel | None,
        engine_config: EngineConfig | None = None,
        learner_config: Any | None = None,
        target_tokenizer=None,
        drafter_tokenizer=None,
    ) -> LocalBackend:
        """Build the engine, and a learner on a private copy of the drafter when `learner_config` is given.

        The engine records verification signals whenever there is a learner to feed. The tokenizers,
        if given, let the engine compare vocabularies token by token (see `SpecEngine`).
        """
        engine_config = engine_config or EngineConfig()
        learner = None
        if learner_config is not None:
            if drafter is None:
                raise ValueError("learner_config needs a drafter to train, but drafter is None")
            from specroll.online_drafter import DraftLearner

            engine_config = dataclasses.replace(engine_config, record_signals=True)
            learner = DraftLearner(drafter, learner_config)  # trains its own copy
        return cls(SpecEngine(target, drafter, engine_config, target_tokenizer, drafter_tokenizer), learner)

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        self.engine.stats.reset()
        rollouts = self.engine.generate(prompts, params, n)
        self.last_stats = copy.deepcopy(self.engine.stats)
        if self.learner is not None:
            self.learner.add_rollouts(rollouts)
        raise_for_errors(rollouts, name_prompt_ids(prompts, n))
        return rollouts

    def sync_policy(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        started = time.perf_counter()
        self.engine.update_target(named_tensors, version)
        self.last_sync_s = time.perf_counter() - started
        return self.last_sync_s

    def learner_round(self) -> Any:
        """One learner round; returns its `LearnerReport`, or None when there is no learner."""
        if self.learner is None:
            return None
        report = self.learner.train_round()
        if report.published:
            self.engine.update_drafter(self.learner.published_state_dict(), report.version)
        return report

    def metrics(self) -> dict[str, float]:
        """Numbers of the last `generate` call, under the names the TRL hook logs."""
        return engine_metrics(self.last_stats) | {
            "policy_version": float(self.engine.policy_version),
            "drafter_version": float(self.engine.drafter_version),
        }

    def shutdown(self) -> None:
        self.learner = None


def engine_metrics(stats: EngineStats) -> dict[str, float]:
    """The `rollout/*` numbers of one rollout batch from an engine's stats."""
    return {
        "rollout/tokens_per_s": stats.tokens_per_s,
        "rollout/acceptance_rate": stats.acceptance_rate,
        "rollout/mean_accepted_len": stats.mean_accepted_len,
        "rollout/gamma": stats.mean_gamma,
        "rollout/live_rows": stats.mean_live_rows,
        "rollout/generated_tokens": float(stats.generated_tokens),
    }
