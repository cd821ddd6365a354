"""OnlineLearner: what the backends and the learner schedule need from an online drafter learner.

Two learners stand behind it, both the one `learner.Learner` on a drafter family's data: `DraftLearner`
(`lm/`) distils an independent drafter LM, `HeadLearner` (`heads/`) an EAGLE-style head or Medusa heads
on the policy's hidden states. Both take the rollouts a round trains
on, run a budgeted round with the same publish gate, frozen shadow and watchdog, score a probe, and
publish versioned weights for `SpecEngine.update_drafter`. A backend takes an `OnlineLearner` and
never asks which one it holds; `make_online_learner` picks the one that trains a given drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from transformers import PreTrainedModel

from specroll.rollout import Rollout
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads
from specroll.rollout.drafters.heads.block import BlockHead
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

from .heads.block_learner import BlockLearner
from .heads.learner import HeadLearner
from .learner_config import LearnerConfig
from .lm.learner import DraftLearner
from .recording import RecordingLearner
from .reports import LearnerReport, ProbeReport
from .served_acceptance import ServedAcceptance


class OnlineLearner(Protocol):
    version: int  # the published version: moves when a round (or its watchdog) publishes

    def set_draft_vocab(self, ids: torch.Tensor, vocab_size: int) -> None:
        """Drafters draft over a subset of the vocabulary: the engine's first one; the learner recounts it from the
        rollouts and publishes new ones with its versions (`learner.Learner.set_draft_vocab`)."""
        ...

    def draft_vocab(self, name: str = "published") -> torch.Tensor | None:
        """The "frozen", "published" or "candidate" drafter's draft vocabulary (None: the whole vocabulary)."""
        ...

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """Buffer training rollouts (generated with `record_signals=True`), holding a stride of groups out."""
        ...

    def train_round(self, budget_s: float | None = None, break_even: float | None = None,
                    stop: Callable[[], bool] | None = None) -> LearnerReport:
        """Train within `budget_s` (or until `stop()`), gate the candidate against the published drafter, run the
        watchdog (`break_even`: the acceptance below which speculation stops paying)."""
        ...

    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        """Score the served and the frozen drafter on fresh probe rollouts (never buffered)."""
        ...

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """The published version's weights, for `engine.update_drafter(sd, learner.version)`."""
        ...

    def served_estimate(self) -> float:
        """The published drafter's expected acceptance on the held-out positions (nan before any)."""
        ...

    def revert_served(self, reason: str) -> str:
        """The rollouts showed the served drafter collapsed: publish the best other known drafter (the event)."""
        ...


def make_online_learner(drafter: PreTrainedModel | EagleHead | Eagle3Head | MedusaHeads | BlockHead,
                        policy: PreTrainedModel | None,
                        config: LearnerConfig) -> OnlineLearner:
    """The learner for `drafter`: a `BlockLearner` for a block head, a `HeadLearner` for another head (either
    reading `policy`'s embedding and LM head, which it never trains), else a `DraftLearner` (`policy` unused).
    Each is wrapped in a `RecordingLearner` when `config.record_dir` is set (a head's with the policy modules it
    reads), in a `ServedAcceptance` when `config.publish_acceptance` is (its versions carry their held-out
    acceptance, for an engine that speculates only once it pays). Each trains its own copy of `drafter`."""
    reads = None
    if isinstance(drafter, (EagleHead, Eagle3Head, MedusaHeads, BlockHead)):
        if policy is None:
            raise ValueError(f"a {type(drafter).__name__} learner reads the policy's embedding and LM head: "
                             "pass the policy, got None")
        reads = {"embed": policy.get_input_embeddings(), "lm_head": policy.get_output_embeddings()}
        kind = BlockLearner if isinstance(drafter, BlockHead) else HeadLearner
        learner = kind(drafter, reads["embed"], reads["lm_head"], config)
    else:
        learner = DraftLearner(drafter, config)
    if config.publish_acceptance:
        if config.record_dir is not None:
            raise ValueError("learner.record_dir and learner.publish_acceptance are exclusive: a recording replays "
                             "the learner alone")
        return ServedAcceptance(learner)
    if config.record_dir is not None:
        return RecordingLearner(learner, config.record_dir, drafter, reads)
    return learner
