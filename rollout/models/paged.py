"""Paged KV cache: attention K/V in a pool of fixed-size blocks, a block table per row (vLLM's PagedAttention).

`PagedKVCache` is a `cache.RaggedKVCache` whose attention layers keep their K/V in one pool per layer,
`[H_kv, num_blocks · block_size, D]`, instead of a `[B_max, H_kv, L_max, D]` buffer: row b's token at
position t lives at slot `table[b, t // block_size] · block_size + t % block_size`. Blocks are taken from a
free list as a row's forwards reach them (`plan_write`) and go back when the row finishes (`release_rows`),
is reset for a new request (`reset_rows`) or is overwritten by a move; a move is a table copy, no K/V copy.
Everything else — lengths, rollback by length, the mask, per-row positions, recurrent state rings (which
stay dense: a ring per row of `history` states is not a sequence to page) — is the ragged cache's.

Admission: `try_reserve(tokens)` reserves the blocks a request can ever need (its prompt, budget and one
step of drafts) against the free blocks, so a running row never finds the pool empty; the scheduler
admits a waiting request only when its reservation fits. Siblings of one prompt share its full blocks
(`share_prefix`): a follower's table starts with the holder's first k blocks (reference-counted,
read-only: every write of either row lands at or past the prompt's last token, in a block of its own).

Reading: the lean forward attends through `PagedLayer.attend`, which on a CPU reads the blocks in place with
the paged-attention kernel (`paged_attention`); elsewhere (a GPU, HF's own forward, an additive mask) a forward
gathers each row's blocks up to the batch's KV length into a transient `[H_kv, n, K, D]` tensor, one layer at a
time and a block per copy (`update`) — a copy of what the dense cache reads in place. Block 0 is all zeros and
never written: table entries past a row's blocks point there, so a masked slot is always finite. Block 1 takes
the writes of right padding (never read). New blocks are zeroed when taken, so nothing a previous row wrote (a NaN
included) reaches the next one. The pool is `torch.empty`: on a CPU only blocks ever taken cost
resident memory, and the free list is last-in first-out, so that is the peak of blocks held.

The host keeps the tables and the free list; the device keeps `block_table` [B, max_blocks], updated by
one host→device copy on a forward where some row enters a new block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import paged_attention
from .cache import STATE_HISTORY, HybridShape, LayerShape, RaggedKVCache, StateShape
from .plan import PlannedLayer, PlanSlot, WritePlan
from .rows import Rows, device_index, host_ids

NULL_BLOCK, PAD_BLOCK = 0, 1  # all zeros, never written; the sink of padding writes, never read
RESERVED_BLOCKS = 2


@dataclass(frozen=True)
class PagedLayout:
    """A paged cache's pool: `num_blocks` blocks (`RESERVED_BLOCKS` of them reserved) of `block_size` tokens."""

    num_blocks: int
    block_size: int


