"""HeadLearner: trains an EAGLE-style head or Medusa heads on the policy's own features, publish-if-better.

Usage (the engine runs an "eagle" or "medusa" drafter with `record_signals=True`, so every rollout
carries the target's hidden states and top-k p; backends reach it as an `OnlineLearner`)::

    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings(), LearnerConfig())
    learner.add_rollouts(rollouts)
    report = learner.train_round(budget_s=..., break_even=...)   # while the trainer updates the policy
    if report.published:
        engine.update_drafter(learner.published_state_dict(), learner.version)
    probe = learner.probe(engine.generate(probe_prompts, params, n=2))   # fresh, never trained on

It is a `DraftLearner` on the head's data — the same code, `LearnerConfig` and reports: a private fp32
*candidate* trained teacher-forced (`head_objectives`, `head_scoring`; at the first `train_depths` draft
depths, under bf16 autocast with `compute_dtype`: the main job's, ~2.8x cheaper a step) with the bucketed KL
or TV to the recorded top-k p, warmed up over `warmup_steps`, judged and published as its exponential average
(`ema_decay`); a stride of prompt groups held out across versions (`HoldoutSet`); a gate on the paired gain
over the published head (`paired`), reserved from the round's budget and taken only once the candidate trained
as long as scoring costs; a reset past `reset_margin`; the *frozen* shadow (the head as given) scored on the
same positions; a watchdog (served below frozen, or below break-even) and a probe that revert to the best
known head. The embedding and LM head are the policy's, read live and never trained: on the policy's side a
sync updates them in place.

Memory: `FeatureBuffer` (bytes per position there) bounds the training sequences by
`buffer.max_positions`, `max_holdout_positions` the held-out ones.

Layer-skip self-speculation has nothing to train: its draft is the policy itself, truncated.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from specroll.rollout import Rollout

from .head_buffer import FeatureBuffer
from .head_data import FeatureSequence, from_rollout
from .head_objectives import objective_for
from .head_scoring import HeadScorer
from .learner import DraftLearner
from .learner_config import LearnerConfig


class HeadLearner(DraftLearner):
    """`DraftLearner` over `head` (EagleHead / MedusaHeads), reading the policy's `embed` and `lm_head`."""

    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: nn.Module, config: LearnerConfig | None = None):
        config = config or LearnerConfig()
        scorer = HeadScorer(objective_for(head, embed, lm_head), config.temperature, config.eval_batch_size,
                            config.holdout_recency_decay, torch.device(config.device), config.train_depths)
        super().__init__(head, config, FeatureBuffer(config.buffer), scorer, _entry)

    def add(self, sequences: Iterable[FeatureSequence]) -> None:
        """Buffer feature sequences that come without a rollout (offline: `head_data.from_target`, or the
        demo's cached samples) exactly as `add_rollouts` buffers a rollout's."""
        self.add_rollouts(list(sequences))

    def save(self, path) -> None:
        raise ValueError("HeadLearner has no checkpoint (its buffer holds the policy's hidden states, which a "
                         "resumed run recomputes from new rollouts): only DraftLearner.save/load resume")

    @classmethod
    def load(cls, path, drafter) -> DraftLearner:
        raise ValueError("HeadLearner has no checkpoint to load: only DraftLearner.save/load resume")


def _entry(item: Rollout | FeatureSequence) -> FeatureSequence | None:
    """What the learner keeps of a rollout (its features; None for an empty completion), or a feature
    sequence as it is (`add`)."""
    if isinstance(item, FeatureSequence):
        return item
    return from_rollout(item) if item.completion_ids else None
