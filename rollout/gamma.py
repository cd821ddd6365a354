"""How many tokens to draft per step: the `GammaPolicy` protocol, a fixed policy, and the factory.

Before each step the engine hands an adaptive policy the live batch's `StepShape` (rows, KV length)
and asks `choose(shape, greedy)`; after it, `observe(shape, outcome, greedy)` with the step's
`StepOutcome`. `EngineConfig.gamma` picks the policy: an int is `FixedGamma`, "auto" the
throughput-maximising `gamma_rate.RateGamma` over a cost model calibrated on this hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .config import EngineConfig
from .cost_model import CALIBRATION_CONTEXT, calibrate
from .gamma_rate import RateGamma
from .runner import ModelRunner

if TYPE_CHECKING:
    from .drafter import Drafter


@dataclass
class StepShape:
    """What a policy may look at before a step (the engine fills `context` only for adaptive policies)."""

    rows: int  # live rows
    context: int = CALIBRATION_CONTEXT  # KV length the step's attention reads (the longest row)


@dataclass
class StepOutcome:
    """What one step revealed: per-position acceptance counts and the step's time."""

    gamma: int
    rows: int
    counts: list[list[int]] | None  # `acceptance_counts` as host lists; None for a plain step
    seconds: float
    draft_seconds: float | None = None  # the part of `seconds` spent drafting


def acceptance_counts(accepted_len: list[int], decided_len: list[int], gamma: int) -> list[list[int]]:
    """Per-position counts of one step's drafts: [reached, kept], each of length γ.

    Per row: `accepted_len` drafts kept (a prefix) and the first `decided_len` drafts' outcomes
    mattered (the rest lay past the row's stop token or length limit, and are no evidence). Host
    lists — the engine copies them with the rest of its step summary — and O(rows + γ).
    """
    ends = [[0] * (gamma + 1) for _ in range(2)]  # how many rows' reached / kept prefix ends at each length
    for kept, decided in zip(accepted_len, decided_len):
        ends[0][min(kept + 1, decided, gamma)] += 1
        ends[1][min(kept, decided)] += 1
    out = []
    for hist in ends:  # position j counts the rows whose prefix is longer than j
        count, col = sum(hist), []
        for j in range(gamma):
            count -= hist[j]
            col.append(count)
        out.append(col)
    return out


class GammaPolicy(Protocol):
    adaptive: bool  # False: `choose` ignores the shape, and the engine neither times nor counts for it

    def choose(self, shape: StepShape, greedy: bool) -> int: ...

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None: ...

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        """How many of a proposal's columns to verify, given the drafts expected kept over all rows if
        the first w are (`expected_kept[w]`, w = 0..width): the width whose step pays best."""
        ...

    def break_even_acceptance(self, rows: int, context: int) -> float | None:
        """The per-draft acceptance below which no γ ≥ 1 beats plain decoding at this batch shape
        (`break_even`); None without a cost model to ask."""
        ...


class FixedGamma:
    """Always the configured γ (0 = plain decoding)."""

    adaptive = False

    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self, shape: StepShape, greedy: bool) -> int:
        return self.gamma

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None:
        return None

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        return len(expected_kept) - 1  # no cost model to weigh a column against

    def break_even_acceptance(self, rows: int, context: int) -> float | None:
        return None


def make_gamma_policy(config: EngineConfig, target: ModelRunner, drafter: Drafter | None) -> GammaPolicy:
    if isinstance(config.gamma, int):
        return FixedGamma(config.gamma)
    if drafter is None:
        return FixedGamma(0)
    cost = calibrate(target, drafter, config.max_batch_size, config.max_gamma, config.cost_model_budget_s,
                     config.calibration_cache)
    return RateGamma(cost, config.max_gamma, config.acceptance_ema)