class PagedLayer(PlannedLayer):
    """One attention layer's K and V pools `[H_kv, num_blocks · block_size, D]`; `update` follows the plan."""

    def __init__(self, slot: PlanSlot, shape: LayerShape, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, space: GatherSpace):
        super().__init__()
        self.slot, self.space = slot, space
        self.shape, self.num_blocks, self.block_size, self.dtype, self.device = (shape, num_blocks, block_size,
                                                                                 dtype, device)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.allocate()
        self.is_initialized = True

    def allocate(self) -> None:
        if self.keys is not None:
            return
        slots = self.num_blocks * self.block_size
        self.keys = torch.empty(self.shape.num_heads, slots, self.shape.key_dim, dtype=self.dtype, device=self.device)
        self.values = torch.empty(self.shape.num_heads, slots, self.shape.value_dim, dtype=self.dtype,
                                  device=self.device)
        self.zero_blocks(torch.tensor([NULL_BLOCK, PAD_BLOCK], device=self.device))

    def release(self) -> None:
        self.keys = self.values = None
        self.space.clear()

    def zero_blocks(self, blocks: torch.Tensor) -> None:
        """Zero the blocks `blocks` [k] of both pools."""
        for pool in (self.keys, self.values):
            pool.view(pool.shape[0], self.num_blocks, self.block_size, pool.shape[-1])[:, blocks] = 0

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_size * self.shape.num_heads * (
            self.shape.key_dim + self.shape.value_dim) * self.dtype.itemsize

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        plan = self._write(key_states, value_states)
        heads, n, width = self.shape.num_heads, plan.read_blocks.shape[0], plan.kv_len
        # Gathered one layer at a time, whole blocks, into the cache's workspace (`GatherSpace`): [H · n · nb,
        # bs · D] -> [H, n, nb · bs, D] cut to the K slots attention reads -> [n, H, K, D], each head's [K, D]
        # contiguous, as the dense cache's view has them. One flat index_select into a reused buffer is ~3x
        # faster on a CPU than gathering slot by slot into a new tensor (no page faults, longer copies).
        index = plan.read_index(heads, self.num_blocks)
        span = plan.read_blocks.shape[1] * self.block_size
        return tuple(self.space.gather(name, pool.view(heads * self.num_blocks, -1), index)
                     .view(heads, n, span, pool.shape[-1])[:, :, :width].transpose(0, 1)
                     for name, pool in (("keys", self.keys), ("values", self.values)))

    def attend(self, q: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor, mask: torch.Tensor | None,
               groups: int, scale: float) -> torch.Tensor:
        """`PlannedLayer.attend`, reading the blocks in place where the CPU kernel serves (`paged_attention`);
        elsewhere through the gather of `update`."""
        if q.dtype != self.dtype or not paged_attention.usable(q, mask):
            return super().attend(q, key_states, value_states, mask, groups, scale)
        plan = self._write(key_states, value_states)
        return paged_attention.kernel().paged_attention(q, self.keys, self.values, plan.read_blocks, mask,
                                                        self.block_size, plan.kv_len, scale)

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> WritePlan:
        """This forward's K/V [n, H, Q, D] into their planned slots; returns the plan."""
        plan = self.slot.plan
        if plan is None or plan.write_slots is None:
            raise RuntimeError("PagedKVCache.plan_write must be called before each forward")
        heads = self.shape.num_heads
        for pool, new in ((self.keys, key_states), (self.values, value_states)):  # new: [n, H, Q, D]
            pool.index_copy_(1, plan.write_slots.reshape(-1), new.transpose(0, 1).reshape(heads, -1, new.shape[-1])
                             .to(self.dtype))
        return plan


