"""The break-even acceptance: below it, no draft length beats plain decoding at the given step costs.

    alpha_min = break_even_acceptance(policy.step_times(rows, context))   # step seconds for γ = 0..max

The online learner's watchdog reverts a drafter whose held-out acceptance falls below it
(`SpecEngine.break_even_acceptance` asks the auto-γ cost model for the live batch shape).
"""

from __future__ import annotations


def break_even_acceptance(step_times: list[float]) -> float:
    """Smallest per-draft acceptance α at which some γ ≥ 1 emits tokens faster than γ = 0.

    `step_times[γ]` is a step's predicted seconds. With independent acceptance α a step at γ emits
    (1 − α^(γ+1)) / (1 − α) tokens per row, increasing in α, so bisection finds the crossing; 1.0 if
    speculation never pays at these costs.
    """
    def pays(alpha: float) -> bool:
        rates = [(1 - alpha ** (g + 1)) / (1 - alpha) / t for g, t in enumerate(step_times)] if alpha < 1 else [
            (g + 1) / t for g, t in enumerate(step_times)]
        return max(rates[1:], default=0.0) > rates[0]

    if not pays(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi
