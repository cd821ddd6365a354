"""`SpecEngine`'s per-row memory: the plan checked before anything is allocated, the row buffers, and the caches
handed to a colocated trainer between rollout phases (`release` / `allocate`). The engine holds one
(`SpecEngine.caches`) and delegates its public `memory`, `release`, `allocate` and `released` to it.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .config import EngineConfig
from .core.batch import RowBuffers
from .drafters.factory import DrafterWeights, drafter_memory
from .drafters.protocol import Drafter
from .models.memory import MemoryPlan, plan_memory, return_host_memory
from .models.runner import ModelRunner


def plan_engine_memory(config: EngineConfig, target: PreTrainedModel,
                       drafter: DrafterWeights | Drafter | None) -> MemoryPlan:
    """`models.memory.plan_memory` for what `drafter` will be, before anything is allocated."""
    need = drafter_memory(drafter, config, target)
    return plan_memory(config, target, need.cache_shapes, need.weight_bytes, need.hidden_width)


class EngineCaches:
    """The target's and the drafter's caches and the per-row buffers of one engine, planned as `memory` says."""

    def __init__(self, config: EngineConfig, memory: MemoryPlan, target: ModelRunner, drafter: Drafter | None):
        self.config, self.memory, self.target, self.drafter = config, memory, target, drafter
        self.device = torch.device(config.device)
        # the width of the target hidden states a feature drafter reads (`Drafter.wants_hidden`), else None
        self.hidden_size = target.hidden_width if drafter is not None and drafter.wants_hidden else None
        self.rows: RowBuffers | None = self._row_buffers()

    @property
    def released(self) -> bool:
        """Whether `release` freed the caches (and `allocate` has not made them again)."""
        return self.rows is None

    def release(self) -> None:
        """Free the KV caches (target and drafter), recurrent state and per-row buffers (`SpecEngine.release`);
        on a CPU the host heap is trimmed (`models.memory.return_host_memory`). Releasing twice is a no-op."""
        if self.released:
            return
        self.target.cache.release()
        if self.drafter:
            self.drafter.release()
        self.rows = None
        if self.device.type == "cpu":
            return_host_memory()

    def allocate(self) -> None:
        """Make what `release` freed again, zeroed (a no-op on an allocated engine)."""
        if not self.released:
            return
        self.target.cache.allocate()
        if self.drafter:
            self.drafter.allocate()
        self.rows = self._row_buffers()

    def _row_buffers(self) -> RowBuffers:
        config = self.config
        return RowBuffers(config.max_batch_size, config.cache_len, self.device,
                          config.signal_top_k if config.record_signals else None, self.hidden_size, config.dtype)
