"""Paired comparisons of two drafters on the same positions, clustered by prompt group.

Every decision the learner takes — publish a candidate, revert to the frozen drafter — compares two
drafters' expected acceptance Σ min(p, q) on the *same* recorded positions. Positions of one prompt
group (a prompt's G siblings) are strongly correlated, so the unit of the interval is the group, not
the position: with per-group sums a_g, b_g over n_g positions, the gain is

    D = Σ_g (a_g − b_g) / Σ_g n_g

and its standard error is the ratio estimator's, sqrt(G / (G − 1) · Σ_g (a_g − b_g − D n_g)²) / Σ_g n_g.
Pairing removes what both drafters share (how hard the group's text is), which dominates the
variance of either score alone. Groups may carry weights w_g (the learner weighs older policy
versions down, as its buffer does: the drafter is judged on where the policy is now); then every
sum above is weighted by w_g and the residuals by w_g², with G the effective number of groups
(Σ w)² / Σ w².
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class GroupScores:
    """One drafter's expected-acceptance sums per prompt group, and the positions they cover."""

    sums: torch.Tensor  # [G] float64
    counts: torch.Tensor  # [G] float64
    weights: torch.Tensor | None = None  # [G] float64, 1 if None
    bound_sums: torch.Tensor | None = None  # [G] float64: sums of the invariant sampler's per-position bound

    def weighted(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = self.weights if self.weights is not None else torch.ones_like(self.counts)
        return self.sums * w, self.counts * w, w

    @property
    def mean(self) -> float:
        sums, counts, _ = self.weighted()
        total = float(counts.sum())
        return float(sums.sum()) / total if total else math.nan

    @property
    def invariant_mean(self) -> float:
        """The mean of the positions' invariant-sampler bounds (`scorer.invariant_bound`), weighted as `mean`
        (nan where not scored)."""
        if self.bound_sums is None:
            return math.nan
        w = self.weights if self.weights is not None else torch.ones_like(self.counts)
        total = float((self.counts * w).sum())
        return float((self.bound_sums * w).sum()) / total if total else math.nan

    @property
    def num_positions(self) -> int:
        return int(self.counts.sum())

    @property
    def se(self) -> float:
        """Standard error of `mean`, clustered by group (unpaired: for a band around one drafter's curve)."""
        sums, counts, w = self.weighted()
        groups = float(w.sum()) ** 2 / float((w**2).sum()) if len(w) else 0.0
        if groups < 2:
            return math.inf
        residual = sums - self.mean * counts
        return math.sqrt(groups / (groups - 1) * float((residual**2).sum())) / float(counts.sum())


@dataclass
class PairedGain:
    """`mean` = acceptance(a) − acceptance(b) on shared positions; `se` its standard error (groups)."""

    mean: float
    se: float
    num_groups: float  # effective number of groups

    def above(self, z: float, margin: float = 0.0) -> bool:
        """a beats b by more than `margin` at `z` standard errors (one-sided)."""
        return self.num_groups >= 2 and self.mean - z * self.se > margin

    def below(self, z: float, margin: float = 0.0) -> bool:
        """a is worse than b by more than `margin` at `z` standard errors (one-sided)."""
        return self.num_groups >= 2 and self.mean + z * self.se < -margin


def paired_gain(a: GroupScores, b: GroupScores) -> PairedGain:
    """Gain of `a` over `b` (same groups, positions and weights) with its group-clustered standard error."""
    if a.counts.shape != b.counts.shape or not torch.equal(a.counts, b.counts):
        raise ValueError("paired_gain needs both drafters scored on the same positions")
    sums_a, counts, w = a.weighted()
    sums_b, _, _ = b.weighted()
    total = float(counts.sum())
    if total == 0:
        return PairedGain(math.nan, math.inf, 0)
    groups = float(w.sum()) ** 2 / float((w**2).sum())
    diff = sums_a - sums_b  # [G], weighted
    mean = float(diff.sum()) / total
    if groups < 2:
        return PairedGain(mean, math.inf, groups)
    residual = diff - mean * counts  # [G], weighted once: squared below, w² as the ratio estimator wants
    se = math.sqrt(groups / (groups - 1) * float((residual**2).sum())) / total
    return PairedGain(mean, se, groups)
