"""Where one forward writes (`WritePlan`), the slot its cache and layers share (`PlanSlot`), and what every
planned cache layer answers HF the same way (`PlannedLayer`: dense K/V, paged pools, recurrent state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import CacheLayerMixin

from .attention import attention


@dataclass
class WritePlan:
    """Where the next forward writes: row ids (a prefix `slice` or an index tensor) and positions."""

    rows: slice | torch.Tensor
    row_ids: torch.Tensor  # [n] the rows as indices
    start: torch.Tensor  # [n] int64 first slot each row writes
    count: torch.Tensor  # [n] int64 real tokens per row (the rest of the Q are right padding)
    positions: torch.Tensor  # [n, Q] int64 slot of each new token
    kv_len: int  # slots the attention reads: max(start) + Q
    same_start: int | None = None  # every row writes at this slot (then a slice copy replaces the scatter)
    first_snapshot: int = 0  # linear-attention layers snapshot their state from this query index on
    write_slots: torch.Tensor | None = None  # [n, Q] pool slots of the writes (paged cache only)
    read_blocks: torch.Tensor | None = None  # [n, nb] blocks attention reads, nb · block_size ≥ K (paged cache only)
    _index: dict[torch.Size, torch.Tensor] = field(default_factory=dict)
    _ring: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    _reads: dict[int, torch.Tensor] = field(default_factory=dict)

    def scatter_index(self, shape: torch.Size) -> torch.Tensor:
        """`positions` broadcast to [n, H, Q, D], built once per forward and shape (K and V may differ)."""
        index = self._index.get(shape)
        if index is None:
            index = self._index[shape] = self.positions[:, None, :, None].expand(shape)
        return index

    def read_index(self, heads: int, num_blocks: int) -> torch.Tensor:
        """[heads · n · nb]: `read_blocks` in a pool viewed as [heads · num_blocks, block] (head h's block b at
        h · num_blocks + b), built once per forward and head count."""
        index = self._reads.get(heads)
        if index is None:
            offsets = torch.arange(heads, device=self.read_blocks.device)[:, None] * num_blocks
            index = self._reads[heads] = (offsets + self.read_blocks.reshape(1, -1)).reshape(-1)
        return index

    def ring_slots(self, size: int, offset: int = 0) -> torch.Tensor:
        """[n, Q]: slot `(start + q + offset) mod size` of a ring of `size`, for each row's last `size`
        real tokens; `size` (the ring's spare slot) for padding and older tokens."""
        slots = self._ring.get((size, offset))
        if slots is None:
            q = torch.arange(self.positions.shape[1], device=self.start.device)[None, :]  # [1, Q]
            count = self.count[:, None]  # [n, 1]
            kept = (q < count) & (q >= count - size)
            slots = self._ring[(size, offset)] = torch.where(kept, (self.start[:, None] + q + offset) % size, size)
        return slots


class PlanSlot:
    """The write plan of the forward in flight, shared by a cache and its layers, and the cache's length.

    Layers hold this, not their cache: no reference cycle between them, so a dropped cache (and engine)
    frees its buffers at once instead of when the cyclic garbage collector next runs."""

    def __init__(self, length: int):
        self.plan: WritePlan | None = None
        self.length = length


class PlannedLayer(CacheLayerMixin):
    """A cache layer whose buffers are preallocated and whose forward follows its cache's `PlanSlot`."""

    is_compileable = False
    slot: PlanSlot

    def lazy_initialization(self, *args, **kwargs) -> None:
        raise RuntimeError(f"{type(self).__name__} buffers are preallocated")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slot.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.slot.plan.kv_len if self.slot.plan is not None else 0

    def get_max_length(self) -> int:
        return self.slot.length

    def attend(self, q: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor, mask: torch.Tensor | None,
               groups: int, scale: float) -> torch.Tensor:
        """Write this forward's K/V [n, Hkv, Q, D] (`update`), then SDPA of q [n, Hq, Q, D] over the row's cache
        (`attention.attention`) → [n, Hq, Q, Dv]: how the lean forward attends."""
        keys, values = self.update(key_states, value_states)
        return attention(q, keys, values, mask, groups, scale=scale)
