"""Ragged KV cache: one preallocated `[B_max, H_kv, L_max, D]` buffer per layer and a length per row.

Each layer's buffers are shaped after what that layer writes, not after the config: `probe_layer_shapes`
runs the model once on one token through HF's own `DynamicCache` and reads each layer's K and V
shapes. Configs do not say it reliably — Falcon's multi-query attention writes 1 K/V head where
`num_key_value_heads` says more, MLA (DeepSeek-V2/V3) writes K and V of different head dims, Gemma 4
gives full and sliding layers different head dims and K/V heads. A layer that writes nothing in the
probe (a KV-sharing layer reading another layer's K/V) gets no buffers. A recurrent layer (Gated
DeltaNet, Mamba) gets per-row state rings instead (`recurrent.linear_state.RaggedStateLayer`, `StateShape`), a
layer with attention and a recurrent mixer side by side (Falcon-H1) both (`HybridShape`); the
probe reads their shapes from HF's conv and recurrent states.

A forward over rows `rows` with Q new tokens per row writes K/V of query q of row b at slot
`start[b] + q` and attends over slots `[0, max(start) + Q)`; the 4D mask built by the runner hides
each row's stale or padded slots. Rolling back rejected drafts is setting `lens` — nothing is copied
or cropped. Live rows are kept packed in slots `[0, n)` by the engine, so a decode forward reads a
view of the buffers, never a gather.

Masked slots still enter attention's arithmetic (weight 0 × value, or value + finfo.min for an
additive mask), so one non-finite value left in a slot a forward reads poisons the whole row. Each
row therefore keeps a bound on how far it has written (`written`, a host tensor: it costs the hot
path one small CPU op per forward); every slot at or past it is zero. `reset_rows` zeroes that
much when a new request takes a slot, and `move_row` copies as far as either row has written, so
nothing a previous request (or a previous drafter's weights) wrote reaches a later one.

The host keeps what it needs to plan a forward without asking the device: `host_lens` mirrors `lens`
(every write of `lens` comes with its host values, which the engine knows from its one copy per step),
`written` and the linear-attention bookkeeping live on the host only. A forward costs no device→host copy.

This is a `transformers.cache_utils.Cache` subclass: HF attention layers call `update` per layer,
which is all the engine needs. HF's own Dynamic/Static caches keep one offset for the whole batch,
which is why HF assisted generation refuses batch size > 1.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .plan import PlannedLayer, PlanSlot, WritePlan
from .recurrent.linear_state import RaggedStateLayer, StateShape
from .rows import Rows, device_index, host_ids
from .shapes import HybridShape, LayerShape, probe_layer_shapes

__all__ = ["STATE_HISTORY", "HybridShape", "LayerShape", "PlanSlot", "RaggedKVCache", "RaggedLayer", "StateShape",
           "WritePlan", "probe_layer_shapes"]

# Lengths of each row whose linear-attention state is kept (how far a row can be rolled back): the
# engine needs max_gamma + 1, and EngineConfig's default max_gamma is 8.
STATE_HISTORY = 16


class RaggedLayer(PlannedLayer):
    """One attention layer's K/V buffers (`shape` None: a layer that writes none); `update` follows the plan
    its parent cache set. `release` frees the buffers, `allocate` makes them again (zeroed)."""

    def __init__(self, slot: PlanSlot, shape: LayerShape | None, batch: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.slot = slot
        self.shape, self.batch, self.dtype, self.device = shape, batch, dtype, device
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.allocate()
        self.is_initialized = True

    def allocate(self) -> None:
        if self.shape is None or self.keys is not None:
            return
        # Zero-init, and zero again on reset: masked slots get 0 attention weight, and 0 × NaN is NaN.
        size = (self.batch, self.shape.num_heads, self.slot.length)
        self.keys = torch.zeros(*size, self.shape.key_dim, dtype=self.dtype, device=self.device)
        self.values = torch.zeros(*size, self.shape.value_dim, dtype=self.dtype, device=self.device)

    def release(self) -> None:
        self.keys = self.values = None

    @property
    def nbytes(self) -> int:
        """Bytes its buffers take when allocated."""
        if self.shape is None:
            return 0
        per_slot = (self.shape.key_dim + self.shape.value_dim) * self.shape.num_heads
        return self.batch * self.slot.length * per_slot * self.dtype.itemsize

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        plan = self.slot.plan
        if plan is None:
            raise RuntimeError("RaggedKVCache.plan_write must be called before each forward")
        if self.keys is None:
            raise RuntimeError("this layer has no K/V buffers: it wrote none when its shapes were probed, or "
                               "its cache was released (RaggedKVCache.release)")
        rows = plan.rows
        if isinstance(rows, slice) and plan.same_start is not None:
            span = slice(plan.same_start, plan.same_start + key_states.shape[2])
            self.keys[rows, :, span] = key_states
            self.values[rows, :, span] = value_states
        elif isinstance(rows, slice):
            # Live prefix: scatter in place into views of the buffers (cheaper than index_put).
            self.keys[rows].scatter_(2, plan.scatter_index(key_states.shape), key_states.to(self.keys.dtype))
            self.values[rows].scatter_(2, plan.scatter_index(value_states.shape), value_states.to(self.values.dtype))
        else:
            # Advanced indices around a slice put the indexed dims first: [n, Q, H, D].
            self.keys[rows[:, None], :, plan.positions] = key_states.transpose(1, 2).to(self.keys.dtype)
            self.values[rows[:, None], :, plan.positions] = value_states.transpose(1, 2).to(self.values.dtype)
        return self.keys[rows, :, : plan.kv_len], self.values[rows, :, : plan.kv_len]


class RaggedKVCache(Cache):
    """K/V (and linear-attention state) of up to `batch` rows of up to `length` tokens each, for one model.

    `lens[b]` is how many tokens of row b the cache holds. The runner calls `plan_write` before
    each forward and `set_lens` after it (and to roll back: `ModelRunner.rollback`); `lens` is
    written nowhere else but here (`reset_rows`, `move_row`). Linear-attention layers
    (`recurrent.linear_state.RaggedStateLayer`) keep each row's state at its last `history` lengths, so a
    row can be rolled back at most that far; further raises at the next forward.
    """

    def __init__(self, shapes: list[LayerShape | StateShape | HybridShape | None], batch: int, length: int,
                 dtype: torch.dtype, device: torch.device, history: int = STATE_HISTORY):
        self.slot = PlanSlot(length)
        # A linear-attention layer is its state; a hybrid layer's state sits beside its K/V.
        self.states_by_layer = {
            index: RaggedStateLayer(self.slot, shape.state if isinstance(shape, HybridShape) else shape, batch,
                                    history, dtype, device)
            for index, shape in enumerate(shapes) if isinstance(shape, StateShape | HybridShape)
        }
        super().__init__(layers=[
            self.states_by_layer[index] if isinstance(shape, StateShape)
            else self._attention_layer(shape.attention if isinstance(shape, HybridShape) else shape, batch, dtype,
                                       device)
            for index, shape in enumerate(shapes)
        ])
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)
        self.host_lens = [0] * batch  # `lens` on the host, kept in step by every write of it
        # Per row, a bound on the slots written since the row was last reset; slots past it are zero (host).
        self.written = torch.zeros(batch, dtype=torch.long)
        self.length = length
        self.history = history
        self.state_layers = list(self.states_by_layer.values())
        # Linear-attention rows (host): the furthest length fed since reset, and whether a rollback went
        # further back than the state history holds (raised at the next forward).
        self.reach = [0] * batch
        self.overrun = False

    def _attention_layer(self, shape: LayerShape | None, batch: int, dtype: torch.dtype,
                         device: torch.device) -> CacheLayerMixin:
        return RaggedLayer(self.slot, shape, batch, dtype, device)

    @property
    def plan(self) -> WritePlan | None:
        return self.slot.plan

    @plan.setter
    def plan(self, plan: WritePlan | None) -> None:
        self.slot.plan = plan

    @property
    def buffered_layers(self) -> list[RaggedLayer]:
        return [layer for layer in self.layers if isinstance(layer, RaggedLayer) and layer.shape is not None]

    @property
    def nbytes(self) -> int:
        """Bytes of its K/V and recurrent-state buffers when allocated."""
        return sum(layer.nbytes for layer in self.buffered_layers) + sum(layer.nbytes for layer in self.state_layers)

    @property
    def released(self) -> bool:
        return any(layer.keys is None for layer in self.buffered_layers) or any(
            layer.conv is None for layer in self.state_layers)

    def release(self) -> None:
        """Free every K/V and state buffer (between rollout phases); every row is then empty. `allocate`
        makes them again."""
        for layer in [*self.buffered_layers, *self.state_layers]:
            layer.release()
        self.lens.zero_()
        self.written.zero_()
        self.host_lens[:] = [0] * len(self.host_lens)
        self.reach[:] = [0] * len(self.reach)
        self.overrun = False

    def allocate(self) -> None:
        """Make the buffers `release` freed, zeroed (a no-op where they exist)."""
        for layer in [*self.buffered_layers, *self.state_layers]:
            layer.allocate()

    def plan_write(self, rows: Rows, start: torch.Tensor, query_len: int, count: torch.Tensor | None = None,
                   host_start: list[int] | None = None, host_count: list[int] | None = None) -> torch.Tensor:
        """Set where the next forward writes; returns `position_ids` [n, Q] (= start + arange(Q)).

        `count` [n] (default: all Q) is how many of the Q tokens of each row are real; the rest are
        right padding, which linear-attention layers keep out of the row's state. Slots past the
        buffer (only ever padding of a ragged call) are clamped onto the last slot, which never
        holds a valid token. `host_start` / `host_count` are the same numbers as host lists: the
        host's bookkeeping (how far attention reads, where rows were written) comes from them, so a
        forward reads nothing back from the device; a caller without them pays one copy.
        """
        ids = range(self.lens.shape[0])[rows] if isinstance(rows, slice) else host_ids(rows, self.lens.shape[0])
        host_start = start.tolist() if host_start is None else host_start
        if count is None:
            count, host_count = torch.full_like(start, query_len), [query_len] * len(host_start)
        elif host_count is None:
            host_count = count.tolist()
        positions = start[:, None] + torch.arange(query_len, device=start.device)  # [n, Q]
        lo, hi = min(host_start), max(host_start)
        first_snapshot = 0
        if self.state_layers:
            if self.overrun:
                raise RuntimeError(f"a row was rolled back more than the {self.history} lengths its linear-attention "
                                   "state history holds (RaggedKVCache history): its state is lost")
            first_snapshot = max(min(host_count) - self.history, 0)
            for b, s, c in zip(ids, host_start, host_count):
                self.reach[b] = max(self.reach[b], s + c)
        self._reserve_writes(ids, host_start, host_count)
        kv_len = min(hi + query_len, self.length)
        same = lo if lo == hi and hi + query_len <= self.length else None
        # Every write of this forward lands below kv_len (clamped padding lands on slot length - 1).
        index = device_index(rows)
        if isinstance(index, slice):
            self.written[index].clamp_min_(kv_len)
        else:
            self.written[list(ids)] = self.written[list(ids)].clamp_min(kv_len)
        row_ids = torch.arange(self.lens.shape[0], device=start.device)[index]
        self.plan = WritePlan(rows=index, row_ids=row_ids, start=start, count=count,
                              positions=positions.clamp_max(self.length - 1), kv_len=kv_len, same_start=same,
                              first_snapshot=first_snapshot)
        self._finish_plan(self.plan)
        return positions

    def _reserve_writes(self, ids, host_start: list[int], host_count: list[int]) -> None:
        """Before a forward's writes (a paged cache takes blocks for them here)."""

    def _finish_plan(self, plan: WritePlan) -> None:
        """After a forward's plan is made (a paged cache adds its pool slots here)."""

    def compact(self, rows: slice, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move each row's K/V at slots `src` [n, k] to slots `dst` [n, k] (a verified tree's kept path into the
        slots a chain would have written: `step.tree`). Every `src` slot was written by the forward just run, and
        `dst` ≤ `src` slot by slot, so the moved slots stay below `written`. Recurrent state has no tree forward
        (`tree_mask.check_tree`): only attention K/V move."""
        for layer in self.buffered_layers:
            for buf in (layer.keys, layer.values):
                view = buf[rows]  # [n, H, L, D], a view of the live prefix
                index = src[:, None, :, None].expand(-1, view.shape[1], -1, view.shape[3])  # [n, H, k, D]
                view.scatter_(2, dst[:, None, :, None].expand_as(index), view.gather(2, index))

    # ------------------------------------------------------------------ admission: a dense cache has room for every row

    def check_fits(self, tokens: list[int]) -> None:
        """Every request fits a dense cache (its slots are `max_seq_len` long); a paged cache checks its pool."""

    def try_reserve(self, tokens: int) -> bool:
        """Whether a request of up to `tokens` tokens can start now: in a dense cache always (its slot is its
        memory); a paged cache reserves blocks."""
        return True

    def assign(self, row: int, tokens: int) -> None:
        """Row `row` takes what `try_reserve(tokens)` reserved: nothing, in a dense cache."""

    def shareable_blocks(self, prompt_len: int) -> int:
        """How many blocks of a prompt's cached tokens (all but its last) a row can take from a row holding the
        same prompt (`share_prefix`): none in a dense cache, where each row's slots are its own."""
        return 0

    def share_prefix(self, row: int, holder: int, num_blocks: int) -> int:
        """Row `row` starts with `holder`'s first `num_blocks` blocks; returns the tokens they hold. A dense cache
        has no blocks to share (`shareable_blocks` is 0), so it is never asked."""
        raise ValueError(f"share_prefix({row}, {holder}, {num_blocks}) on a dense cache: it shares no blocks")

    def release_rows(self, rows: list[int]) -> None:
        """Finished rows: their slots' memory is the dense buffers', nothing to give back (a paged cache's is)."""

    def set_lens(self, rows: Rows, lens: torch.Tensor, host_lens: list[int] | None = None) -> None:
        """Rows `rows` hold their first `lens` [n] tokens (slots past them are stale, never read);
        `host_lens` the same on the host (None: copied from `lens`)."""
        host_lens = lens.tolist() if host_lens is None else host_lens
        self.lens[device_index(rows)] = lens
        if isinstance(rows, slice):
            self.host_lens[rows] = host_lens
            ids = range(len(self.host_lens))[rows]
        else:
            ids = host_ids(rows, self.lens.shape[0])
            for b, length in zip(ids, host_lens):
                self.host_lens[b] = length
        if self.state_layers:
            for b, length in zip(ids, host_lens):
                # Length 0 is always exact (a zero state): the row starts over, as after `reset_rows`.
                self.overrun |= self.reach[b] - length >= self.history and length > 0
                self.reach[b] = 0 if length == 0 else self.reach[b]

    def reset_rows(self, rows: Rows) -> None:
        """Empty `rows` [k] for new requests: length 0, and every slot they have written zeroed."""
        ids = host_ids(rows, self.lens.shape[0])
        index = device_index(rows)
        reach = max(self.written_bound(ids), 0)
        if reach:
            for layer in self.buffered_layers:
                layer.keys[index, :, :reach] = 0
                layer.values[index, :, :reach] = 0
        for layer in self.state_layers:
            layer.reset_rows(index)
        self.written[ids] = 0
        self.lens[index] = 0
        for b in ids:
            self.reach[b] = self.host_lens[b] = 0

    def written_bound(self, ids: list[int]) -> int:
        """How far any of rows `ids` has written since it was last reset (slots past it are zero)."""
        return max(self.written[ids].tolist(), default=0)

    def move_row(self, src: int, dst: int) -> None:
        """Copy row `src`'s K/V, state and length into slot `dst` (used to keep live rows packed).

        Copies as far as either row has written, so `dst` keeps none of its previous request's slots.
        """
        reach = self.written_bound([src, dst])
        for layer in self.buffered_layers:
            layer.keys[dst, :, :reach] = layer.keys[src, :, :reach]
            layer.values[dst, :, :reach] = layer.values[src, :, :reach]
        for layer in self.state_layers:
            layer.move_row(src, dst)
        self.lens[dst] = self.lens[src]
        self.host_lens[dst], self.reach[dst] = self.host_lens[src], self.reach[src]
        self.written[dst] = self.written[src]
