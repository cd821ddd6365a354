"""specroll.rollout — the speculative rollout engine (one process; no Ray, no TRL).

Open `engine.py` (the step loop) and `config.py` first; beside it `tree_step.py` (a step over token trees) and the
engine's memory and weights (`engine_memory.py`, `engine_weights.py`). Below them, one folder per concept, imports
pointing one way (each uses only those before it): `core/stats` and `config` ← `sampling/` ← `core/` ← `models/` ←
`drafters/` ← `gamma/` and `prefill` ← `engine`.
"""

from .config import EngineConfig, SamplingParams
from .core.request import Rollout, RolloutSignals
from .core.stats import EngineStats
from .engine import SpecEngine

__all__ = ["EngineConfig", "EngineStats", "Rollout", "RolloutSignals", "SamplingParams", "SpecEngine"]
