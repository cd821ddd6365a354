"""How many tokens to draft per step: the `GammaPolicy` protocol and the fixed policy.

The engine asks `choose(num_live_rows, greedy)` before each step and reports what happened with
`observe(...)` after it, so an adaptive policy can learn acceptance and costs online.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .config import EngineConfig


class GammaPolicy(Protocol):
    def choose(self, num_live_rows: int, greedy: bool) -> int: ...

    def observe(self, num_live_rows: int, gamma: int, accepted: torch.Tensor, greedy: bool,
                step_time_s: float) -> None: ...


class FixedGamma:
    """Always the configured γ (0 = plain decoding)."""

    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self, num_live_rows: int, greedy: bool) -> int:
        return self.gamma

    def observe(self, num_live_rows: int, gamma: int, accepted: torch.Tensor, greedy: bool,
                step_time_s: float) -> None:
        return None


def make_gamma_policy(config: EngineConfig, target, drafter) -> GammaPolicy:
    if config.gamma == "auto":
        raise ValueError("gamma='auto' is not available yet; use an int >= 0")
    return FixedGamma(config.gamma)
