"""OnlineLearner: what the backends and the learner schedule need from an online drafter learner.

The learners behind it are all the one `learner.Learner` on a drafter family's data: `DraftLearner` (`lm/`)
distils an independent drafter LM, `HeadLearner` (`heads/`) an EAGLE-style, EAGLE-3 or Medusa head on the policy's
hidden states, `BlockLearner` a block head. Each takes the rollouts a round trains on, runs a budgeted round with
the same publish gate, frozen shadow and watchdog, scores a probe, and publishes a `DrafterVersion` for
`SpecEngine.load_drafter`. A backend takes an `OnlineLearner` and never asks which one it holds;
`make_online_learner` picks the one the drafter's kind names (`rollout.drafters.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from transformers import PreTrainedModel

from specroll.rollout import Rollout
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.registry import DRAFTERS, kind_of, resolve
from specroll.rollout.drafters.version import DrafterVersion

from .learner_config import LearnerConfig
from .recording import RecordingLearner
from .reports import LearnerReport, ProbeReport
from .served_acceptance import ServedAcceptance


class OnlineLearner(Protocol):
    version: int  # the published version: moves when a round (or its watchdog) publishes

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Drafters draft over a subset of the vocabulary (None: the whole one): the engine's first one; the learner
        recounts it from the rollouts and publishes new ones with its versions (`learner.Learner.set_draft_vocab`)."""
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

    def published_version(self) -> DrafterVersion:
        """The published version (weights, draft vocabulary, held-out acceptance if known), for
        `engine.load_drafter`."""
        ...

    def served_estimate(self) -> float:
        """The published drafter's expected acceptance on the held-out positions (nan before any)."""
        ...

    def revert_served(self, reason: str) -> str:
        """The rollouts showed the served drafter collapsed: publish the best other known drafter (the event)."""
        ...


def make_online_learner(drafter: torch.nn.Module, policy: PreTrainedModel | None,
                        config: LearnerConfig) -> OnlineLearner:
    """The learner of `drafter`'s kind (its spec's `learner`: for a kind that reads the target's hidden states, one
    reading `policy`'s embedding and LM head, which it never trains; else `policy` is unused). It is wrapped in a
    `RecordingLearner` when `config.record_dir` is set (a head's with the policy modules it reads), in a
    `ServedAcceptance` when `config.publish_acceptance` is (its versions carry their held-out acceptance, for an
    engine that speculates only once it pays). Each trains its own copy of `drafter`."""
    kind = kind_of(drafter)
    if kind is None or not DRAFTERS[kind].trainable:
        trainable = [spec.weights.__name__ for spec in DRAFTERS.values() if spec.trainable]
        raise ValueError(f"a {type(drafter).__name__} is not the weights of a trainable drafter kind: one of "
                         f"{trainable}")
    spec = DRAFTERS[kind]
    learner_class, reads = resolve(spec.learner), None
    if spec.reads_hidden:
        if policy is None:
            raise ValueError(f"a {type(drafter).__name__} learner reads the policy's embedding and LM head: "
                             "pass the policy, got None")
        reads = {"embed": policy.get_input_embeddings(), "lm_head": policy.get_output_embeddings()}
        learner = learner_class(drafter, reads["embed"], reads["lm_head"], config)
    else:
        learner = learner_class(drafter, config)
    if config.publish_acceptance:
        if config.record_dir is not None:
            raise ValueError("learner.record_dir and learner.publish_acceptance are exclusive: a recording replays "
                             "the learner alone")
        return ServedAcceptance(learner)
    if config.record_dir is not None:
        return RecordingLearner(learner, config.record_dir, drafter, reads)
    return learner
