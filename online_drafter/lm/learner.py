"""DraftLearner: the online learner of an independent drafter LM, and the one that checkpoints.

    learner = DraftLearner(drafter, LearnerConfig(max_steps=50))
    learner.add_rollouts(rollouts)                      # generated with record_signals=True
    report = learner.train_round(budget_s=..., break_even=...)
    learner.save("learner.pt"); resumed = DraftLearner.load("learner.pt", drafter)

The learner (`learner.Learner`: rounds, gate, watchdog, probe, alarms) on the drafter LM's data
(`lm.data`: buffered rollouts, teacher-forced batches) and scorer (`lm.scorer`). A drafter LM's learner is
light enough to resume: `save` writes everything a resumed run needs (`learner_state`), atomically
(`checkpoint`), and `load` reads it back checked.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..learner import Learner
from ..learner_config import LearnerConfig
from ..state.checkpoint import load_checkpoint, save_checkpoint
from ..state.learner_state import CHECKPOINT_KEYS, restore, state_of
from .data import DraftBuffer, to_buffered
from .scorer import DrafterScorer


class DraftLearner(Learner):
    """`Learner` over a drafter LM; `buffer` defaults to a fresh `DraftBuffer(config.buffer)`."""

    def __init__(self, drafter: nn.Module, config: LearnerConfig | None = None, buffer: DraftBuffer | None = None):
        config = config or LearnerConfig()
        scorer = DrafterScorer(config.temperature, config.eval_batch_size, config.holdout_recency_decay,
                               torch.device(config.device))
        super().__init__(drafter, config, buffer if buffer is not None else DraftBuffer(config.buffer), scorer,
                         to_buffered)

    def save(self, path: str | os.PathLike) -> None:
        """Everything a resumed run needs (`learner_state.state_of`), written atomically
        (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous checkpoint whole."""
        save_checkpoint(state_of(self), path)

    @classmethod
    def load(cls, path: str | os.PathLike, drafter: nn.Module) -> DraftLearner:
        """Resume from `save`; `drafter` only provides the architecture (its weights are replaced).

        An empty, truncated or foreign file, or one of another architecture, raises a `ValueError`
        naming `path`; `drafter` itself is never modified.
        """
        state = load_checkpoint(path, CHECKPOINT_KEYS)
        learner = cls(drafter, LearnerConfig(**state["config"]))
        restore(learner, state, f"checkpoint {path}")
        return learner
