"""The engine's memory, part by part, against `EngineConfig.memory_budget` — checked before anything is allocated.

`plan_memory` adds up, in bytes: the weights (target and drafter, parameters at the engine's dtype, buffers
as they are), the target's KV cache (dense: `max_batch_size × cache_len` tokens; paged: the pool the budget
leaves, at least one full row), the drafter's KV cache (dense), recurrent state rings (target and drafter),
and a workspace estimate (the per-slot row buffers — tokens, log-probs, recorded signals, hidden states
for a feature drafter — plus one step's logits, p and noise over `max_step_drafts + 1` positions: a chain's γ + 1,
a tree's 1 + γ·w). Shapes come from the same one-token probe the caches are built from
(`cache.probe_layer_shapes`), so what is checked is what would be allocated. A drafter passed as a `Drafter`
object is taken as it is (its memory not counted).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

from .cache import HybridShape, LayerShape, StateShape, probe_layer_shapes
from .paged import RESERVED_BLOCKS

STEP_FLOAT_TENSORS = 3  # a step's [B, γ+1, V] tensors beside the target's logits: p (fp32), noise, a temporary


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per part; `kv_blocks` the paged pool's blocks (None: a dense target cache)."""

    weights: int
    target_kv: int
    drafter_kv: int
    recurrent_state: int
    workspace: int
    kv_blocks: int | None = None

    @property
    def total(self) -> int:
        return self.weights + self.target_kv + self.drafter_kv + self.recurrent_state + self.workspace

    def describe(self) -> str:
        return (f"weights {self.weights} B, target KV {self.target_kv} B, drafter KV {self.drafter_kv} B, "
                f"recurrent state {self.recurrent_state} B, workspace {self.workspace} B (total {self.total} B)")


def return_host_memory() -> None:
    """Hand the host heap's free pages back to the OS (glibc's `malloc_trim`; a no-op elsewhere). A freed CPU tensor
    below glibc's mmap threshold stays in the process's resident memory — and the threshold grows with every large
    buffer freed before, so in a long-lived process (a trainer, a test session) a released cache of 4 × 34 MB kept
    one of them (RSS fell 101 of 134 MB)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # another C library (musl): its free returns what it can
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def device_memory(device: torch.device) -> int:
    """The device's memory in bytes (a CPU's: the machine's physical memory)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def module_bytes(module: nn.Module, dtype: torch.dtype) -> int:
    """Parameters at `dtype`, buffers as they are (rotary frequencies stay fp32)."""
    params = sum(p.numel() for p in module.parameters()) * dtype.itemsize
    return params + sum(b.numel() * b.element_size() for b in module.buffers())


def kv_bytes_per_token(shapes: list, dtype: torch.dtype) -> int:
    """K and V bytes one token takes over all attention layers of `shapes` (`cache.probe_layer_shapes`)."""
    layers = [s.attention if isinstance(s, HybridShape) else s for s in shapes]
    return sum(s.num_heads * (s.key_dim + s.value_dim) for s in layers if isinstance(s, LayerShape)) * dtype.itemsize


def state_bytes_per_row(shapes: list, history: int, dtype: torch.dtype) -> int:
    """Recurrent-state ring bytes of one row (`recurrent.linear_state.RaggedStateLayer`)."""
    total = 0
    for shape in shapes:
        state = shape.state if isinstance(shape, HybridShape) else shape
        if isinstance(state, StateShape):
            total += (history + state.conv_kernel) * state.conv_dim * dtype.itemsize
            total += (history + 1) * math.prod(state.state) * state.state_dtype.itemsize
    return total


def plan_memory(config, target: nn.Module, drafter_shapes: list | None, drafter_weights: int,
                hidden_size: int | None) -> MemoryPlan:
    """What the engine `config` describes needs, part by part; raises `ValueError` if `config.memory_budget`
    cannot hold it (naming the bytes per part). `drafter_shapes`: the drafter's cache layers (None: no cache
    of its own); `drafter_weights` its bytes; `hidden_size` the target's, if a feature drafter records it."""
    dtype, slots, length = config.dtype, config.max_batch_size, config.cache_len
    target_shapes = probe_layer_shapes(target)
    per_token = kv_bytes_per_token(target_shapes, dtype)
    drafter_kv = slots * length * kv_bytes_per_token(drafter_shapes, dtype) if drafter_shapes else 0
    state = slots * (state_bytes_per_row(target_shapes, config.state_history, dtype)
                     + (state_bytes_per_row(drafter_shapes, config.state_history, dtype) if drafter_shapes else 0))
    vocab = target.get_output_embeddings().weight.shape[0]
    rows = slots * length * (8 + 4)  # tokens, log-probs
    if config.record_signals:
        rows += slots * length * (config.signal_top_k * (8 + 4) + 8 + 1)
    if hidden_size:
        rows += slots * length * hidden_size * dtype.itemsize
    step = slots * (config.max_step_drafts + 1) * vocab * (dtype.itemsize + 4 * STEP_FLOAT_TENSORS)
    weights = module_bytes(target, dtype) + drafter_weights
    dense = MemoryPlan(weights, slots * length * per_token, drafter_kv, state, rows + step)
    budget = config.memory_budget
    if budget is None:
        return dense if config.kv_cache == "dense" else _paged(dense, config, per_token, None)
    limit = budget if isinstance(budget, int) else int(budget * device_memory(torch.device(config.device)))
    if config.kv_cache == "dense":
        if dense.total > limit:
            raise ValueError(f"memory_budget={budget!r} ({limit} B) cannot hold this engine (kv_cache='dense'): it "
                             f"needs {dense.describe()}; lower max_batch_size or max_seq_len, or use kv_cache='paged'")
        return dense
    smallest = _paged(dense, config, per_token, 0)  # one full row
    if smallest.total > limit:
        raise ValueError(f"memory_budget={budget!r} ({limit} B) cannot hold this engine (kv_cache='paged'): it "
                         f"needs at least {smallest.describe()}, the target KV being one row of cache_len={length} "
                         "tokens")
    return _paged(dense, config, per_token, min(dense.target_kv, limit - smallest.total + smallest.target_kv))


def _paged(dense: MemoryPlan, config, per_token: int, pool_bytes: int | None) -> MemoryPlan:
    """`dense` with a paged target cache of about `pool_bytes` (at least one full row, plus the reserved blocks;
    None: every slot's full row, as the dense cache holds)."""
    size = config.kv_block_size
    block_bytes = max(per_token * size, 1)
    one_row = -(-config.cache_len // size)
    rows = config.max_batch_size * one_row if pool_bytes is None else max(pool_bytes // block_bytes, one_row)
    blocks = rows + RESERVED_BLOCKS
    return MemoryPlan(dense.weights, blocks * block_bytes, dense.drafter_kv, dense.recurrent_state, dense.workspace,
                      kv_blocks=blocks)
