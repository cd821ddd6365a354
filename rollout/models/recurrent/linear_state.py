"""Per-row conv and recurrent state of a recurrent layer (Gated DeltaNet, Mamba, Mamba-2), kept per length.

A linear-attention or SSM layer folds every token it is fed into one state per row: a short causal
conv over its last `K - 1` inputs, and a recurrent state (Gated DeltaNet's matrix `S` [H_v, D_k, D_v],
an SSM's `h`). The engine feeds ragged right-padded rows and then keeps a different prefix of each
row (`ModelRunner.rollback`), so the state it needs is each row's *at its own kept length*. This
layer therefore keeps both as rings indexed by length, the way `RaggedLayer` keeps K/V by slot: the
conv input of position `p` lives in conv slot `p mod W`, the recurrent state after `l` tokens in
state slot `l mod R`. A forward reads the state at each row's `start` and writes a snapshot after
every real token it feeds; rolling back is setting `lens`, as for K/V — nothing is copied or
recomputed. The mixers' ragged forwards (`models.mixers`) are the only readers and writers.

`R` (`history`) bounds how far a row can be rolled back: to any of the last `R` lengths it was fed
(the engine needs γ + 1: a verification keeps 1 to γ + 1 of the γ + 1 tokens it fed; the drafter
rolls back over its γ − 1 draft feeds). The conv ring holds `W = R + K - 1` positions, enough for
the window of any of those lengths. Padding (a row's tokens past its `count`) and real tokens older
than the last `R` of a long prefill are written to one spare slot per ring that is never read, so
neither can overwrite a state a row may still need; the state at length 0 (and conv inputs before
position 0) read as zeros. `RaggedKVCache.set_lens` flags a rollback further than `R` and the next
forward raises, so an overrun can never give silently wrong tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import CacheLayerMixin


@dataclass(frozen=True)
class StateShape:
    """What one recurrent layer keeps per row: conv channels and kernel, recurrent state dims."""

    conv_dim: int
    conv_kernel: int
    state: tuple[int, ...]  # [H_v, D_k, D_v] Gated DeltaNet, [I, S] Mamba, [heads, head_dim, S] Mamba-2
    state_dtype: torch.dtype  # HF keeps the recurrent state in fp32 whatever the model dtype


class RaggedStateLayer(CacheLayerMixin):
    """One recurrent layer's conv-input and recurrent-state rings (see the module docstring).

    The layer's ragged forward (`causal_conv`, then its scan) calls `conv_window` and `initial_state`
    to read each row's state at its `start`, then `write_conv_inputs` and `write_state` (once per fed
    token).
    """

    is_compileable = False

    def __init__(self, slot, shape: StateShape, batch: int, history: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.slot = slot  # the cache's `PlanSlot`: the plan of the forward in flight
        self.shape, self.batch, self.dtype, self.device = shape, batch, dtype, device
        self.history = history
        self.window = shape.conv_kernel - 1
        self.conv_slots = history + self.window
        self.conv: torch.Tensor | None = None
        self.states: torch.Tensor | None = None
        self.allocate()
        self.is_initialized = True

    def allocate(self) -> None:
        """Make the rings (zeroed) if `release` freed them; the last slot of each ring is the spare one (never read)."""
        if self.conv is not None:
            return
        self.conv = torch.zeros(self.batch, self.conv_slots + 1, self.shape.conv_dim, dtype=self.dtype,
                                device=self.device)
        self.states = torch.zeros(self.batch, self.history + 1, *self.shape.state, dtype=self.shape.state_dtype,
                                  device=self.device)

    def release(self) -> None:
        self.conv = self.states = None

    @property
    def nbytes(self) -> int:
        conv = (self.conv_slots + 1) * self.shape.conv_dim * self.dtype.itemsize
        state = (self.history + 1) * math.prod(self.shape.state) * self.shape.state_dtype.itemsize
        return self.batch * (conv + state)

    def lazy_initialization(self, *args, **kwargs) -> None:
        raise RuntimeError("RaggedStateLayer buffers are preallocated")

    def update(self, *args, **kwargs):
        raise RuntimeError("a linear-attention layer has no K/V; its ragged forward reads and writes its state")

    def conv_window(self) -> torch.Tensor:
        """[n, C, K-1]: each planned row's conv inputs at positions start-K+1 .. start-1 (zeros before 0)."""
        plan = self.slot.plan
        positions = plan.start[:, None] + torch.arange(-self.window, 0, device=plan.start.device)  # [n, K-1]
        window = self.conv[plan.row_ids[:, None], positions % self.conv_slots]  # [n, K-1, C]
        return window.masked_fill((positions < 0)[..., None], 0).transpose(1, 2)

    def write_conv_inputs(self, inputs: torch.Tensor) -> None:
        """Store `inputs` [n, C, Q] (position start + q) for each row's last W real positions."""
        plan = self.slot.plan
        self.conv[plan.row_ids[:, None], plan.ring_slots(self.conv_slots)] = inputs.transpose(1, 2).to(self.conv.dtype)

    def initial_state(self) -> torch.Tensor:
        """[n, *state]: each planned row's recurrent state after its first `start` tokens."""
        plan = self.slot.plan
        state = self.states[plan.row_ids, plan.start % self.history]  # [n, *state]
        return state.masked_fill((plan.start == 0).view(-1, *[1] * (state.dim() - 1)), 0)

    def write_state(self, step: int, state: torch.Tensor) -> None:
        """Snapshot `state` [n, *state], each row's state after its fed token `step`."""
        plan = self.slot.plan
        if step >= plan.first_snapshot:
            slots = plan.ring_slots(self.history, offset=1)[:, step]  # [n]
            self.states[plan.row_ids, slots] = state.to(self.states.dtype)

    def reset_rows(self, rows: torch.Tensor) -> None:
        self.conv[rows] = 0
        self.states[rows] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.conv[dst] = self.conv[src]
        self.states[dst] = self.states[src]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slot.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.slot.plan.kv_len if self.slot.plan is not None else 0

    def get_max_length(self) -> int:
        return -1


def causal_conv(layer: RaggedStateLayer, conv: nn.Conv1d, new: torch.Tensor, activation: str) -> torch.Tensor:
    """The depthwise causal conv `conv` (then `activation`) of `new` [n, C, Q] over each planned row's
    own last K-1 inputs; returns [n, C, Q] and stores `new` as the rows' conv inputs."""
    window = layer.conv_window()  # [n, C, K-1]
    layer.write_conv_inputs(new)
    full = torch.cat([window.to(new.dtype), new], dim=-1).to(conv.weight.dtype)  # [n, C, K-1+Q]
    out = F.conv1d(full, conv.weight, conv.bias, groups=conv.weight.shape[0])  # [n, C, Q]
    return ACT2FN[activation](out).to(new.dtype)
