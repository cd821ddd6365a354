"""Gated DeltaNet (Qwen3-Next, Qwen3.5) over the ragged cache: per-row conv window and recurrent state.

HF's layer keeps one conv state and one recurrent state per row and returns only the state after
the *last* fed token, padding included, so a right-padded ragged forward leaves padded rows with a
wrong state and a verification forward leaves no state at the accepted lengths. `RAGGED_FORWARDS`
gives each Gated DeltaNet module class the forward that `models.mixers.install_ragged_mixers` makes it run
with the ragged cache. It computes what HF's layer computes, on the same weights, per row:

- the causal conv over the row's own last `K - 1` inputs (`RaggedStateLayer.conv_window`) followed
  by the new ones, so each row's window comes from its own real tokens;
- the gated delta rule (Yang et al., "Gated Delta Networks", 2024) token by token from the row's
  state at its `start`: `S ← exp(g) S`, `S ← S + k ⊗ β (v − Sᵀk)`, `o = Sᵀq` (q, k L2-normed,
  q scaled by 1/√d_k, as in HF), snapshotting `S` after every real token so a rollback can pick
  any kept length. HF's prefill uses the chunked form of the same rule; the token-by-token form
  gives every intermediate state, which the chunked form does not.

Padding never reaches a row's state: its snapshots go to the ring's spare slot and its conv inputs
are not stored (`WritePlan.ring_slots`). The two model families differ only in how they project the
hidden states into q/k/v, the output gate z and the decay/learning-rate inputs a, b (`_project_*`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from .linear_state import RaggedStateLayer, causal_conv


@dataclass
class MixerInputs:
    """A Gated DeltaNet layer's projections of its input hidden states [n, Q, H]."""

    qkv: torch.Tensor  # [n, Q, 2·key_dim + value_dim] conv input: q, k, v concatenated
    z: torch.Tensor  # [n, Q, H_v, D_v] output gate
    b: torch.Tensor  # [n, Q, H_v] learning rate β = sigmoid(b)
    a: torch.Tensor  # [n, Q, H_v] decay input


def _project_qwen3_next(module: nn.Module, hidden: torch.Tensor) -> MixerInputs:
    query, key, value, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden),
                                                                     module.in_proj_ba(hidden))
    qkv = torch.cat([x.reshape(*hidden.shape[:2], -1) for x in (query, key, value)], dim=-1)
    return MixerInputs(qkv, z, b, a)


def _project_qwen3_5(module: nn.Module, hidden: torch.Tensor) -> MixerInputs:
    z = module.in_proj_z(hidden).reshape(*hidden.shape[:2], -1, module.head_v_dim)
    return MixerInputs(module.in_proj_qkv(hidden), z, module.in_proj_b(hidden), module.in_proj_a(hidden))


def _ragged(project):
    def forward(module: nn.Module, hidden: torch.Tensor, layer: RaggedStateLayer) -> torch.Tensor:
        return ragged_forward(module, project(module, hidden), layer)
    return forward


RAGGED_FORWARDS = {
    Qwen3NextGatedDeltaNet: _ragged(_project_qwen3_next),
    Qwen3_5GatedDeltaNet: _ragged(_project_qwen3_5),
    Qwen3_5MoeGatedDeltaNet: _ragged(_project_qwen3_5),
}


def ragged_forward(module: nn.Module, inputs: MixerInputs, layer: RaggedStateLayer) -> torch.Tensor:
    """The layer's output [n, Q, H] for the planned rows; reads and writes `layer`'s per-row state."""
    n, query_len = inputs.qkv.shape[:2]
    mixed = causal_conv(layer, module.conv1d, inputs.qkv.transpose(1, 2), module.activation)  # [n, C, Q]
    mixed = mixed.transpose(1, 2)  # [n, Q, C]
    query, key, value = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    query = query.reshape(n, query_len, -1, module.head_k_dim)  # [n, Q, H_k, D_k]
    key = key.reshape(n, query_len, -1, module.head_k_dim)
    value = value.reshape(n, query_len, -1, module.head_v_dim)  # [n, Q, H_v, D_v]
    beta = inputs.b.sigmoid()  # [n, Q, H_v]
    g = -module.A_log.float().exp() * F.softplus(inputs.a.float() + module.dt_bias)  # [n, Q, H_v] log decay
    core = gated_delta_rule(query, key, value, g, beta, layer)  # [n, Q, H_v, D_v]
    core = module.norm(core.reshape(-1, module.head_v_dim), inputs.z.reshape(-1, module.head_v_dim))
    return module.out_proj(core.reshape(n, query_len, -1))


def gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, layer: RaggedStateLayer) -> torch.Tensor:
    """Outputs [n, Q, H_v, D_v] of the gated delta rule from each row's state at its start, in fp32;
    the state after every fed token is snapshotted into `layer`."""
    out_dtype = query.dtype
    group = value.shape[2] // key.shape[2]  # each q/k head serves `group` consecutive value heads
    query, key = (x.repeat_interleave(group, dim=2) for x in (query, key))
    query, key, value, g, beta = (x.transpose(1, 2).float() for x in (query, key, value, g, beta))  # [n, H_v, Q, …]
    query = _l2norm(query) / query.shape[-1] ** 0.5
    key = _l2norm(key)
    state = layer.initial_state().float()  # [n, H_v, D_k, D_v]
    out = torch.empty_like(value)  # [n, H_v, Q, D_v]
    for i in range(value.shape[2]):
        k, q = key[:, :, i, :, None], query[:, :, i, :, None]  # [n, H_v, D_k, 1]
        state = state * g[:, :, i].exp()[..., None, None]
        delta = (value[:, :, i] - (state * k).sum(-2)) * beta[:, :, i, None]  # [n, H_v, D_v]
        state = state + k * delta[:, :, None, :]
        out[:, :, i] = (state * q).sum(-2)
        layer.write_state(i, state)
    return out.transpose(1, 2).to(out_dtype)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
