"""Mamba and Falcon-Mamba mixers over the ragged cache: per-row conv window and selective-scan state.

The selective SSM of Mamba (Gu & Dao, 2023), per row and token t, on the conv output x_t [I]:
`h ← exp(Δ_t A) h + Δ_t B_t x_t` (h [I, S], A = −exp(A_log)), `y_t = h C_t + D x_t`, gated by
silu(z_t); Δ_t = softplus(dt_proj(x_proj(x_t)) + bias). HF's mixer scans a whole forward and keeps
the state after its last token only, padding included; this forward scans from each row's state at
its `start` and snapshots h after every real token (`linear_state.RaggedStateLayer`), so rollback
to any kept length is exact. Falcon-Mamba is the same mixer with weightless RMS norms on Δ, B and C
before the scan. `models.mixers.install_ragged_mixers` makes the modules run it with the ragged cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bamba.modeling_bamba import BambaMixer
from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer
from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer
from transformers.models.mamba.modeling_mamba import MambaMixer
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

from .linear_state import RaggedStateLayer, causal_conv


def ragged_forward(module: nn.Module, hidden: torch.Tensor, layer: RaggedStateLayer) -> torch.Tensor:
    """The mixer's output [n, Q, H] for the planned rows; reads and writes `layer`'s per-row state."""
    x, gate = module.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # [n, I, Q] each
    x = causal_conv(layer, module.conv1d, x, module.activation)  # [n, I, Q]
    step, B, C = torch.split(module.x_proj(x.transpose(1, 2)),
                             [module.time_step_rank, module.ssm_state_size, module.ssm_state_size], dim=-1)
    if isinstance(module, FalconMambaMixer):
        step, B, C = module.dt_layernorm(step), module.b_layernorm(B), module.c_layernorm(C)
    dt = module.dt_proj.weight @ step.transpose(1, 2)  # [n, I, Q]
    if module.dt_proj.bias is not None:
        dt = dt + module.dt_proj.bias.float()[:, None]
    dt = F.softplus(dt)
    A = -torch.exp(module.A_log.float())  # [I, S]
    state = layer.initial_state().float()  # [n, I, S]
    ys = []
    for i in range(x.shape[2]):
        state = torch.exp(A * dt[:, :, i, None]) * state + dt[:, :, i, None] * B[:, i, None, :].float() * \
            x[:, :, i, None].float()
        ys.append((state.to(x.dtype) @ C[:, i, :, None]).squeeze(-1))  # [n, I]
        layer.write_state(i, state)
    y = (torch.stack(ys, dim=-1) + x * module.D.float()[None, :, None]) * F.silu(gate)  # [n, I, Q]
    return module.out_proj(y.transpose(1, 2).to(hidden.dtype))


def ragged_forward_mamba2(module: nn.Module, hidden: torch.Tensor, layer: RaggedStateLayer) -> torch.Tensor:
    """A Mamba-2 mixer's output [n, Q, H] for the planned rows (per-head scalar decay, grouped B/C);
    reads and writes `layer`'s per-row state h [heads, head_dim, S]. Falcon-H1's adds µP multipliers
    on its input and projections, and may skip the gated norm."""
    n, query_len = hidden.shape[:2]
    falcon_h1 = isinstance(module, FalconH1Mixer)
    if falcon_h1:
        projected = module.in_proj(hidden * module.ssm_in_multiplier) * module.mup_vector  # [n, Q, 2I + 2GS + heads]
    else:
        projected = module.in_proj(hidden)
    gate, xbc, dt = projected.split([module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)
    xbc = causal_conv(layer, module.conv1d, xbc.transpose(1, 2), module.activation).transpose(1, 2)  # [n, Q, C]
    groups_state = module.n_groups * module.ssm_state_size
    x, B, C = torch.split(xbc, [module.intermediate_size, groups_state, groups_state], dim=-1)
    x = x.reshape(n, query_len, module.num_heads, module.head_dim).float()  # [n, Q, heads, P]
    per_group = module.num_heads // module.n_groups
    B, C = (t.reshape(n, query_len, module.n_groups, -1).float().repeat_interleave(per_group, dim=2)
            for t in (B, C))  # [n, Q, heads, S]
    dt = F.softplus(dt + module.dt_bias).clamp(*module.time_step_limit).float()  # [n, Q, heads]
    A = -torch.exp(module.A_log.float())  # [heads]
    state = layer.initial_state().float()  # [n, heads, P, S]
    ys = []
    for i in range(query_len):
        decay = torch.exp(dt[:, i] * A)[..., None, None]  # [n, heads, 1, 1]
        state = decay * state + (dt[:, i, :, None] * x[:, i])[..., None] * B[:, i, :, None, :]
        ys.append((state * C[:, i, :, None, :]).sum(-1))  # [n, heads, P]
        layer.write_state(i, state)
    y = torch.stack(ys, dim=1) + module.D.float()[:, None] * x  # [n, Q, heads, P]
    y = y.reshape(n, query_len, -1)
    y = y * F.silu(gate) if falcon_h1 and not module.mamba_rms_norm else module.norm(y, gate)
    return module.out_proj(y.to(hidden.dtype))


RAGGED_FORWARDS = {
    MambaMixer: ragged_forward, FalconMambaMixer: ragged_forward,
    Mamba2Mixer: ragged_forward_mamba2, BambaMixer: ragged_forward_mamba2,
    GraniteMoeHybridMambaLayer: ragged_forward_mamba2, NemotronHMamba2Mixer: ragged_forward_mamba2,
    FalconH1Mixer: ragged_forward_mamba2,
}
