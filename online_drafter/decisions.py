"""The watchdog's decision, stated once for the head learner: when the served drafter must be replaced,
and by which known one.

`watchdog_reason` says why the served drafter must go — it scored below the frozen step-0 drafter by
more than `watchdog_margin` beyond `gate_z` standard errors (paired, on the same positions), or below
the γ policy's break-even acceptance — or None; `best_known` names the drafter to publish instead. The
rules are `DraftLearner`'s (docs/online_learning.md, *Decisions*).
"""

from __future__ import annotations

import math

from .learner_config import LearnerConfig
from .paired import GroupScores, paired_gain


def watchdog_reason(served: GroupScores, frozen: GroupScores, version: int, config: LearnerConfig,
                    break_even: float | None, where: str) -> str | None:
    """Why the served `version` must be replaced (scored on `where`), or None when it may stay."""
    versus_frozen = paired_gain(served, frozen)
    if versus_frozen.below(config.gate_z, config.watchdog_margin):
        return (f"{where}: served version {version} scored {versus_frozen.mean:+.4f} ± {versus_frozen.se:.4f} "
                "below the frozen drafter")
    if break_even is not None and served.mean < break_even:
        return (f"{where}: served version {version} scored {served.mean:.4f}, below the γ policy's break-even "
                f"acceptance {break_even:.4f}")
    return None


def best_known(known: dict[str, GroupScores]) -> str:
    """The name of the known drafter ("frozen", "served", "candidate") that scores highest."""
    return max(known, key=lambda name: known[name].mean)


def smoothed(estimate: float, measured: float) -> float:
    """Geometric mean of the running estimate and a new measurement (the measurement alone at first):
    one round slowed by a busy machine moves the next round's reserve by √, not by the whole spike."""
    return measured if estimate <= 0 else math.sqrt(estimate * measured)
