"""specroll.rollout — the speculative rollout engine (one process; no Ray, no TRL).

Open `engine.py` (the step loop: schedule → run → postprocess) and `config.py` first; beside it the parts the
engine holds: its memory (`engine_caches.py`), weights and versions (`engine_weights.py`) and speculation plan
(`engine_speculation.py`); `step/` holds the steps it runs (`chain`, `tree`, `prefill`, on the stages in `base`).
Below them, one folder per concept, imports pointing one way (each uses only those before it): `core/stats` and
`config` ← `sampling/` ← `core/` ← `models/` ← `drafters/` ← `gamma/`, `placement/` (where the drafter runs, and
drafting ahead; its `device` parser is a leaf `config` reads) ← the engine's parts ← `step/` ← `engine`.
"""

from .config import EngineConfig, SamplingParams
from .core.request import Rollout, RolloutSignals
from .core.stats import EngineStats
from .engine import SpecEngine

__all__ = ["EngineConfig", "EngineStats", "Rollout", "RolloutSignals", "SamplingParams", "SpecEngine"]
