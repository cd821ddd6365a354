"""`SpecEngine`'s memory: the plan checked before anything is allocated, and the caches handed to a colocated
trainer between rollout phases (`release` / `allocate`). A base of `engine.SpecEngine`, which sets `config`,
`target`, `drafter`, `rows`, `device` and `_hidden_size`.
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


class EngineMemory:
    config: EngineConfig
    target: ModelRunner
    drafter: Drafter | None
    rows: RowBuffers | None
    device: torch.device
    _generating: bool

    def _plan_memory(self, target: PreTrainedModel, drafter: DrafterWeights | Drafter | None) -> MemoryPlan:
        """`models.memory.plan_memory` for what `drafter` will be, before anything is allocated."""
        need = drafter_memory(drafter, self.config, target)
        return plan_memory(self.config, target, need.cache_shapes, need.weight_bytes, need.hidden_width)

    @property
    def released(self) -> bool:
        """Whether `release` freed the caches (and `allocate` has not made them again)."""
        return self.rows is None

    def release(self) -> None:
        """Free the KV caches (target and drafter), recurrent state and per-row buffers between `generate`
        calls, so that a trainer colocated with the engine can use the memory; weights, the drafter's suffix
        history, stats and the cost model stay. `allocate` makes them again. On a GPU the memory goes back to
        torch's caching allocator (the trainer's next allocations reuse it; `torch.cuda.empty_cache()` hands
        it to the driver; on a CPU the host heap is trimmed, `models.memory.return_host_memory`). A released
        engine refuses `generate` (it does not re-allocate by itself: memory a colocated trainer may hold is not
        taken behind its back). Releasing twice is a no-op."""
        if self._generating:
            raise RuntimeError("release called while this engine is running a generation; finish or close it first")
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
                          config.signal_top_k if config.record_signals else None, self._hidden_size, config.dtype)
