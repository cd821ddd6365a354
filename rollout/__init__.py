"""specroll.rollout — the speculative rollout engine (one process; no Ray, no TRL)."""

from .config import EngineConfig, SamplingParams
from .engine import SpecEngine
from .request import Rollout, RolloutSignals
from .stats import EngineStats

__all__ = ["EngineConfig", "EngineStats", "Rollout", "RolloutSignals", "SamplingParams", "SpecEngine"]
