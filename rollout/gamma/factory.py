"""make_gamma_policy: the engine's γ policy from `EngineConfig.gamma`: an int is a `FixedGamma`; "auto" an
`AutoGamma` and "auto_simple" a `SimpleGamma`, both on a cost model calibrated here (`calibration.calibrate`).
make_tree_policy: the tree shape from `EngineConfig.tree_width` (`tree_shape`)."""

from __future__ import annotations

from ..config import EngineConfig
from ..drafters.protocol import Drafter
from ..models.runner import ModelRunner
from .auto import AutoGamma
from .calibration import calibrate
from .policy import FixedGamma, GammaPolicy
from .simple import SimpleGamma
from .tree_shape import AutoWidth, FixedWidth


def make_gamma_policy(config: EngineConfig, target: ModelRunner, drafter: Drafter | None) -> GammaPolicy:
    if isinstance(config.gamma, int):
        return FixedGamma(config.gamma)
    if drafter is None:
        return FixedGamma(0)
    max_query = 1 + config.max_gamma * config.max_tree_width if config.tree_width == "auto" else None
    cost = calibrate(target, drafter, config.max_batch_size, config.max_gamma, config.cost_model_budget_s,
                     config.calibration_cache, max_query)
    cost.invariant = config.sampler == "invariant"
    policy = SimpleGamma if config.gamma == "auto_simple" else AutoGamma
    return policy(cost, config.max_gamma, config.acceptance_ema)


def make_tree_policy(config: EngineConfig, gamma_policy: GammaPolicy) -> FixedWidth | AutoWidth | None:
    """None for chains (`tree_width=1`); a `FixedWidth` for an int width; an `AutoWidth` on the γ policy's cost
    model for "auto" (the config allows it only with gamma="auto", an `AutoGamma`)."""
    if config.tree_width == 1:
        return None
    if config.tree_width == "auto":
        if not isinstance(gamma_policy, AutoGamma):
            raise ValueError(f"tree_width='auto' needs the 'auto' γ policy, not {type(gamma_policy).__name__}")
        return AutoWidth(gamma_policy, config.max_tree_width, config.acceptance_ema)
    return FixedWidth(config.tree_width)
