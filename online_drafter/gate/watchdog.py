"""The watchdog's rule: when the served drafter must be replaced, whatever the candidate is doing.

The served (published) drafter is replaced when it scores below the frozen step-0 drafter beyond the paired
interval (by `LearnerConfig.watchdog_margin`), on the held-out set each round or on a probe, or below the
break-even acceptance the engine's γ policy computes. `learner.Learner` then publishes the best drafter it knows.
"""

from __future__ import annotations

from ..learner_config import LearnerConfig
from .paired import GroupScores, paired_gain


def watchdog_reason(served: GroupScores, frozen: GroupScores, break_even: float | None, where: str, version: int,
                    config: LearnerConfig) -> str | None:
    """Why served `version` must be replaced (`where`: "held-out" or "probe"), or None."""
    versus_frozen = paired_gain(served, frozen)
    if versus_frozen.below(config.gate_z, config.watchdog_margin):
        return (f"{where}: served version {version} scored {versus_frozen.mean:+.4f} ± "
                f"{versus_frozen.se:.4f} below the frozen drafter")
    if break_even is not None and served.mean < break_even:
        return (f"{where}: served version {version} scored {served.mean:.4f}, below the γ policy's "
                f"break-even acceptance {break_even:.4f}")
    return None
