"""The break-even acceptance: below it, no draft length beats plain decoding at the given step costs.

    alpha_min = break_even_acceptance(policy.step_times(rows, context))   # step seconds for γ = 0..max

The online learner's watchdog reverts a drafter whose held-out acceptance falls below it
(`SpecEngine.break_even_acceptance` asks the auto-γ cost model for the live batch shape).
"""

from __future__ import annotations


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a row emits in a step with γ drafts at independent per-draft acceptance α."""
    return float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def break_even_acceptance(step_times: list[float]) -> float:
    """Smallest per-draft acceptance α at which some γ ≥ 1 emits tokens faster than γ = 0.

    `step_times[γ]` is a step's predicted seconds. With independent acceptance α a step at γ emits
    (1 − α^(γ+1)) / (1 − α) tokens per row, increasing in α, so bisection finds the crossing; 1.0 if
    speculation never pays at these costs.
    """
    def pays(alpha: float) -> bool:
        rates = [expected_tokens(alpha, g) / t for g, t in enumerate(step_times)]
        return max(rates[1:], default=0.0) > rates[0]

    if not pays(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi
