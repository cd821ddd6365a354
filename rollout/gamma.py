"""How many tokens to draft per step: the `GammaPolicy` protocol, a fixed policy and `AutoGamma`.

The engine asks `choose(num_live_rows, greedy)` before each step and reports the step with
`observe(...)` after it. `AutoGamma` picks γ ∈ {0, …, max_gamma} maximising expected tokens per
second for the live batch:

    E[tokens per row | γ] = 1 + Σ_{i=1..γ} Π_{j≤i} α_j      (α_j: P(draft j kept | drafts < j kept))
    time(γ, n)           = γ drafter forwards + one target forward of γ + 1 tokens, for n rows

with α_j kept online (exponentially weighted, per draft position, separately for greedy and sampled
runs) and time from a `CostModel` measured on this hardware. γ = 0 (plain decoding) wins whenever
the drafter's cost or a low acceptance does not pay — as it does for large live batches, where a
forward of γ + 1 tokens per row is no longer nearly free. There is no hard-coded batch threshold.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .config import EngineConfig
from .cost_model import CALIBRATION_CONTEXT, CostModel, calibrate
from .runner import ModelRunner

PRIOR_ACCEPTANCE = 0.6  # α before any observation
PRIOR_ROWS = 2  # ... worth this many rows of evidence
SHRINK_ROWS = 4  # pseudo-rows pulling each position's α toward the pooled one
EXPLORE_EVERY = 32  # plain steps between probes of the best γ > 0, so stale α estimates can recover
EXPLORE_WITHIN = 0.75  # ... probed only if predicted to reach this fraction of plain throughput


class GammaPolicy(Protocol):
    def choose(self, num_live_rows: int, greedy: bool, context: int = CALIBRATION_CONTEXT) -> int: ...

    def observe(self, num_live_rows: int, gamma: int, accepted: torch.Tensor, greedy: bool,
                step_time_s: float, context: int = CALIBRATION_CONTEXT, decided: torch.Tensor | None = None) -> None:
        ...


class FixedGamma:
    """Always the configured γ (0 = plain decoding)."""

    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self, num_live_rows: int, greedy: bool, context: int = CALIBRATION_CONTEXT) -> int:
        return self.gamma

    def observe(self, num_live_rows: int, gamma: int, accepted: torch.Tensor, greedy: bool,
                step_time_s: float, context: int = CALIBRATION_CONTEXT, decided: torch.Tensor | None = None) -> None:
        return None


class AcceptanceEstimate:
    """Conditional acceptance α_j per draft position, from exponentially decayed counts.

    Every step decays all counts by `decay` (memory ~1/(1 - decay) steps at any batch size) and adds
    the step's kept/reached rows per position. Positions share strength: α_j is position j's counts
    shrunk toward the pooled acceptance of all positions by `SHRINK_ROWS` pseudo-rows, and the pooled
    rate starts from `PRIOR_ROWS` pseudo-rows at `PRIOR_ACCEPTANCE`. So one unlucky rejection at a
    deep position (a batch of one row) cannot pin γ below it, and positions never drafted take the
    pooled rate instead of a fixed prior.
    """

    def __init__(self, max_gamma: int, decay: float):
        self.kept = [0.0] * max_gamma
        self.reached = [0.0] * max_gamma
        self.decay = decay
        self.seen = [False] * max_gamma
        self.alpha = [PRIOR_ACCEPTANCE] * max_gamma

    @property
    def any_seen(self) -> bool:
        return any(self.seen)

    def update(self, accepted: torch.Tensor, decided: torch.Tensor | None = None) -> None:
        """`accepted` [n, γ] bool (prefix-closed) from one step; `decided` [n, γ] masks out drafts
        whose outcome did not matter (past the row's stop token or length limit)."""
        if accepted.numel() == 0:
            return
        reached = torch.cat([accepted.new_ones(accepted.shape[0], 1), accepted[:, :-1]], 1)  # [n, γ]
        if decided is not None:
            reached, accepted = reached & decided, accepted & decided
        reached, kept = reached.sum(0), accepted.sum(0)  # [γ]
        self.kept = [self.decay * k for k in self.kept]
        self.reached = [self.decay * r for r in self.reached]
        for j, (r, k) in enumerate(zip(reached.tolist(), kept.tolist())):
            if r:
                self.seen[j] = True
                self.kept[j] += k
                self.reached[j] += r
        pooled = (sum(self.kept) + PRIOR_ACCEPTANCE * PRIOR_ROWS) / (sum(self.reached) + PRIOR_ROWS)
        self.alpha = [(k + SHRINK_ROWS * pooled) / (r + SHRINK_ROWS) for k, r in zip(self.kept, self.reached)]

    def position_alpha(self, j: int) -> float:
        return self.alpha[j]

    def expected_tokens(self, gamma: int) -> float:
        total, survive = 1.0, 1.0
        for j in range(gamma):
            survive *= self.position_alpha(j)
            total += survive
        return total


class AutoGamma:
    def __init__(self, cost: CostModel, max_gamma: int, decay: float):
        self.cost = cost
        self.max_gamma = max_gamma
        self.estimates = {True: AcceptanceEstimate(max_gamma, decay), False: AcceptanceEstimate(max_gamma, decay)}
        self.plain_steps = 0

    def throughput(self, num_live_rows: int, gamma: int, greedy: bool, context: int = CALIBRATION_CONTEXT) -> float:
        """Expected tokens per second for the live batch at γ, `context` tokens deep."""
        tokens = num_live_rows * self.estimates[greedy].expected_tokens(gamma)
        return tokens / self.cost.step_time(num_live_rows, gamma, context)

    def choose(self, num_live_rows: int, greedy: bool, context: int = CALIBRATION_CONTEXT) -> int:
        if not self.estimates[greedy].any_seen:
            # Nothing measured yet for this mode: one step at max_gamma measures α at every position
            # (a prior alone could keep speculation off where it pays).
            return self.max_gamma
        rates = [self.throughput(num_live_rows, g, greedy, context) for g in range(self.max_gamma + 1)]
        best = max(range(len(rates)), key=rates.__getitem__)
        if best > 0:
            return best
        # Acceptance is only measured while speculating: an estimate that talked us into plain
        # decoding would never be corrected. Probe the runner-up now and then, at bounded cost.
        self.plain_steps += 1
        runner_up = max(range(1, len(rates)), key=rates.__getitem__)
        if self.plain_steps % EXPLORE_EVERY == 0 and rates[runner_up] >= EXPLORE_WITHIN * rates[0]:
            return runner_up
        return 0

    def observe(self, num_live_rows: int, gamma: int, accepted: torch.Tensor, greedy: bool,
                step_time_s: float, context: int = CALIBRATION_CONTEXT, decided: torch.Tensor | None = None) -> None:
        self.estimates[greedy].update(accepted, decided)
        self.cost.observe(num_live_rows, gamma, step_time_s, context)

    @property
    def acceptance(self) -> dict[str, list[float]]:
        return {"greedy": list(self.estimates[True].alpha), "sampled": list(self.estimates[False].alpha)}


def make_gamma_policy(config: EngineConfig, target: ModelRunner, drafter: ModelRunner | None) -> GammaPolicy:
    if config.gamma != "auto":
        return FixedGamma(config.gamma)
    if drafter is None:
        return FixedGamma(0)
    cost = calibrate(target, drafter, config.max_batch_size, config.max_gamma, config.cost_model_budget_s,
                     config.calibration_cache)
    return AutoGamma(cost, config.max_gamma, config.acceptance_ema)
