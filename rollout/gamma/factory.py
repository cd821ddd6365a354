"""make_gamma_policy: the engine's γ policy from `EngineConfig.gamma`: an int is a `FixedGamma`; "auto" an
`AutoGamma` and "auto_simple" a `SimpleGamma`, both on a cost model calibrated here (`cost_model.calibrate`)."""

from __future__ import annotations

from ..config import EngineConfig
from ..drafters.protocol import Drafter
from ..models.runner import ModelRunner
from .auto import AutoGamma
from .cost_model import calibrate
from .policy import FixedGamma, GammaPolicy
from .simple import SimpleGamma


def make_gamma_policy(config: EngineConfig, target: ModelRunner, drafter: Drafter | None) -> GammaPolicy:
    if isinstance(config.gamma, int):
        return FixedGamma(config.gamma)
    if drafter is None:
        return FixedGamma(0)
    cost = calibrate(target, drafter, config.max_batch_size, config.max_gamma, config.cost_model_budget_s,
                     config.calibration_cache)
    policy = SimpleGamma if config.gamma == "auto_simple" else AutoGamma
    return policy(cost, config.max_gamma, config.acceptance_ema)
