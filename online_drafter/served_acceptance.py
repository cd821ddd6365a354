"""ServedAcceptance: an `OnlineLearner` whose published versions carry their held-out expected acceptance.

A drafter that starts from nothing (a fresh EAGLE head: the cold start of `docs/get_a_drafter.md`) must
cost nothing while it is useless. The learner knows how good it is without drafting — expected acceptance
Σ min(p, q) on held-out recorded positions — and the engine knows where drafting starts to pay
(`SpecEngine.break_even_acceptance`). This wrapper hands the first to the second: every `DrafterVersion` it
publishes carries the served version's held-out acceptance — Σ min(p, q) (what rejection sampling keeps) and the
mean of the positions' invariant-sampler bounds (`scorer.invariant_bound`) — and an engine with
`EngineConfig(speculation="when_learned")` drafts only while the one for its sampler reaches its break-even.

`make_online_learner` wraps a learner in it when `LearnerConfig.publish_acceptance` is set. The served version's
acceptance is the learner's own `served_estimate()` after every gated round and every call that moved the version
(a probe's or a collapse check's revert): the held-out scores the gate computed, cached, so it costs nothing. It
keeps no state of its own: `learner_state` saves and restores the learner it wraps, and a restored version's
acceptance is taken when it is first published.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from specroll.rollout import Rollout
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.version import DrafterVersion

from .learner import Learner
from .reports import LearnerReport, ProbeReport


class ServedAcceptance:
    """Delegates to `learner` (a `DraftLearner` or `HeadLearner`) and tags what it publishes (see module doc)."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self.config = learner.config
        self.acceptance: float | None = None  # the served version's held-out expected acceptance (None: unscored)
        self.invariant: float | None = None  # ... and its per-position invariant-sampler bound
        self._scored_version: int | None = None  # the version `acceptance` belongs to
        self._tagged: tuple[DrafterVersion, DrafterVersion] | None = None  # (the learner's version, it tagged)

    @property
    def version(self) -> int:
        return self.learner.version

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.learner.set_draft_vocab(vocab)

    def draft_vocab(self, name: str = "published") -> torch.Tensor | None:
        return self.learner.draft_vocab(name)

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        self.learner.add_rollouts(rollouts)

    def train_round(self, budget_s: float | None = None, break_even: float | None = None,
                    stop: Callable[[], bool] | None = None) -> LearnerReport:
        report = self.learner.train_round(budget_s, break_even, stop)
        if report.gated or report.version != self._scored_version:
            self._note()
        return report

    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        before = self.learner.version
        report = self.learner.probe(rollouts)
        if self.learner.version != before:  # the probe's watchdog reverted
            self._note()
        return report

    def served_estimate(self) -> float:
        return self.learner.served_estimate()

    def revert_served(self, reason: str) -> str:
        event = self.learner.revert_served(reason)
        self._note()
        return event

    def published_version(self) -> DrafterVersion:
        """The learner's published version with its held-out acceptance, when it is known for this version."""
        version = self.learner.published_version()
        if self._scored_version != self.learner.version and self.learner.holdout:  # a restored learner's version
            self._note()
        if self.acceptance is None or self._scored_version != self.learner.version:
            return version
        if self._tagged is None or self._tagged[0] is not version or self._tagged[1].acceptance != self.acceptance:
            tagged = dataclasses.replace(version, acceptance=self.acceptance, invariant_acceptance=self.invariant)
            self._tagged = (version, tagged)  # one object per version: its digests are hashed once
        return self._tagged[1]

    def _note(self) -> None:
        """Take the served version's held-out acceptance (none while nothing is held out)."""
        acceptance, invariant = self.learner.served_estimate(), self.learner.served_invariant_estimate()
        if not math.isnan(acceptance):
            self.acceptance, self.invariant = float(acceptance), float(invariant)
            self._scored_version = self.learner.version