class GatherSpace:
    """The buffers a paged cache's layers gather K and V into, one per name, shared by every layer (a layer's
    gathered K/V are read only by its own attention, before the next layer gathers) and grown to the largest
    gather seen: the transient a forward needs anyway, kept instead of allocated anew per layer."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def gather(self, name: str, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """`source.index_select(0, index)` [k, width] written into buffer `name`."""
        need = index.numel() * source.shape[1]
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < need or buffer.dtype != source.dtype or buffer.device != source.device:
            buffer = self.buffers[name] = torch.empty(need, dtype=source.dtype, device=source.device)
        return torch.index_select(source, 0, index, out=buffer[:need].view(index.numel(), source.shape[1]))

    def clear(self) -> None:
        self.buffers.clear()


class PagedKVCache(RaggedKVCache):
    """`RaggedKVCache` with paged attention K/V (module docstring): `num_blocks` blocks of `block_size` tokens,
    the first `RESERVED_BLOCKS` of them reserved."""

    def __init__(self, shapes: list[LayerShape | StateShape | HybridShape | None], batch: int, length: int,
                 dtype: torch.dtype, device: torch.device, num_blocks: int, block_size: int,
                 history: int = STATE_HISTORY):
        if num_blocks <= RESERVED_BLOCKS:
            raise ValueError(f"num_blocks={num_blocks} is invalid: more than the {RESERVED_BLOCKS} reserved blocks")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_blocks = -(-length // block_size)  # per row
        self.space = GatherSpace()
        super().__init__(shapes, batch, length, dtype, device, history)
        self.block_table = torch.zeros(batch, self.max_blocks, dtype=torch.long, device=device)  # NULL_BLOCK
        self.tables: list[list[int]] = [[] for _ in range(batch)]
        self.refs = [0] * num_blocks
        self.free = list(range(num_blocks - 1, RESERVED_BLOCKS - 1, -1))  # a stack: pop() takes block 2 first
        self.pending = [0] * batch  # blocks each row's reservation may still take
        self.shared = [0] * batch  # tokens at the start of each row that live in blocks shared with a sibling
        self.unassigned = 0  # reserved by `try_reserve`, not yet given to a row by `assign`

    def _attention_layer(self, shape: LayerShape | None, batch: int, dtype: torch.dtype, device: torch.device):
        if shape is None:
            return super()._attention_layer(shape, batch, dtype, device)
        return PagedLayer(self.slot, shape, self.num_blocks, self.block_size, dtype, device, self.space)

    @property
    def paged_layers(self) -> list[PagedLayer]:
        return [layer for layer in self.layers if isinstance(layer, PagedLayer)]

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(layer.nbytes for layer in self.paged_layers)

    @property
    def released(self) -> bool:
        return super().released or any(layer.keys is None for layer in self.paged_layers)

    def release(self) -> None:
        super().release()
        for layer in self.paged_layers:
            layer.release()
        for row in range(len(self.tables)):
            self._drop_blocks(row)
        self.unassigned = 0

    def allocate(self) -> None:
        super().allocate()
        for layer in self.paged_layers:
            layer.allocate()

    # ------------------------------------------------------------------ admission

    def blocks_for(self, tokens: int) -> int:
        return -(-min(tokens, self.length) // self.block_size)

    @property
    def capacity_blocks(self) -> int:
        """Blocks rows can hold: all but the reserved ones."""
        return self.num_blocks - RESERVED_BLOCKS

    def check_fits(self, tokens: list[int]) -> None:
        """Raise `ValueError` if a request of `tokens[i]` tokens could never be admitted (the pool is too small)."""
        need = max((self.blocks_for(t) for t in tokens), default=0)
        if need > self.capacity_blocks:
            raise ValueError(f"a request needs {need} KV blocks of {self.block_size} tokens; the paged cache holds "
                             f"{self.capacity_blocks} (EngineConfig.memory_budget): raise it or lower the budgets")

    def try_reserve(self, tokens: int) -> bool:
        """Reserve the blocks a request of up to `tokens` tokens can take, if they are free (beyond what
        earlier reservations may still take); `assign` then gives them to its row."""
        need = self.blocks_for(tokens)
        if need > len(self.free) - sum(self.pending) - self.unassigned:
            return False
        self.unassigned += need
        return True

    def assign(self, row: int, tokens: int) -> None:
        """Row `row` takes a reservation made by `try_reserve(tokens)`."""
        need = self.blocks_for(tokens)
        self.unassigned = max(self.unassigned - need, 0)
        self.pending[row] = need

    def shareable_blocks(self, prompt_len: int) -> int:
        """The full blocks of a prompt's cached tokens (all but its last): what a sibling can share."""
        return (prompt_len - 1) // self.block_size

    def share_prefix(self, row: int, holder: int, num_blocks: int) -> int:
        """Row `row` (empty) starts with the first `num_blocks` full blocks of row `holder` (read-only); returns
        the tokens they hold."""
        blocks = self.tables[holder][:num_blocks]
        for block in blocks:
            self.refs[block] += 1
        self.tables[row] = list(blocks)
        self.shared[row] = len(blocks) * self.block_size
        self.pending[row] = max(self.pending[row] - len(blocks), 0)
        self.block_table[row, : len(blocks)] = self.block_table[holder, : len(blocks)]
        return self.shared[row]

    # ------------------------------------------------------------------ rows come and go

    def _drop_blocks(self, row: int) -> None:
        for block in self.tables[row]:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        self.tables[row] = []
        self.pending[row] = 0
        self.shared[row] = 0

    def release_rows(self, rows: list[int]) -> None:
        """Finished rows give their blocks (and what is left of their reservation) back."""
        for row in rows:
            self._drop_blocks(row)
            self.block_table[row] = NULL_BLOCK

    def reset_rows(self, rows: Rows) -> None:
        """Empty `rows` for new requests: their blocks go back (`assign` then gives them a reservation)."""
        super().reset_rows(rows)
        for row in host_ids(rows, len(self.tables)):
            self._drop_blocks(row)
        self.block_table[device_index(rows)] = NULL_BLOCK

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self._drop_blocks(dst)
        self.tables[dst], self.tables[src] = self.tables[src], []
        self.pending[dst], self.pending[src] = self.pending[src], 0
        self.shared[dst], self.shared[src] = self.shared[src], 0
        self.block_table[dst] = self.block_table[src]
        self.block_table[src] = NULL_BLOCK

    def compact(self, rows: slice, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`RaggedKVCache.compact` in the pools: positions → pool slots through the block table (the tree's slots
        lie in blocks the row took for this step's forward, past any shared prefix)."""
        super().compact(rows, src, dst)
        table = self.block_table[rows]  # [n, max_blocks]
        size = self.block_size
        src_slots, dst_slots = ((table.gather(1, pos // size) * size + pos % size).reshape(-1) for pos in (src, dst))
        for layer in self.paged_layers:
            for pool in (layer.keys, layer.values):  # [H, slots, D]
                pool.index_copy_(1, dst_slots, pool.index_select(1, src_slots))

    # ------------------------------------------------------------------ a forward

    def _reserve_writes(self, ids, host_start: list[int], host_count: list[int]) -> None:
        """Give every row the blocks its real tokens of this forward land in (one host→device copy if any)."""
        rows, cols, blocks = [], [], []
        for row, start, count in zip(ids, host_start, host_count):
            if count and start < self.shared[row]:
                raise RuntimeError(f"row {row} would write at position {start}, inside the {self.shared[row]} tokens "
                                   "it shares with a sibling (read-only)")
            table = self.tables[row]
            need = -(-(start + count) // self.block_size)
            while len(table) < need:
                if not self.free:
                    raise RuntimeError(f"the paged KV pool is exhausted ({self.capacity_blocks} blocks of "
                                       f"{self.block_size} tokens): admit rows through try_reserve")
                block = self.free.pop()
                self.refs[block] = 1
                rows.append(row)
                cols.append(len(table))
                blocks.append(block)
                table.append(block)
                self.pending[row] = max(self.pending[row] - 1, 0)
        if blocks:
            packed = torch.tensor(rows + cols + blocks, dtype=torch.long, device=self.lens.device)  # [3k]
            k = len(blocks)
            self.block_table[packed[:k], packed[k : 2 * k]] = packed[2 * k :]
            for layer in self.paged_layers:
                layer.zero_blocks(packed[2 * k :])

    def _finish_plan(self, plan: WritePlan) -> None:
        """Pool slots of the plan's writes [n, Q] (padding: the pad block) and the blocks its reads span [n, nb]."""
        size = self.block_size
        table = self.block_table[plan.row_ids]  # [n, max_blocks]
        positions = plan.positions  # [n, Q], clamped below the cache length
        write = table.gather(1, positions // size) * size + positions % size  # [n, Q]
        padding = torch.arange(positions.shape[1], device=positions.device)[None, :] >= plan.count[:, None]
        plan.write_slots = write.masked_fill(padding, PAD_BLOCK * size)
        plan.read_blocks = table[:, : -(-plan.kv_len // size)].contiguous()  # [n, nb]
