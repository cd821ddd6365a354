"""Test helper shared by the γ-policy tests: pin an `AutoGamma`'s acceptance estimates."""

from __future__ import annotations

from specroll.rollout.gamma.auto import AutoGamma


def with_acceptance(policy: AutoGamma, alpha: float) -> AutoGamma:
    for est in policy.estimates.values():
        est.alpha = [alpha] * len(est.alpha)
        est.alpha_by_state = [list(est.alpha), list(est.alpha)]
        est.seen = [True] * len(est.alpha)
    return policy
