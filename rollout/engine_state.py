"""What an engine learnt while it ran, gathered for a resumed run: the suffix history and the γ statistics.

    state = engine_state(engine)             # between generate calls: plain data and int64 tensors
    load_engine_state(fresh_engine, state)   # an engine of the same drafter kinds and max_gamma

A `SpecEngine` learns two things from the rollouts it serves that change its speed, never a token: the suffix
drafter's history (every prompt's completions) with its acceptance per match length
(`drafters.suffix.SuffixDrafter.state_dict`), and the γ policy's acceptance statistics, step counters
and online time corrections (`gamma.policy.GammaPolicy.state_dict`: restored together — acceptance without
the measured per-step overhead makes speculation look dearer than it is, and a resumed engine then decodes plain).
With several drafters (`drafters.suffix_or_model`) the per-row choice's running acceptance of the model drafter
comes too, and with `tree_width: auto` the tree policy's (`gamma.tree.AutoWidth.state_dict`: each width's
acceptance along the path, its per-level time offsets). Not gathered: the cost model's calibration (measured
again, or read from `calibration_cache`; the corrections go on adapting on whatever hardware the resumed run has),
and the drafter's weights (the learner publishes them; the backends sync them).

Read from the engine's `drafter` and `gamma_policy` from outside the engine (no state API of its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .drafters.suffix import SuffixDrafter
from .drafters.suffix_or_model import SuffixOrModelDrafter

if TYPE_CHECKING:
    from .engine import SpecEngine

FORMAT = 1


def engine_state(engine: SpecEngine) -> dict[str, Any]:
    """The engine's suffix history and γ statistics (see the module doc); take it between `generate` calls."""
    suffix, model_rates = _suffix_parts(engine)
    return {"format": FORMAT, "gamma_kind": type(engine.gamma_policy).__name__,
            "gamma": engine.gamma_policy.state_dict(),
            "tree": _tree_state(engine),
            "suffix": None if suffix is None else suffix.state_dict(),
            "model_rates": None if model_rates is None else model_rates.state_dict()}


def load_engine_state(engine: SpecEngine, state: dict[str, Any]) -> None:
    """Take back an `engine_state()` into `engine` between `generate` calls. Raises ValueError naming what differs
    when the engine's γ policy or drafter kinds are not the saved engine's."""
    if state.get("format") != FORMAT:
        raise ValueError(f"engine state format {state.get('format')!r} is invalid: {FORMAT} is read")
    kind = type(engine.gamma_policy).__name__
    if state["gamma_kind"] != kind:
        raise ValueError(f"the saved engine's γ policy is {state['gamma_kind']}, this engine's {kind}: engine.gamma "
                         "must be the saved run's")
    suffix, model_rates = _suffix_parts(engine)
    if (state["suffix"] is None) != (suffix is None) or (state["model_rates"] is None) != (model_rates is None):
        raise ValueError(f"the saved engine {'had' if state['suffix'] is not None else 'had no'} suffix drafter and "
                         f"this one {'has' if suffix is not None else 'has none'} (or one of them drafts with a model "
                         "beside it): engine.drafters must be the saved run's")
    engine.gamma_policy.load_state_dict(state["gamma"])
    tree = state.get("tree")  # absent in a state saved before trees kept one
    if tree is not None and hasattr(engine.tree_policy, "load_state_dict"):
        engine.tree_policy.load_state_dict(tree)
    if suffix is not None:
        suffix.load_state_dict(state["suffix"])
    if model_rates is not None:
        model_rates.load_state_dict(state["model_rates"])


def _tree_state(engine: SpecEngine) -> dict | None:
    """The tree policy's statistics (None for chains or a fixed width, which learn nothing)."""
    policy = getattr(engine, "tree_policy", None)
    return policy.state_dict() if hasattr(policy, "state_dict") else None


def _suffix_parts(engine: SpecEngine) -> tuple[SuffixDrafter | None, Any]:
    """The engine's suffix drafter and, beside a model drafter, the model's running rates (`DecayedRates`)."""
    drafter = engine.drafter
    if isinstance(drafter, SuffixOrModelDrafter):
        return drafter.suffix, drafter.model_rates
    if isinstance(drafter, SuffixDrafter):
        return drafter, None
    return None, None
