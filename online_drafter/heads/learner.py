"""HeadLearner: trains an EAGLE-style, EAGLE-3, Medusa or recurrent head on the policy's features, publish-if-better.

Usage (the engine runs an "eagle" or "medusa" drafter with `record_signals=True`, so every rollout
carries the target's hidden states and top-k p; backends reach it as an `OnlineLearner`)::

    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings(), LearnerConfig())
    learner.add_rollouts(rollouts)
    report = learner.train_round(budget_s=..., break_even=...)   # while the trainer updates the policy
    if report.published:
        engine.load_drafter(learner.published_version())
    probe = learner.probe(engine.generate(probe_prompts, params, n=2))   # fresh, never trained on

The learner (`learner.Learner`: the same rounds, candidate, held-out set, gate, watchdog, probe, alarms,
`LearnerConfig` and reports as the drafter LM's) on the head's data (`heads.data`: the policy's hidden states
and top-k p, in the one replay buffer) and scorer (`heads.scorer`, `heads.objectives`: log q at each draft
depth; training at the first `train_depths`, under bf16 autocast with `compute_dtype` — ~2.8x
cheaper a step on a CPU that multiplies in bf16, several times dearer on one that emulates it: "auto" asks).
The embedding and LM head are the policy's, read live and never trained: on the policy's side a sync updates
them in place. Memory: `buffer.max_positions` bounds the training sequences,
`max_holdout_positions` the held-out ones (bytes per position: `heads.data`).

It has no `save`/`load` of its own (a drafter LM's learner has: `lm.learner.DraftLearner`); a resumed
`specroll train` run keeps its state with the run's (`learner_state`, the buffer's hidden states included).

Layer-skip self-speculation has nothing to train: its draft is the policy itself, truncated.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from specroll.rollout import Rollout

from ..learner import Learner
from ..learner_config import LearnerConfig
from .data import FeatureBuffer, FeatureSequence, from_rollout
from .objectives import objective_for
from .scorer import HeadScorer


class HeadLearner(Learner):
    """`Learner` over `head` (EagleHead / Eagle3Head / MedusaHeads / RecurrentHead), reading the policy's `embed` and
    `lm_head`."""

    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: nn.Module, config: LearnerConfig | None = None):
        config = config or LearnerConfig()
        scorer = HeadScorer(objective_for(head, embed, lm_head), config.temperature, config.eval_batch_size,
                            config.holdout_recency_decay, torch.device(config.device), config.train_depths)
        super().__init__(head, config, FeatureBuffer(config.buffer), scorer, _entry)

    def add(self, sequences: Iterable[FeatureSequence]) -> None:
        """Buffer feature sequences that come without a rollout (offline: `heads.data.from_target`, or the
        demo's cached samples) exactly as `add_rollouts` buffers a rollout's."""
        self.add_rollouts(list(sequences))


def _entry(item: Rollout | FeatureSequence) -> FeatureSequence | None:
    """What the learner keeps of a rollout (its features; None for an empty completion), or a feature
    sequence as it is (`add`)."""
    if isinstance(item, FeatureSequence):
        return item
    return from_rollout(item) if item.completion_ids else None
