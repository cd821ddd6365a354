"""The learner's held-out scores: per-entry scores of the published and the frozen drafter, cached and aligned with
the first entries of the held-out set (only entries added since are scored again: frozen never changes, published
only when a round publishes, and then the candidate's scores are at hand), and the estimates read from them. A
mixin of `learner.Learner` (its holdout set, scorer, drafters, draft vocabularies and compute context)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..scorer import SCORE_COLUMNS
from .paired import GroupScores


class HeldOutScores:
    """`Learner`'s held-out scoring (module docstring); `_entry_scores` is set up by `Learner.__init__`."""

    _entry_scores: dict[str, torch.Tensor]

    def served_estimate(self) -> float:
        """The published drafter's expected acceptance on the held-out positions (nan before any is held out)."""
        return self._cached("published").mean if self.holdout else math.nan

    def served_invariant_estimate(self) -> float:
        """The published drafter's acceptance under the invariant sampler on the held-out positions, bounded
        below per position (`scorer.invariant_bound`; nan before any is held out)."""
        return self._cached("published").invariant_mean if self.holdout else math.nan

    def score(self, drafter: nn.Module, vocab_ids: torch.Tensor | None = None) -> float:
        """Expected acceptance of any drafter (same vocabulary; over the draft vocabulary `vocab_ids`, if given)
        on the current held-out positions."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before scoring")
        with self.scorer.over(vocab_ids):
            return self._group(self.scorer.score_entries(drafter, self.holdout.entries)).mean

    def _cached(self, name: str) -> GroupScores:
        """The published or frozen drafter's held-out scores, scoring only entries not scored before."""
        known = self._entry_scores.get(name, torch.zeros(0, SCORE_COLUMNS, dtype=torch.float64))
        missing = self.holdout.entries[len(known):]
        if missing:
            model = self.frozen if name == "frozen" else self.published
            with self._compute(), self.scorer.over(self.draft_vocab(name)):
                known = torch.cat([known, self.scorer.score_entries(model, missing)])
            self._entry_scores[name] = known
        return self._group(known)

    def _group(self, per_entry: torch.Tensor) -> GroupScores:
        return self.scorer.group(per_entry, self.holdout.keys)
